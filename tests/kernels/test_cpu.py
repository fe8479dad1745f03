"""The CPU kernels (C++ through the XLA FFI) against the pure-JAX references: every shape class
the model sends them, the layer read in place from a stack, vmap and grad, and the fallbacks."""

from __future__ import annotations

import dataclasses

import os
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import pallas_kernels
from pallas_kernels import argmax, ffi, quantize
from pallas_kernels.argmax import reference as argmax_ref
from pallas_kernels.matmul import PanelWeight, matmul
from pallas_kernels.matmul import cpu as matmul_cpu
from pallas_kernels.matmul import reference as matmul_ref
from pallas_kernels.quant_matmul import dequantize, quantized_matmul
from pallas_kernels.quant_matmul import reference as quant_ref
from pallas_kernels.rms_norm import reference as norm_ref
from pallas_kernels.rms_norm import rms_norm
from pallas_kernels.tree_attention import reference as attention_ref
from pallas_kernels.tree_attention import tree_attention

pytestmark = pytest.mark.skipif(jax.default_backend() != "cpu" or not ffi.available(),
                                reason="the CPU kernels run on a CPU with a C++ compiler")


def normal(shape, seed=0, dtype=jnp.float32):
    return jnp.asarray(np.random.default_rng(seed).standard_normal(shape, np.float32), dtype)


def close(got, want, rtol=2e-5):
    got, want = np.asarray(got, np.float32), np.asarray(want, np.float32)
    assert got.shape == want.shape
    scale = np.abs(want).max() or 1.0
    assert np.abs(got - want).max() <= rtol * scale, np.abs(got - want).max() / scale


# ---- dense matmul --------------------------------------------------------------------------------

@pytest.mark.parametrize("m", [1, 2, 5, 6, 7, 13, 64])
@pytest.mark.parametrize("k,n", [(576, 1536), (577, 131), (40, 7), (96, 1024)])
@pytest.mark.parametrize("transposed", [False, True])
def test_matmul_equals_reference(m, k, n, transposed):
    x = normal((m, k), 1)
    w = normal((3, n, k) if transposed else (3, k, n), 2)
    got = jax.jit(lambda x, w, i: matmul(x, w, index=i, transposed=transposed, impl="cpu"))(x, w, 2)
    close(got, matmul_ref.matmul(x, w, index=2, transposed=transposed))


@pytest.mark.parametrize("m", [2, 8, 13, 30])
@pytest.mark.parametrize("layout", ["kn", "panels-32", "panels-48", "panels-64", "nk"])
def test_matmul_rows_do_not_depend_on_their_neighbours(m, layout):
    # past a register block's rows (8 with blocks of 2 or 3 vectors, 6 with 4; AVX2: 6, 4, 3)
    # the kernel makes another pass over the block, and "nk" streams one column at a time for 1-2
    # rows but takes four past that: each row's products still add up in the same order as
    # alone, to the bit (panels of 32 / 48 / 64 columns: blocks of 2 / 3 / 4 AVX-512 vectors)
    w = normal((1, 576, 384), 3)
    if layout.startswith("panels"):
        w = PanelWeight.of(w, int(layout.split("-")[1]))
    elif layout == "nk":
        w = jnp.swapaxes(w, 1, 2)
    x = normal((m, 576), 4)
    run = jax.jit(lambda x: matmul(x, w, index=0, transposed=layout == "nk", impl="cpu"))
    np.testing.assert_array_equal(run(x), jnp.concatenate([run(x[i:i + 1]) for i in range(m)]))


@pytest.mark.parametrize("m", [1, 3, 6, 7, 13, 64, 200])
@pytest.mark.parametrize("k,n", [(576, 1536), (577, 192), (40, 64)])
@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16])
def test_matmul_reads_column_panels(m, k, n, dtype):
    # the same bits as the row-major weight (each output sums its products in the same order),
    # at any number of rows (prefill's too: no row limit for panels)
    x, w = normal((m, k), 1), normal((3, k, n), 2, dtype)
    panels = matmul_cpu.preferred_layout(w)
    assert isinstance(panels, PanelWeight) and panels.shape == w.shape
    np.testing.assert_array_equal(panels.untiled(), w)
    run = jax.jit(lambda x, w, i: matmul(x, w, index=i, impl="cpu"))
    got = run(x, panels, 2)
    close(got, matmul_ref.matmul(x, w, index=2))
    close(matmul_ref.matmul(x, panels, index=2), matmul_ref.matmul(x, w, index=2))
    if m <= matmul_cpu.MAX_ROWS:
        np.testing.assert_array_equal(got, run(x, w, 2))
    assert "specjax_matmul" in jax.jit(lambda x: matmul(x, panels, index=2, impl="cpu")).lower(x).as_text()
    close(matmul(x, panels.layer(1), impl="cpu"), matmul_ref.matmul(x, w[1]))


