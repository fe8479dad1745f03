"""Weights in the kernels' layout (column panels on CPU) against the row-major layout: the same
values, the same decode bits, and every path that reads or writes weights gets them row-major
where it needs them (checkpoints, HF folders, quantization, a Clover head's copy of a layer)."""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import specjax as sj
from pallas_kernels import QuantizedWeight, ffi
from pallas_kernels.matmul import PanelWeight
from specjax.heads import clover
from specjax.layout import kernel_layout, portable_layout
from specjax.models import KVCache, Model, forward

pytestmark = pytest.mark.skipif(jax.default_backend() != "cpu" or not ffi.available(),
                                reason="the panel layout is the CPU kernel's")


@pytest.fixture(scope="module")
def tiny():
    return sj.load("tiny")


def test_load_gives_the_float_layer_stacks_in_panels(tiny):
    layers = tiny.params["layers"]
    assert all(isinstance(layers[n], PanelWeight) for n in ("wq", "wk", "wv", "wo", "w_gate", "w_up", "w_down"))
    assert isinstance(layers["attn_norm"], jax.Array) and isinstance(tiny.params["embed"], jax.Array)
    plain = portable_layout(tiny.params)
    assert not any(isinstance(w, PanelWeight) for w in plain["layers"].values())
    jax.tree.map(np.testing.assert_array_equal, kernel_layout(plain), tiny.params)


def test_a_decode_step_reads_the_same_bits_from_panels(tiny):
    cfg, plain = tiny.config, portable_layout(tiny.params)
    cache = KVCache.init(cfg, 2, 64)
    prompt = jnp.asarray(np.random.default_rng(0).integers(0, cfg.vocab_size, (2, 20)), jnp.int32)
    run = jax.jit(lambda p, t, c: forward(cfg, p, t, cache=c))
    filled = run(plain, prompt, cache)
    np.testing.assert_allclose(run(tiny.params, prompt, cache).logits, filled.logits, rtol=1e-4, atol=1e-4)
    for new in (prompt[:, :1], prompt[:, :5]):  # a step, a verify block
        np.testing.assert_array_equal(run(tiny.params, new, filled.cache).logits,
                                      run(plain, new, filled.cache).logits)


def test_quantizing_a_model_in_panels_quantizes_its_values(tiny):
    got = sj.quantize(tiny, "int8").params["layers"]["w_up"]
    want = sj.quantize(Model(portable_layout(tiny.params), tiny.config), "int8").params["layers"]["w_up"]
    assert isinstance(got, QuantizedWeight)
    jax.tree.map(np.testing.assert_array_equal, got, want)


def test_checkpoints_and_hf_folders_hold_the_row_major_weights(tiny, tmp_path):
    sj.save(tiny, tmp_path / "ckpt")
    sj.save(tiny, tmp_path / "hf", format="hf")
    for folder in ("ckpt", "hf"):
        again = sj.load(tmp_path / folder)
        jax.tree.map(np.testing.assert_array_equal, again.params, tiny.params)
    raw = sj.load(tmp_path / "ckpt", mesh=jax.sharding.Mesh(np.array(jax.devices()[:1]), ("data",)))
    assert isinstance(raw.params["layers"]["wq"], jax.Array)  # read as stored, then laid out by sharding


def test_a_clover_head_copies_a_layer_row_major(tiny):
    block = dataclasses.replace(tiny.config, num_layers=1, dtype="float32")
    params = clover.init(clover.CloverConfig(block, tiny.config.num_layers, 2), jax.random.key(0), tiny.params)
    assert not any(isinstance(w, PanelWeight) for w in params["block"].values())
    np.testing.assert_array_equal(params["block"]["wq"][0], portable_layout(tiny.params)["layers"]["wq"][-1])
