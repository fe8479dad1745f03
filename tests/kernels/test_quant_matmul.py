"""QuantizedWeight, (de)quantization, and the quantized-matmul kernels against the reference."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import pallas_kernels
from pallas_kernels import QuantizedWeight, dequantize, quantize
from pallas_kernels.quant_matmul import gpu, reference, tpu
from tests.kernels.modes import ON_ACCELERATOR, interpret_for, races_found


def normal(shape, seed=0, dtype=np.float32):
    return jnp.asarray(np.random.default_rng(seed).standard_normal(shape, np.float32).astype(dtype))


@pytest.mark.parametrize("bits,group_size", [(8, 32), (8, 128), (4, 64)])
def test_quantize_error_within_half_a_step(bits, group_size):
    k, n = 512, 48
    w = normal((k, n))
    qw = quantize(w, bits, group_size)
    pack = 8 // bits
    assert qw.data.shape == (k // pack, n) and qw.data.dtype == jnp.int8
    assert qw.scales.shape == (pack, k // (pack * group_size), n)
    # every element is off by at most half a step of its group: max|group| / (2 qmax)
    groups = np.asarray(w).reshape(k // group_size, group_size, n)
    step = np.abs(groups).max(1) / (2 ** (bits - 1) - 1)
    err = np.abs(np.asarray(dequantize(qw)) - np.asarray(w)).reshape(k // group_size, group_size, n)
    assert (err <= step[:, None] / 2 * (1 + 1e-5)).all()
    assert err.mean() > step.mean() / 8  # really rounded (uniform error: mean = step / 4)


def test_int4_packing_round_trip_and_layout():
    k, n, g = 256, 32, 64
    q = np.random.default_rng(0).integers(-7, 8, (k, n)).astype(np.float32)
    q[::g] = 7  # every group reaches 7, so every scale is 1 and quantization is exact
    qw = quantize(jnp.asarray(q), bits=4, group_size=g)
    np.testing.assert_array_equal(np.asarray(qw.scales), 1.0)
    np.testing.assert_array_equal(np.asarray(dequantize(qw)), q)
    data = np.asarray(qw.data).astype(np.int32)  # byte r: row r low nibble, row K/2 + r high
    np.testing.assert_array_equal(((data & 0xF) ^ 8) - 8, q[:k // 2])
    np.testing.assert_array_equal(data >> 4, q[k // 2:])


def test_column_panels_hold_the_same_weight():
    qw = quantize(normal((3, 256, 192)), bits=4, group_size=32)
    panels = qw.tiled(64)
    assert panels.data.shape == (3, 3, 128, 64) and panels.scales.shape == (3, 3, 2, 4, 64)
    assert panels.shape == qw.shape and panels.lead_shape == (3,)
    np.testing.assert_array_equal(panels.data[:, 1, :, 5], qw.data[:, :, 69])  # column 64 + 5
    np.testing.assert_array_equal(dequantize(panels), dequantize(qw))
    np.testing.assert_array_equal(panels.untiled().data, qw.data)
    np.testing.assert_array_equal(panels.tiled(32).untiled().scales, qw.scales)
    np.testing.assert_array_equal(dequantize(panels.layer(2)), dequantize(qw)[2])
    x = normal((3, 256), seed=1)
    np.testing.assert_allclose(reference.quantized_matmul(x, panels.layer(0)),
                               reference.quantized_matmul(x, qw.layer(0)), rtol=1e-6, atol=1e-6)
    with pytest.raises(ValueError, match="multiple of the tile"):
        qw.tiled(128)


@pytest.mark.parametrize("bits", [8, 4])
@pytest.mark.parametrize("tile", [64, 0])
def test_quads_hold_the_same_weight(bits, tile):
    qw = quantize(normal((2, 256, 192)), bits=bits, group_size=32)
    quads = qw.tiled(tile).in_quads()
    assert quads.quads and quads.data.shape == qw.tiled(tile).data.shape
    np.testing.assert_array_equal(dequantize(quads), dequantize(qw))
    np.testing.assert_array_equal(quads.untiled().data, qw.data)
    np.testing.assert_array_equal(quads.tiled(tile).data, qw.tiled(tile).data)
    # rows 4..7 of column 65 (panel 1's column 1, or row-major column 65): 4 bytes together,
    # each offset to unsigned (int4: both nibbles)
    column, at = (65 % tile, 1) if tile else (65, None)
    data = np.asarray(quads.data[0] if at is None else quads.data[0, at]).reshape(-1)
    width = tile or 192
    got = data[4 * width + 4 * column: 4 * width + 4 * column + 4]
    want = np.asarray(qw.data[0, 4:8, 65]) ^ np.int8(-128 if bits == 8 else -120)
    np.testing.assert_array_equal(got, want)


def test_quantized_weight_is_a_stackable_scannable_pytree():
    w = normal((3, 128, 16))  # a stack of 3 layers
    qw = quantize(w, bits=4, group_size=32)
    assert qw.shape == (3, 128, 16) and len(jax.tree_util.tree_leaves(qw)) == 2
    per_layer = [quantize(w[i], bits=4, group_size=32) for i in range(3)]
    for i, one in enumerate(per_layer):
        np.testing.assert_array_equal(qw.data[i], one.data)
        np.testing.assert_array_equal(qw.scales[i], one.scales)

    def step(carry, layer_qw):
        assert isinstance(layer_qw, QuantizedWeight) and layer_qw.data.ndim == 2
        return carry, dequantize(layer_qw)

    _, stacked = jax.jit(lambda q: jax.lax.scan(step, 0, q))(qw)
    np.testing.assert_array_equal(stacked, dequantize(qw))


def test_quantized_weight_round_trips_through_orbax(tmp_path):
    ocp = pytest.importorskip("orbax.checkpoint")
    params = {"layers": {"wq": quantize(normal((2, 128, 32)), bits=4, group_size=32)}}
    with ocp.StandardCheckpointer() as checkpointer:
        checkpointer.save(tmp_path / "ckpt", params)
    with ocp.StandardCheckpointer() as checkpointer:
        restored = checkpointer.restore(tmp_path / "ckpt", jax.eval_shape(lambda: params))
    restored, saved = restored["layers"]["wq"], params["layers"]["wq"]
    assert isinstance(restored, QuantizedWeight) and restored.shape == saved.shape
    np.testing.assert_array_equal(restored.data, saved.data)
    np.testing.assert_array_equal(restored.scales, saved.scales)


def test_bad_inputs_get_clear_errors():
    w = normal((256, 32))
    with pytest.raises(ValueError, match="bits must be 8 or 4"):
        quantize(w, bits=3)
    with pytest.raises(ValueError, match="group_size must be one of"):
        quantize(w, group_size=48)
    with pytest.raises(ValueError, match="must be divisible by 256"):
        quantize(normal((384, 32)), bits=4, group_size=128)
    qw = quantize(w, bits=8, group_size=32)
    with pytest.raises(ValueError, match=r"x must be \[M, K=256\]"):
        pallas_kernels.quantized_matmul(normal((2, 128)), qw)
    with pytest.raises(ValueError, match="act_bits"):
        pallas_kernels.quantized_matmul(normal((2, 256)), qw, act_bits=4)
    with pytest.raises(ValueError, match="leading axes"):
        pallas_kernels.quantized_matmul(normal((2, 256)), quantize(normal((2, 256, 32)), 8, 32))


# (bits, group_size, act_bits, activation dtype, M, K, N)
CASES = {
    "int8-g32-f32-m1": (8, 32, None, jnp.float32, 1, 512, 64),
    "int4-g64-bf16-m5": (4, 64, None, jnp.bfloat16, 5, 512, 256),
    "w8a8-g128-bf16-m16": (8, 128, 8, jnp.bfloat16, 16, 512, 128),
    "w4a8-g128-f32-m3": (4, 128, 8, jnp.float32, 3, 1024, 128),
}
TOL = {jnp.float32: 1e-5, jnp.bfloat16: 1e-2}  # of max |reference|
KERNELS = {  # mode -> (kernel, options that make several K steps at these sizes)
    "gpu": (gpu.quantized_matmul, {}),
    "tpu": (tpu.quantized_matmul, dict(target_k=256)),
    "tpu-interpret": (tpu.quantized_matmul, dict(target_k=256)),
}
GRID = ([("gpu", c) for c in CASES] + [("tpu", c) for c in list(CASES)[1:3]]
        + [("tpu-interpret", c) for c in CASES])


@pytest.mark.parametrize("mode,case", GRID)
def test_kernel_matches_reference(mode, case):
    bits, group_size, act_bits, dtype, m, k, n = CASES[case]
    interpret = interpret_for(mode)
    kernel, options = KERNELS[mode]
    x = normal((m, k), seed=1, dtype=dtype)
    qw = quantize(normal((k, n)), bits, group_size)
    out = kernel(x, qw, act_bits=act_bits, **options, interpret=interpret)
    expected = jax.jit(reference.quantized_matmul, static_argnames="act_bits")(
        x, qw, act_bits=act_bits)
    assert out.shape == (m, n) and out.dtype == dtype
    out, expected = np.asarray(out, np.float32), np.asarray(expected, np.float32)
    assert not np.isnan(out).any()
    np.testing.assert_allclose(out, expected, rtol=0, atol=TOL[dtype] * np.abs(expected).max())
    if mode == "tpu-interpret":
        assert races_found() is not True


def test_w8a8_rounds_activations():
    """The W8A8 reference really quantizes x: it differs from weight-only, by about x's step."""
    x, qw = normal((4, 256), seed=1), quantize(normal((256, 32)), 8, 32)
    weight_only = reference.quantized_matmul(x, qw)
    w8a8 = reference.quantized_matmul(x, qw, act_bits=8)
    rel = np.abs(np.asarray(w8a8 - weight_only)).max() / np.abs(np.asarray(weight_only)).max()
    assert 1e-4 < rel < 2e-2


def test_api_honours_out_dtype_and_matches_the_reference():
    x, qw = normal((3, 256), seed=1, dtype=jnp.bfloat16), quantize(normal((256, 32)), 4, 32)
    out = pallas_kernels.quantized_matmul(x, qw, out_dtype=jnp.float32)
    assert out.dtype == jnp.float32
    if not ON_ACCELERATOR:  # the CPU kernel's sums run in another order than XLA's dot (host-dependent)
        expected = reference.quantized_matmul(x, qw, out_dtype=jnp.float32)
        np.testing.assert_allclose(out, expected, rtol=0, atol=1e-6 * np.abs(expected).max())