def test_only_widths_of_whole_panels_are_packed():
    # the host's kernel picks a panel of whole column blocks (48 columns with AVX-512, 32 with
    # AVX2) where it divides N, else a wider or narrower block that does, else none
    for n in (576, 128, 96, 640):
        tile = matmul_cpu.panel_tile(n)
        assert tile in (16, 24, 32, 48, 64) and n % tile == 0
        assert matmul_cpu.preferred_layout(normal((2, 8, n))).tile == tile
    assert matmul_cpu.panel_tile(200) == 0
    assert not isinstance(matmul_cpu.preferred_layout(normal((2, 8, 200))), PanelWeight)
    with pytest.raises(ValueError, match="not a multiple of the tile"):
        PanelWeight.of(normal((8, 96)), 64)


@pytest.mark.parametrize("transposed", [False, True])
def test_matmul_bfloat16_weights(transposed):
    x, w = normal((5, 200), 1), normal((96, 200) if transposed else (200, 96), 2, jnp.bfloat16)
    close(matmul(x, w, transposed=transposed, impl="cpu"), matmul_ref.matmul(x, w, transposed=transposed))


def test_matmul_picks_the_layer_of_the_stack():
    w = jnp.stack([jnp.full((8, 16), float(i)) for i in range(4)])
    out = jax.jit(lambda i: matmul(jnp.ones((1, 8)), w, index=i, impl="cpu"))(jnp.int32(3))
    assert np.all(np.asarray(out) == 24.0)


def test_matmul_past_the_kernel_rows_is_the_reference():
    x, w = normal((65, 64), 1), normal((64, 32), 2)
    lowered = jax.jit(lambda x, w: matmul(x, w, impl="cpu")).lower(x, w).as_text()
    assert "specjax_matmul" not in lowered
    assert "specjax_matmul" in jax.jit(lambda x, w: matmul(x[:64], w, impl="cpu")).lower(x, w).as_text()


def test_matmul_vmap_folds_batch_into_rows():
    x, w = normal((4, 3, 64), 1), normal((64, 48), 2)
    f = jax.vmap(lambda x: matmul(x, w, impl="cpu"))
    close(f(x), jnp.einsum("bmk,kn->bmn", x, w))
    hlo = jax.jit(f).lower(x).as_text()
    assert hlo.count("specjax_matmul") == 1 and "12x64" in hlo.replace(",", "x")  # one call, 12 rows


def test_matmul_vmap_over_the_weights_runs_the_reference():
    x, w = normal((3, 64), 1), normal((2, 64, 48), 2)
    close(jax.vmap(lambda w: matmul(x, w, impl="cpu"))(w), jnp.einsum("mk,bkn->bmn", x, w))


def test_matmul_gradient_is_the_references():
    x, w = normal((4, 32), 1), normal((32, 16), 2)
    loss = lambda impl: lambda x, w: (matmul(x, w, impl=impl) ** 2).sum()
    for got, want in zip(jax.grad(loss("cpu"), (0, 1))(x, w), jax.grad(loss("reference"), (0, 1))(x, w)):
        close(got, want)
    panels = PanelWeight.of(normal((32, 128), 2), 64)
    loss = lambda impl: lambda x, p: (matmul(x, p, impl=impl) ** 2).sum()
    got, want = jax.grad(loss("cpu"), 1)(x, panels), jax.grad(loss("reference"), 1)(x, panels)
    assert isinstance(got, PanelWeight)
    close(got.data, want.data)


