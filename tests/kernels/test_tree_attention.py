"""Tree-attention kernels against the reference (modes: see modes.py)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.experimental import pallas as pl

import pallas_kernels
from pallas_kernels.tree_attention import causal_blocks, gpu, reference, tpu, tree_attention
from tests.kernels.modes import ON_ACCELERATOR, interpret_for, races_found

_reference_jit = jax.jit(reference.tree_attention, static_argnames="window")


def reference_tree_attention(*args, **kwargs):
    """The reference at full float32 matmul precision (XLA may pick TF32 on GPUs)."""
    with jax.default_matmul_precision("float32"):
        return _reference_jit(*args, **kwargs)


def random_tree_mask(rng, batch, n):
    """Ancestor-or-self masks bool[B,N,N] of random trees (parents[i] < i, node 0 the root)."""
    masks = np.zeros((batch, n, n), bool)
    for b in range(batch):
        for i in range(n):
            masks[b, i, i] = True
            if i:
                masks[b, i] |= masks[b, rng.integers(0, i)]
    return masks


def make_inputs(*, n, hq, kv, hd, s, lengths, dtype, seed=0):
    """Random inputs (built in numpy: no per-op compiles); the kernel's copy of the cache holds
    NaN in every slot at or past a row's length."""
    b = len(lengths)
    rng = np.random.default_rng(seed)
    rand = lambda *shape: rng.standard_normal(shape, np.float32).astype(dtype)
    q = rand(b, n, hq, hd)
    k_cache, v_cache = rand(b, s, kv, hd), rand(b, s, kv, hd)
    k_tree, v_tree = rand(b, n, kv, hd), rand(b, n, kv, hd)
    lengths = np.asarray(lengths, np.int32)
    mask = random_tree_mask(rng, b, n)
    stale = np.arange(s)[None, :, None, None] >= lengths[:, None, None, None]
    poison = lambda x: np.where(stale, np.nan, x).astype(dtype)
    clean = (q, k_cache, v_cache, lengths, k_tree, v_tree, mask)
    poisoned = (q, poison(k_cache), poison(v_cache), lengths, k_tree, v_tree, mask)
    return [jnp.asarray(x) for x in clean], [jnp.asarray(x) for x in poisoned]


# (nodes, query heads, kv heads, head_dim, cache slots, lengths, dtype): single-token and
# 64-node trees, GQA ratios 1 / 4 / 8, head_dim 64 / 128, lengths that are not multiples of
# the blocks, an empty prefix and a full cache.
CASES = {
    "n1-g1-hd64": (1, 2, 2, 64, 300, (0, 300), jnp.float32),
    "n64-g4-hd128-bf16": (64, 8, 2, 128, 300, (37, 250), jnp.bfloat16),
    "n64-g8-hd64": (64, 8, 1, 64, 200, (129, 1), jnp.float32),
}
TOL = {jnp.float32: 1e-4, jnp.bfloat16: 2e-2}
KERNELS = {  # mode -> (kernel, block options that make several blocks / splits at these sizes)
    "gpu": (gpu.tree_attention, dict(block_k=64, num_splits=3)),
    "tpu": (tpu.tree_attention, dict(block_k=128)),
    "tpu-interpret": (tpu.tree_attention, dict(block_k=128)),
}
GRID = [("gpu", c) for c in CASES] + [("tpu", "n64-g4-hd128-bf16")] + [
    ("tpu-interpret", c) for c in CASES]


@pytest.mark.parametrize("mode,case", GRID)
def test_kernel_matches_reference(mode, case):
    n, hq, kv, hd, s, lengths, dtype = CASES[case]
    interpret = interpret_for(mode)
    kernel, options = KERNELS[mode]
    clean, poisoned = make_inputs(n=n, hq=hq, kv=kv, hd=hd, s=s, lengths=lengths, dtype=dtype)
    out = kernel(*poisoned, **options, interpret=interpret)
    expected = reference_tree_attention(*clean)
    assert out.shape == expected.shape and out.dtype == expected.dtype
    assert not np.isnan(np.asarray(out, np.float32)).any()
    np.testing.assert_allclose(np.asarray(out, np.float32), np.asarray(expected, np.float32),
                               atol=TOL[dtype], rtol=TOL[dtype])
    if mode == "tpu-interpret":
        assert races_found() is not True


def test_gpu_kernel_reads_a_layer_of_the_stacks_in_place():
    """With `layer`, the GPU kernel takes the stacks [L, ...] and reads that layer's block (the
    others hold other numbers, so a wrong layer fails); through the API for an int index too."""
    n, hq, kv, hd, s, lengths, dtype = CASES["n64-g8-hd64"]
    interpret = interpret_for("gpu")
    clean, poisoned = make_inputs(n=n, hq=hq, kv=kv, hd=hd, s=s, lengths=lengths, dtype=dtype)
    q, k_cache, v_cache, lens, k_tree, v_tree, mask = poisoned
    stack = lambda c: jnp.stack([c * 2, c, c * 3])  # layer 1 is the case's cache
    out = gpu.tree_attention(q, stack(k_cache), stack(v_cache), lens, k_tree, v_tree, mask, layer=1,
                             block_k=64, num_splits=3, interpret=interpret)
    expected = reference_tree_attention(*clean)
    np.testing.assert_allclose(np.asarray(out), np.asarray(expected), atol=TOL[dtype], rtol=TOL[dtype])
    via_api = tree_attention(q, stack(k_cache), stack(v_cache), lens, k_tree, v_tree, mask, index=1,
                             impl="gpu", interpret=interpret)
    np.testing.assert_allclose(np.asarray(via_api), np.asarray(expected), atol=TOL[dtype], rtol=TOL[dtype])
    other = gpu.tree_attention(q, stack(k_cache), stack(v_cache), lens, k_tree, v_tree, mask, layer=2,
                               block_k=64, num_splits=3, interpret=interpret)
    assert not np.allclose(np.asarray(other), np.asarray(expected), atol=TOL[dtype])


