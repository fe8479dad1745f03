"""The kernels lower for CUDA (Pallas -> Triton IR) and TPU (Pallas -> Mosaic) at real shapes.

Interpret mode hides the hardware block rules (power-of-two Triton tensors, (8, 128) TPU
tiles); exporting for a platform runs the Pallas lowering — and its checks — without the
device. Triton's and Mosaic's own compilers still run only on the device.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import pytest
from jax import export

from pallas_kernels import quantize
from pallas_kernels.quant_matmul import gpu as quant_gpu, tpu as quant_tpu
from pallas_kernels.tree_attention import gpu as tree_gpu, tpu as tree_tpu

PLATFORMS = {"gpu": "cuda", "tpu": "tpu"}
TRITON_CALL = export.DisabledSafetyCheck.custom_call("__gpu$xla.gpu.triton")


def lower(fn, backend, *args):
    export.export(jax.jit(fn), platforms=[PLATFORMS[backend]], disabled_checks=[TRITON_CALL])(
        *args)


def tree_args(b, n, hq, kv, hd, s):
    sds = jax.ShapeDtypeStruct
    cache, tree = sds((b, s, kv, hd), jnp.bfloat16), sds((b, n, kv, hd), jnp.bfloat16)
    return (sds((b, n, hq, hd), jnp.bfloat16), cache, cache, sds((b,), jnp.int32), tree, tree,
            sds((b, n, n), jnp.bool_))


@pytest.mark.parametrize("backend", ["gpu", "tpu"])
@pytest.mark.parametrize("shape", [(2, 64, 32, 8, 128, 4096), (1, 1, 8, 2, 64, 1000),
                                   (2, 64, 8, 1, 64, 300)])
def test_tree_attention_lowers(backend, shape):
    kernel = {"gpu": tree_gpu, "tpu": tree_tpu}[backend].tree_attention
    lower(kernel, backend, *tree_args(*shape))


def test_tree_attention_lowers_reading_a_layer_of_the_stacks():
    q, cache, _, lengths, tree, _, mask = tree_args(1, 4, 32, 8, 128, 4096)
    stack = jax.ShapeDtypeStruct((32, *cache.shape), cache.dtype)
    lower(lambda q, k, v, lens, kt, vt, m: tree_gpu.tree_attention(q, k, v, lens, kt, vt, m, layer=31),
          "gpu", q, stack, stack, lengths, tree, tree, mask)


@pytest.mark.parametrize("backend", ["gpu", "tpu"])
@pytest.mark.parametrize("bits,group_size,act_bits,m,k,n", [
    (8, 128, None, 1, 4096, 4096), (4, 128, None, 16, 4096, 14336), (4, 32, None, 3, 512, 64),
    (8, 128, 8, 8, 14336, 4096), (4, 128, 8, 2, 4096, 4096)])
def test_quantized_matmul_lowers(backend, bits, group_size, act_bits, m, k, n):
    kernel = {"gpu": quant_gpu, "tpu": quant_tpu}[backend].quantized_matmul
    qw = jax.eval_shape(lambda w: quantize(w, bits, group_size),
                        jax.ShapeDtypeStruct((k, n), jnp.float32))
    lower(lambda x, w: kernel(x, w, act_bits=act_bits), backend,
          jax.ShapeDtypeStruct((m, k), jnp.bfloat16), qw)