def test_matmul_vmap_folds_batch_into_rows_of_panels():
    x, w = normal((4, 3, 64), 1), normal((64, 128), 2)
    f = jax.vmap(lambda x: matmul(x, PanelWeight.of(w, 64), impl="cpu"))
    close(f(x), jnp.einsum("bmk,kn->bmn", x, w))
    assert jax.jit(f).lower(x).as_text().count("specjax_matmul") == 1


# ---- quantized matmul ----------------------------------------------------------------------------

@pytest.mark.parametrize("bits,group_size", [(8, 32), (8, 64), (8, 128), (4, 32), (4, 64), (4, 128)])
@pytest.mark.parametrize("m", [1, 4, 5, 17])
def test_quantized_matmul_equals_reference(bits, group_size, m):
    k, n = 512, 200  # n not a multiple of the vector block: the tail columns too
    qw = quantize(normal((2, k, n), 3), bits, group_size)
    x = normal((m, k), 4)
    got = jax.jit(lambda x, qw: quantized_matmul(x, qw, index=1, impl="cpu"))(x, qw)
    close(got, x @ dequantize(qw)[1])


@pytest.mark.parametrize("bits,group_size", [(8, 32), (8, 128), (4, 32), (4, 64)])
@pytest.mark.parametrize("m", [1, 5, 17])
@pytest.mark.parametrize("tile", [64, 128])
def test_quantized_matmul_reads_column_panels(bits, group_size, m, tile):
    qw = quantize(normal((2, 256, 384), 3), bits, group_size)  # 6 / 3 panels over the threads
    x = normal((m, 256), 4)
    got = jax.jit(lambda x, qw: quantized_matmul(x, qw, index=1, impl="cpu"))(x, qw.tiled(tile))
    close(got, x @ dequantize(qw)[1])
    close(quantized_matmul(x, qw.tiled(tile).layer(1), impl="cpu"), got)


@pytest.mark.parametrize("bits,group_size", [(8, 64), (4, 32)])
@pytest.mark.parametrize("act_bits", [None, 8])
def test_quantized_matmul_rows_do_not_depend_on_their_neighbours(bits, group_size, act_bits):
    # a verify pass over M tokens must give each token the logits a 1-token step would: past a
    # register block's rows (another pass over the block, or a buffer) each row sums in the same
    # order, to the bit
    qw = pallas_kernels.kernel_layout(dataclasses.replace(quantize(normal((1, 256, 384), 3), bits, group_size),
                                                          act_bits=act_bits))
    x = normal((19, 256), 4)  # past 16 rows too, where the int8-activation kernel takes K whole
    run = jax.jit(lambda x: quantized_matmul(x, qw, index=0, act_bits=act_bits, impl="cpu"))
    for m in (7, 19):  # groups in turn (4 + 3 rows); blocks of 3 rows over all of K
        np.testing.assert_array_equal(run(x[:m]), jnp.concatenate([run(x[i:i + 1]) for i in range(m)]))


def test_the_kernel_layout_is_panels_where_n_allows_in_quads_for_int8_activations():
    kernel_layout = pallas_kernels.kernel_layout
    assert kernel_layout(quantize(normal((256, 384)), 8, 64)).tile == 64
    assert kernel_layout(quantize(normal((256, 200)), 8, 64)).tile == 0  # N = 200: row-major
    a8 = kernel_layout(dataclasses.replace(quantize(normal((256, 384)), 4, 64), act_bits=8))
    assert a8.tile == 64 and a8.quads
    assert not kernel_layout(dataclasses.replace(a8, act_bits=None)).quads


def test_quantized_matmul_one_weight_and_bfloat16_out():
    qw = quantize(normal((256, 64), 3), 4, 64)
    x = normal((3, 256), 4, jnp.bfloat16)
    got = quantized_matmul(x, qw, impl="cpu")
    assert got.dtype == jnp.bfloat16
    close(got, x.astype(jnp.float32) @ dequantize(qw), rtol=1e-2)