def test_interpret_mode_poisons_unwritten_output():
    """The NaN checks above can fail: in HLO interpret mode an output block a kernel never
    writes reads as NaN. (TPU interpret mode reuses the output VMEM buffer across grid steps,
    so there only the first unwritten block would be NaN, as on hardware.)"""
    if ON_ACCELERATOR:
        pytest.skip("interpret-mode property")

    def kernel(x_ref, o_ref):
        @pl.when(pl.program_id(0) == 0)
        def _():
            o_ref[...] = x_ref[...]

    out = pl.pallas_call(kernel, grid=(2,), in_specs=[pl.BlockSpec((8, 128), lambda i: (i, 0))],
                         out_specs=pl.BlockSpec((8, 128), lambda i: (i, 0)),
                         out_shape=jax.ShapeDtypeStruct((16, 128), jnp.float32),
                         interpret=True)(jnp.ones((16, 128), jnp.float32))
    assert not np.isnan(np.asarray(out[:8])).any() and np.isnan(np.asarray(out[8:])).all()


def test_api_picks_reference_for_windows_and_the_kernel_on_cpu():
    clean, _ = make_inputs(n=4, hq=4, kv=2, hd=16, s=24, lengths=(5, 24), dtype=jnp.float32)
    positions = clean[3][:, None] + jnp.arange(4)[None, :]
    api = jax.jit(pallas_kernels.tree_attention, static_argnames=("window", "interpret"))
    with jax.default_matmul_precision("float32"):
        windowed = api(*clean, q_positions=positions, window=6, interpret=True)
    np.testing.assert_array_equal(windowed, reference_tree_attention(
        *clean, q_positions=positions, window=6))
    if not ON_ACCELERATOR:  # the CPU kernel where one is built, else the reference itself
        want = reference_tree_attention(*clean)
        np.testing.assert_allclose(api(*clean), want, atol=1e-6, rtol=1e-5)
        np.testing.assert_array_equal(pallas_kernels.tree_attention(*clean, impl="reference"), want)


@pytest.mark.parametrize("n,hq,kv,window,softcap,dtype", [
    (300, 9, 3, None, None, jnp.float32),  # SmolLM2's heads; the last block ragged (300 = 2 * 128 + 44)
    (257, 4, 4, 50, 30.0, jnp.float32),  # a sliding window in the mask, Gemma's soft-cap
    (129, 8, 2, None, None, jnp.bfloat16),
])
def test_causal_blocks_match_the_reference(n, hq, kv, window, softcap, dtype):
    """A prefill's causal block by query blocks equals the full square; a mask with a key after
    its query (not causal) is where the blocks differ, so the check can fail."""
    rng = np.random.default_rng(n)
    q, k, v = (jnp.asarray(rng.standard_normal((2, n, h, 32), np.float32), dtype) for h in (hq, kv, kv))
    i = np.arange(n)
    causal = (i[None, :] <= i[:, None]) & (i[:, None] - i[None, :] < (window or n))
    mask = jnp.asarray(np.broadcast_to(causal, (2, n, n)))
    empty, lengths = jnp.zeros((2, 0, kv, 32), dtype), jnp.zeros((2,), jnp.int32)
    want = reference_tree_attention(q, empty, empty, lengths, k, v, mask, softcap=softcap)
    with jax.default_matmul_precision("float32"):
        blocks = jax.jit(causal_blocks.causal_attention, static_argnames="softcap")
        got = blocks(q, k, v, mask, softcap=softcap)
        via_api = jax.jit(pallas_kernels.tree_attention, static_argnames=("causal", "softcap", "impl"))(
            q, empty, empty, lengths, k, v, mask, causal=True, softcap=softcap, impl="cpu")
    tol = TOL[dtype]
    np.testing.assert_allclose(np.asarray(got, np.float32), np.asarray(want, np.float32), atol=tol, rtol=tol)
    np.testing.assert_array_equal(via_api, got)
    future = mask.at[:, 0, n - 1].set(True)  # the first query sees the last key: not causal
    wrong = causal_blocks.causal_attention(q, k, v, future, softcap=softcap)
    assert not np.allclose(np.asarray(wrong[:, 0], np.float32), np.asarray(
        reference_tree_attention(q, empty, empty, lengths, k, v, future, softcap=softcap)[:, 0], np.float32),
        atol=tol, rtol=tol)


def test_api_rejects_bad_shapes():
    clean, _ = make_inputs(n=4, hq=3, kv=2, hd=16, s=24, lengths=(5, 24), dtype=jnp.float32)
    with pytest.raises(ValueError, match="multiple of kv heads"):
        pallas_kernels.tree_attention(*clean)
    clean, _ = make_inputs(n=4, hq=4, kv=2, hd=16, s=24, lengths=(5, 24), dtype=jnp.float32)
    with pytest.raises(ValueError, match="tree_mask"):
        pallas_kernels.tree_attention(*clean[:6], clean[6][:, :3])
