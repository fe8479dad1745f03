"""Layer weights held one buffer per layer (LayerList, `sj.load`'s layout on a GPU) against
the stacked layout: the same forward, the same greedy tokens (AR, a tree drafter, the
layer-skipping drafter), exact round trips through the portable layout, quantization, saving and
sharding, and a loop unrolled at trace time instead of a scan (the point of the layout)."""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import specjax as sj
import specjax.layout
from specjax.drafters import PromptLookup, Swift
from specjax.layout import kernel_layout, portable_layout
from specjax.models import KVCache, Model, forward
from specjax.models.layer_list import LayerList, is_split
from specjax.quantize import is_quantized
from tests.conftest import tiny_llama_config

PROMPTS = [[5, 17, 33, 9, 60, 5, 17, 33], [40, 3], [8, 8, 50, 14, 22, 8, 8]]


def split(model: Model) -> Model:
    plain = portable_layout(model.params)
    return Model({**plain, "layers": {n: LayerList.split(w) for n, w in plain["layers"].items()}}, model.config)


@pytest.fixture(scope="module")
def target():
    return sj.Model.init(dataclasses.replace(tiny_llama_config(), num_layers=4), jax.random.key(0))


def test_the_forward_is_the_stacked_one_without_a_scan(target):
    cfg, listed = target.config, split(target)
    prompt = jnp.array([[5, 17, 33, 9, 60, 5], [40, 3, 8, 8, 50, 14]])
    tree = jnp.array([[1, 0, 0, 0], [1, 1, 0, 0], [1, 0, 1, 0], [1, 1, 0, 1]], bool)[None].repeat(2, 0)
    for model in (target, listed):
        prefill = forward(cfg, model.params, prompt, cache=KVCache.init(cfg, 2, 12), return_layers=(1,))
        cache = prefill.cache._replace(lengths=jnp.full((2,), 6, jnp.int32))
        step = forward(cfg, model.params, jnp.array([[3, 4, 5, 6]] * 2), cache=cache, tree_mask=tree)
        if model is target:
            want = (prefill.logits, prefill.layer_hidden, step.logits, step.cache.k)
    for a, b in zip(want, (prefill.logits, prefill.layer_hidden, step.logits, step.cache.k)):
        np.testing.assert_allclose(b, a, atol=1e-5)
    program = lambda m: str(jax.make_jaxpr(lambda p: forward(cfg, p, prompt).logits)(m.params))
    assert " scan[" in program(target) and " scan[" not in program(listed)


@pytest.mark.parametrize("drafter", [None, PromptLookup(), Swift(window=4, search_steps=4)],
                         ids=["ar", "prompt-lookup", "swift"])
def test_greedy_tokens_are_the_stacked_layout_s(drafter, target):
    want = sj.generate(target, PROMPTS, max_new_tokens=16, drafter=drafter).tokens
    np.testing.assert_array_equal(sj.generate(split(target), PROMPTS, max_new_tokens=16, drafter=drafter).tokens, want)


def test_portable_quantized_saved_and_sharded_forms_are_exact(target, tmp_path):
    listed = split(target)
    jax.tree.map(np.testing.assert_array_equal, portable_layout(listed.params), portable_layout(target.params))
    q = sj.quantize(listed, "int8")
    assert is_quantized(q) and is_split(q.params["layers"])
    jax.tree.map(np.testing.assert_array_equal, portable_layout(q.params),
                 portable_layout(sj.quantize(target, "int8").params))
    for model, want, name in ((listed, target, "float"), (q, sj.quantize(target, "int8"), "int8")):
        sj.save(model, tmp_path / name)
        jax.tree.map(np.testing.assert_array_equal, portable_layout(sj.load(tmp_path / name).params),
                     portable_layout(want.params))
    sharded = sj.shard(listed, sj.sharding.make_mesh((1, 1)))
    assert not is_split(sharded.params["layers"])
    jax.tree.map(np.testing.assert_array_equal, sharded.params["layers"], target.params["layers"])


def test_load_splits_the_layers_on_a_gpu_only(target, monkeypatch):
    assert not is_split(kernel_layout(target.params)["layers"])
    monkeypatch.setattr(specjax.layout.jax, "default_backend", lambda: "tpu")
    assert not is_split(kernel_layout(target.params)["layers"])
    monkeypatch.setattr(specjax.layout.jax, "default_backend", lambda: "gpu")
    laid_out = kernel_layout(target.params)
    assert all(isinstance(w, LayerList) and len(w.layers) == 4 for w in laid_out["layers"].values())
    again = kernel_layout(laid_out)["layers"]["wq"]  # not split again
    assert isinstance(again, LayerList) and again.layers[0] is laid_out["layers"]["wq"].layers[0]
    assert not target.params["layers"]["wq"].is_deleted()
    given_up = jax.tree.map(jnp.copy, target.params)  # a loader's own params: freed as they are split
    consumed = kernel_layout(given_up, consume=True)
    assert all(w.is_deleted() for w in jax.tree.leaves(given_up["layers"]))
    jax.tree.map(np.testing.assert_array_equal, portable_layout(consumed), portable_layout(target.params))


def test_a_scan_cannot_index_a_layer_list(target):
    listed = split(target).params["layers"]["wq"]
    assert listed.layer(2) is listed.layers[2] and listed.shape == target.params["layers"]["wq"].shape
    with pytest.raises(TypeError, match="indexed by a Python int"):
        jax.lax.scan(lambda c, i: (c, listed.layer(i)), 0, jnp.arange(4))