@pytest.mark.parametrize("bits,group_size", [(8, 32), (8, 64), (8, 128), (4, 32), (4, 64), (4, 128)])
@pytest.mark.parametrize("m", [1, 2, 3, 5, 17, 64])
@pytest.mark.parametrize("n,tile", [(384, 64), (200, 0)])  # panels; row-major with tail columns
def test_quantized_matmul_int8_activations_equals_reference(bits, group_size, m, n, tile):
    qw = quantize(normal((2, 512, n), 3), bits, group_size)
    x = normal((m, 512), 4) * jnp.linspace(0.1, 3.0, 512)  # rows of varied scale
    laid = qw.tiled(tile).in_quads()  # as kernel_layout lays out a weight with act_bits=8
    got = jax.jit(lambda x, qw: quantized_matmul(x, qw, index=1, act_bits=8, impl="cpu"))(x, laid)
    close(got, quant_ref.quantized_matmul(x, qw.layer(1), act_bits=8))
    hlo = jax.jit(lambda x: quantized_matmul(x, laid, index=1, act_bits=8, impl="cpu")).lower(x).as_text()
    assert "specjax_quant_matmul_a8" in hlo


@pytest.mark.parametrize("act_bits", [None, 8])
def test_quantized_matmul_lays_out_a_weight_for_its_activations(act_bits):
    # the int8-activation kernel reads quads and the float one not: the other layout is laid out
    # anew in the call, never misread
    qw = quantize(normal((256, 384), 3), 4, 32).tiled(64)
    other = qw if act_bits == 8 else qw.in_quads()
    x = normal((5, 256), 4)
    close(jax.jit(lambda x: quantized_matmul(x, other, act_bits=act_bits, impl="cpu"))(x),
          quant_ref.quantized_matmul(x, qw, act_bits=act_bits))


def test_int8_activations_round_as_the_reference_rounds():
    # halves (ties go to even), zeros (a zero row has scale 0) and the clip at +-127
    qw = quantize(normal((256, 64), 3), 8, 32)
    x = jnp.zeros((3, 256)).at[0].set(jnp.arange(256) - 127.5).at[1, :4].set(jnp.array([254., 1., -3., 5.]))
    got = quantized_matmul(x, qw, act_bits=8, impl="cpu")
    np.testing.assert_allclose(got, quant_ref.quantized_matmul(x, qw, act_bits=8), rtol=1e-5, atol=1e-5)
    assert not np.asarray(got[2]).any()


# ---- rms norm ------------------------------------------------------------------------------------

@pytest.mark.parametrize("m,d,offset", [(1, 576, 0.0), (7, 576, 1.0), (64, 37, 0.0)])
def test_rms_norm_equals_reference(m, d, offset):
    x, w = normal((m, d), 1), normal((d,), 2)
    got = jax.jit(lambda x, w: rms_norm(x, w, eps=1e-5, offset=offset, impl="cpu"))(x, w)
    close(got, norm_ref.rms_norm(x, w, eps=1e-5, offset=offset))
    hlo = jax.jit(lambda x: rms_norm(x, w, eps=1e-5, impl="cpu")).lower(x).as_text()
    assert "specjax_rms_norm" in hlo


def test_rms_norm_rows_do_not_depend_on_their_neighbours():
    # XLA's own reduction can sum a row differently among 8 rows than alone: the kernel may not
    x, w = normal((2, 8, 576), 1), normal((576,), 2)
    run = jax.jit(lambda x: rms_norm(x, w, eps=1e-6, impl="cpu"))
    whole = run(x)
    for i in range(8):
        np.testing.assert_array_equal(run(x[:1, i:i + 1])[0, 0], whole[0, i])


def test_rms_norm_bfloat16_vmap_grad_and_many_rows():
    x, w = normal((3, 4, 64), 1), normal((64,), 2)
    f = lambda x: rms_norm(x, w, eps=1e-6, impl="cpu")
    ref = lambda x: norm_ref.rms_norm(x, w, eps=1e-6)
    assert f(x.astype(jnp.bfloat16)).dtype == jnp.bfloat16
    close(jax.vmap(f)(x), ref(x))
    close(jax.grad(lambda x: f(x).sum())(x), jax.grad(lambda x: ref(x).sum())(x))
    many = normal((8193, 64), 3)  # past the kernel's elements (a prefill): XLA's fusion
    assert "specjax_rms_norm" not in jax.jit(f).lower(many).as_text()


# ---- argmax --------------------------------------------------------------------------------------

def scores(kind, m, v, seed):
    x = np.array(normal((m, v), seed))
    if kind == "ties":  # few distinct values: the first maximum must win, in a later chunk too
        x = np.random.default_rng(seed).integers(0, 3, (m, v)).astype(np.float32)
    elif kind == "-inf":  # a row of -inf alone: index 0; another with one finite entry late
        x[:] = -np.inf
        x[-1, v - 1] = 0.0
    elif kind == "nan":  # the first NaN wins over any number (jnp.argmax's rule)
        x[:, (2 * v) // 3] = np.nan
        x[0, v - 1] = np.nan
    return jnp.asarray(x)


@pytest.mark.parametrize("kind", ["normal", "ties", "-inf", "nan"])
@pytest.mark.parametrize("m,v", [(1, 1), (2, 15), (3, 17), (1, 16384), (2, 16385), (8, 49152), (1, 50001)])
def test_argmax_equals_reference(kind, m, v):
    x = scores(kind, m, v, seed=m + v)
    np.testing.assert_array_equal(jax.jit(lambda x: argmax(x, impl="cpu"))(x), argmax_ref.argmax(x))
    assert "specjax_argmax" in jax.jit(lambda x: argmax(x, impl="cpu")).lower(x).as_text()


def test_argmax_vmap_grad_and_integers():
    x = normal((4, 3, 1000), 1)
    f = lambda x: argmax(x, impl="cpu")
    np.testing.assert_array_equal(jax.vmap(f)(x), argmax_ref.argmax(x))
    np.testing.assert_array_equal(f(x.astype(jnp.bfloat16)), argmax_ref.argmax(x.astype(jnp.bfloat16)))
    picked = lambda x: jnp.take_along_axis(x, f(x)[..., None], -1).sum()  # a differentiated caller
    np.testing.assert_array_equal(jax.grad(picked)(x), jax.nn.one_hot(argmax_ref.argmax(x), 1000))
    ids = jnp.arange(2**24 + 1, 2**24 - 9, -1)  # integers keep XLA's compare (as floats they would tie)
    assert "specjax_argmax" not in jax.jit(f).lower(ids).as_text() and f(ids) == 0


# ---- tree attention ------------------------------------------------------------------------------

def attention_inputs(b, n, hq, kv, hd, s, layers=2, dtype=jnp.float32, seed=0):
    r = np.random.default_rng(seed)
    q = normal((b, n, hq, hd), seed)
    caches = normal((2, layers, b, s, kv, hd), seed + 1, dtype)
    tree = normal((2, b, n, kv, hd), seed + 2)
    mask = np.tril(r.random((b, n, n)) < 0.6) | np.eye(n, dtype=bool)[None]
    return q, caches[0], caches[1], tree[0], tree[1], jnp.asarray(mask)


@pytest.mark.parametrize("b,n,hq,kv,hd,s,lengths", [
    (1, 1, 9, 3, 64, 64, [10]),            # SmolLM2's heads, an AR step
    (2, 4, 4, 2, 32, 300, [0, 300]),       # an empty row and a full cache; 2 chunks
    (3, 8, 6, 3, 64, 600, [257, 1, 599]),  # ragged, chunk edges
    (1, 5, 2, 2, 16, 16, [16]),
    (2, 64, 4, 1, 128, 40, [3, 40]),
])
@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16])
def test_tree_attention_equals_reference(b, n, hq, kv, hd, s, lengths, dtype):
    q, kc, vc, kt, vt, mask = attention_inputs(b, n, hq, kv, hd, s, dtype=dtype)
    lengths = jnp.array(lengths, jnp.int32)
    got = jax.jit(lambda *a: tree_attention(*a[:-1], index=a[-1], impl="cpu"))(
        q, kc, vc, lengths, kt, vt, mask, jnp.int32(1))
    close(got, attention_ref.tree_attention(q, kc[1], vc[1], lengths, kt, vt, mask))


@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16])
def test_tree_attention_takes_keys_by_position_wherever_they_are_stored(dtype):
    """A query over a path gives the same bits whether the keys before it sit in the cache (a
    decode step) or in the tree block (a verify pass): the kernel sums by position. Each
    query of a 6-node path against 300 committed slots, and again as one-node steps after
    the path's first i nodes were committed (a float32 tree block written to a cache of the
    same dtype), across a chunk edge."""
    b, hq, kv, hd, s, used, n = 1, 6, 3, 64, 320, 254, 6
    q, kt, vt = normal((b, n, hq, hd), 1), normal((b, n, kv, hd), 2, dtype), normal((b, n, kv, hd), 3, dtype)
    kt, vt = kt.astype(jnp.float32), vt.astype(jnp.float32)  # values a cache of this dtype holds exactly
    kc, vc = normal((1, b, s, kv, hd), 4, dtype), normal((1, b, s, kv, hd), 5, dtype)
    run = jax.jit(lambda q, kc, vc, length, kt, vt, mask: tree_attention(
        q, kc, vc, length, kt, vt, mask, index=0, impl="cpu"))
    path = jnp.tril(jnp.ones((1, n, n), bool))
    whole = run(q, kc, vc, jnp.array([used]), kt, vt, path)
    for i in range(n):
        kci = kc.at[0, :, used:used + i].set(kt[:, :i].astype(dtype))
        vci = vc.at[0, :, used:used + i].set(vt[:, :i].astype(dtype))
        step = run(q[:, i:i + 1], kci, vci, jnp.array([used + i]), kt[:, i:i + 1], vt[:, i:i + 1],
                   jnp.ones((1, 1, 1), bool))
        np.testing.assert_array_equal(step[:, 0], whole[:, i])


def test_tree_attention_reads_only_used_slots():
    """Garbage (NaN) in the allocated but unused slots must not reach the output."""
    q, kc, vc, kt, vt, mask = attention_inputs(2, 3, 4, 2, 32, 128, layers=1)
    lengths = jnp.array([5, 70], jnp.int32)
    poison = jnp.arange(128)[None, None, :, None, None] >= lengths[None, :, None, None, None]
    got = tree_attention(q, jnp.where(poison, jnp.nan, kc), jnp.where(poison, jnp.nan, vc), lengths,
                         kt, vt, mask, index=0, impl="cpu")
    close(got, attention_ref.tree_attention(q, kc[0], vc[0], lengths, kt, vt, mask))


def test_tree_attention_falls_back_for_windows_softcaps_and_long_blocks():
    q, kc, vc, kt, vt, mask = attention_inputs(1, 4, 4, 2, 32, 32, layers=1)
    lengths = jnp.array([20], jnp.int32)
    pos = jnp.arange(20, 24)[None]
    for kwargs in (dict(window=8, q_positions=pos), dict(softcap=30.0), dict(scale=0.1)):
        f = jax.jit(lambda *a: tree_attention(*a, index=0, impl="cpu", **kwargs))
        assert "specjax_tree_attention" not in f.lower(q, kc, vc, lengths, kt, vt, mask).as_text()
        close(f(q, kc, vc, lengths, kt, vt, mask),
              attention_ref.tree_attention(q, kc[0], vc[0], lengths, kt, vt, mask, **kwargs))


def test_tree_attention_vmap_and_grad():
    q, kc, vc, kt, vt, mask = attention_inputs(2, 3, 4, 2, 32, 16, layers=1)
    lengths = jnp.array([4, 16], jnp.int32)
    qs = jnp.stack([q, 2 * q])
    f = lambda q: tree_attention(q, kc, vc, lengths, kt, vt, mask, index=0, impl="cpu")
    ref = lambda q: attention_ref.tree_attention(q, kc[0], vc[0], lengths, kt, vt, mask)
    close(jax.vmap(f)(qs), jax.vmap(ref)(qs))
    close(jax.grad(lambda q: f(q).sum())(q), jax.grad(lambda q: ref(q).sum())(q))


# ---- building ------------------------------------------------------------------------------------

def test_no_compiler_is_one_warning_and_xla_runs(tmp_path):
    code = ("import warnings, jax.numpy as jnp\n"
            "from pallas_kernels import ffi\n"
            "from pallas_kernels.matmul import matmul\n"
            "with warnings.catch_warnings(record=True) as w:\n"
            "    warnings.simplefilter('always')\n"
            "    out = matmul(jnp.ones((2, 8)), jnp.ones((8, 4)))\n"
            "assert not ffi.available() and float(out.sum()) == 64.0\n"
            "print([str(x.message) for x in w])\n")
    env = {**os.environ, "CXX": "no-such-compiler", "SPECJAX_CACHE": str(tmp_path)}
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                          cwd=os.path.dirname(os.path.dirname(os.path.dirname(__file__))))
    assert done.returncode == 0, done.stderr
    assert "no C++ compiler found" in done.stdout and "XLA's code runs instead" in done.stdout


def test_an_installed_package_carries_the_kernel_sources():
    """A wheel (not an editable install) must ship what the first use compiles."""
    import fnmatch
    import tomllib
    from pathlib import Path

    root = Path(ffi.__file__).resolve().parent.parent
    config = tomllib.loads((root.parent / "pyproject.toml").read_text())
    patterns = config["tool"]["setuptools"]["package-data"]["pallas_kernels"]
    sources = [p.relative_to(root).as_posix() for p in (*ffi.SOURCES, *ffi.HEADERS)]
    texts = [src.read_text() for src in ffi.SOURCES]
    assert ffi.HEADERS and all(any(f"SYMBOL({t}," in text for text in texts) for t in ffi.TARGETS)
    assert all(any(fnmatch.fnmatch(s, p) for p in patterns) for s in sources), (sources, patterns)


def test_build_is_cached_and_a_killed_build_is_cleaned(tmp_path, monkeypatch):
    monkeypatch.setenv("SPECJAX_CACHE", str(tmp_path))
    monkeypatch.setattr(ffi, "SOURCES", [p for p in ffi.SOURCES if p.parent.name == "rms_norm"])  # a quick build
    folder = tmp_path / "kernels"
    folder.mkdir()
    stale = folder / ".build-999999999.tmp"  # a build killed mid-write: its process is gone
    stale.write_bytes(b"half a library")
    lib = ffi.build()
    assert lib.exists() and not stale.exists() and lib.parent == folder
    mtime = lib.stat().st_mtime_ns
    assert ffi.build() == lib and lib.stat().st_mtime_ns == mtime  # reused, not rebuilt
    broken = tmp_path / "broken" / "cpu.cc"
    broken.parent.mkdir()
    broken.write_text("not C++\n")
    monkeypatch.setattr(ffi, "SOURCES", [*ffi.SOURCES, broken])
    with pytest.raises(RuntimeError, match="compiling the CPU kernels failed:\n.*broken/cpu.cc"):
        ffi.build()
    assert sorted(p.name for p in folder.iterdir()) == [lib.name]  # nothing of the failed build left


@pytest.mark.skipif("avx512f" not in ffi.cpu_flags().split(), reason="this host's own build is the AVX2 path")
def test_the_avx2_path_equals_the_reference_too(tmp_path):
    """On an AVX-512 host, the kernels as an AVX2-only host builds them
    (`SPECJAX_CPU_KERNEL_FLAGS=-mno-avx512f`, a build of their own) pass the equality tests:
    every such test, and every third case of a parametrized one (each function's cases in turn)."""
    env = {**os.environ, "SPECJAX_CACHE": str(tmp_path), "SPECJAX_CPU_KERNEL_FLAGS": "-mno-avx512f"}
    root = os.path.dirname(os.path.dirname(os.path.dirname(__file__)))
    pytest_run = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider"]
    collected = subprocess.run([*pytest_run, "--collect-only", __file__, "-k",
                                "(equals_reference or panels or neighbours or by_position) and not avx2"],
                               env=env, capture_output=True, text=True, cwd=root).stdout.splitlines()
    ids = [line for line in collected if "::" in line]
    count: dict[str, int] = {}  # the cases of each test function so far
    chosen = []
    for node in ids:
        function = node.split("[")[0]
        count[function] = count.get(function, 0) + 1
        if count[function] % 3 == 1:
            chosen.append(node)
    assert len(ids) > 250 and 0.3 * len(ids) < len(chosen) < 0.5 * len(ids), (len(ids), len(chosen))
    done = subprocess.run([*pytest_run, *chosen], env=env, capture_output=True, text=True, cwd=root)
    assert done.returncode == 0, done.stdout[-3000:]
    assert f"{len(chosen)} passed" in done.stdout and list((tmp_path / "kernels").glob("cpu-*.so")), done.stdout[-500:]
