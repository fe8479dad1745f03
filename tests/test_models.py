"""The Llama-family forward against transformers, the KV cache, tree masks and commits."""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch

import specjax as sj
from specjax.models import KVCache, forward
from tests.conftest import FAMILIES, tiny_llama_config

PROMPTS = [[5, 17, 33, 9, 60, 71, 12], [40, 3], [8, 8, 90, 14, 22]]


@pytest.mark.parametrize("family", list(FAMILIES))
def test_logits_and_greedy_match_transformers(family, hf_family):
    hf, folder = hf_family(family)
    model = sj.load(folder)
    tokens = np.random.RandomState(0).randint(3, 96, size=(2, 11))
    with torch.no_grad():
        ref = hf(torch.tensor(tokens)).logits.numpy()
    ours = np.asarray(sj.forward(model, jnp.asarray(tokens)))
    np.testing.assert_allclose(ours, ref, atol=1e-4, rtol=0)

    out = sj.generate(model, PROMPTS, max_new_tokens=8)
    for i, prompt in enumerate(PROMPTS):
        with torch.no_grad():
            want = hf.generate(torch.tensor([prompt]), max_new_tokens=8, do_sample=False,
                               eos_token_id=None, pad_token_id=0)[0, len(prompt):].tolist()
        assert out.tokens[i].tolist() == want, (family, i)
    assert out.num_tokens.tolist() == [8, 8, 8]


def test_hidden_states_of_chosen_layers_match_transformers(hf_family):
    hf, folder = hf_family("llama3-gqa-tied-scaled")
    model = sj.load(folder)
    tokens = np.arange(3, 13)[None]
    with torch.no_grad():
        ref = hf(torch.tensor(tokens), output_hidden_states=True)
    out = forward(model.config, model.params, jnp.asarray(tokens), return_layers=(0, 1))
    # HF hidden_states[i + 1] is decoder layer i's output, except the last, which is normed.
    np.testing.assert_allclose(out.layer_hidden[0], ref.hidden_states[1].numpy(), atol=1e-5)
    np.testing.assert_allclose(out.hidden, ref.hidden_states[-1].numpy(), atol=1e-5)


def test_old_style_rope_config_loads_the_same(hf_family, tmp_path):
    import json
    import shutil
    _, folder = hf_family("llama3-gqa-tied-scaled")
    shutil.copytree(folder, tmp_path / "old")
    cfg = json.loads((folder / "config.json").read_text())
    rope = cfg.pop("rope_parameters")
    cfg["rope_theta"] = rope.pop("rope_theta")
    cfg["rope_scaling"] = {**rope, "type": rope.pop("rope_type")}
    (tmp_path / "old" / "config.json").write_text(json.dumps(cfg))
    assert sj.load(tmp_path / "old").config == sj.load(folder).config


def test_sharded_checkpoint_loads(hf_family, tmp_path):
    hf, folder = hf_family("qwen2-tied")
    hf.save_pretrained(tmp_path, max_shard_size="20KB")
    assert (tmp_path / "model.safetensors.index.json").exists()
    a, b = sj.load(folder), sj.load(tmp_path)
    jax.tree.map(np.testing.assert_array_equal, a.params, b.params)


def _branches_model():
    return sj.Model.init(tiny_llama_config(max_pos=128), jax.random.key(1))


def _prefilled(model, prefix, batch=1, cache_len=32):
    cache = KVCache.init(model.config, batch, cache_len)
    tokens = jnp.tile(jnp.asarray(prefix)[None], (batch, 1))
    out = forward(model.config, model.params, tokens, cache=cache)
    return out.cache.advance(jnp.full((batch,), len(prefix)))


def test_tree_masked_forward_equals_each_branch():
    model = _branches_model()
    prefix = [3, 14, 15, 9]
    # root 0 -> {1, 2}; 1 -> 3; 2 -> 4. Branches: (0,1,3) and (0,2,4).
    tree_tokens = jnp.array([[26, 5, 35, 8, 97 % 64]])
    parents = [-1, 0, 0, 1, 2]
    mask = np.eye(5, dtype=bool)
    for i, p in enumerate(parents):
        while p >= 0:
            mask[i, p] = True
            p = parents[p]
    depth = jnp.array([[0, 1, 1, 2, 2]])
    cache = _prefilled(model, prefix)
    tree = forward(model.config, model.params, tree_tokens, positions=cache.lengths[:, None] + depth,
                   cache=cache, tree_mask=jnp.asarray(mask)[None])
    for branch in ([0, 1, 3], [0, 2, 4]):
        chain = jnp.asarray(prefix + [int(tree_tokens[0, i]) for i in branch])[None]
        ref = sj.forward(model, chain)[0, len(prefix):]
        np.testing.assert_allclose(tree.logits[0, jnp.array(branch)], ref, atol=1e-5)


@pytest.mark.parametrize("weights", ["float32", "int4", "int4, int8 activations"])
def test_on_cpu_a_verify_pass_gives_each_path_the_bits_of_its_decode_steps(weights):
    """With the CPU kernels (head dim a multiple of 16, a float32 cache), every part of a
    forward treats a row alone and attention sums by position: each node of a tree gets, to
    the bit, the logits that decoding its path one token at a time gives, so greedy
    speculation equals greedy decoding without an argmax tie to flip (int8 activations too:
    each row is rounded with its own scale)."""
    from pallas_kernels import ffi
    if jax.default_backend() != "cpu" or not ffi.available():
        pytest.skip("the CPU kernels run on a CPU with a C++ compiler")
    config = dataclasses.replace(tiny_llama_config(max_pos=128), hidden_size=64, intermediate_size=128,
                                 head_dim=16)
    model = sj.Model.init(config, jax.random.key(2))
    if weights != "float32":
        model = sj.quantize(model, "int4", 32)
    if weights.endswith("activations"):
        model = sj.quantize_activations(model)
    prefix = [3, 14, 15, 9, 27, 41, 2]
    tokens = [26, 5, 35, 8, 40]  # root 0 -> {1, 2}; 1 -> 3; 2 -> 4
    mask = jnp.asarray([[[1, 0, 0, 0, 0], [1, 1, 0, 0, 0], [1, 0, 1, 0, 0], [1, 1, 0, 1, 0], [1, 0, 1, 0, 1]]], bool)
    run = jax.jit(lambda params, tokens, positions, cache, mask: forward(
        config, params, tokens, positions=positions, cache=cache, tree_mask=mask))
    cache = _prefilled(model, prefix)
    depth = jnp.array([[0, 1, 1, 2, 2]])
    tree = run(model.params, jnp.array([tokens]), cache.lengths[:, None] + depth, cache, mask).logits[0]
    for path in ([0, 1, 3], [0, 2, 4]):
        step_cache = cache
        for node in path:
            out = run(model.params, jnp.array([[tokens[node]]]), step_cache.lengths[:, None], step_cache,
                      jnp.ones((1, 1, 1), bool))
            np.testing.assert_array_equal(out.logits[0, 0], tree[node])
            step_cache = out.cache.advance(jnp.array([1]))


def test_commit_then_continue_equals_decoding_from_scratch():
    model = _branches_model()
    prefix = [3, 14, 15, 9]
    tree_tokens = jnp.array([[26, 5, 35, 8, 40], [26, 5, 35, 8, 40]])
    parents = [-1, 0, 0, 1, 2]
    mask = np.eye(5, dtype=bool)
    for i, p in enumerate(parents):
        mask[i, :i] = [j == p or (p > 0 and j == parents[p]) for j in range(i)]
    depth = jnp.array([0, 1, 1, 2, 2])
    cache = _prefilled(model, prefix, batch=2)
    cache = forward(model.config, model.params, tree_tokens, positions=cache.lengths[:, None] + depth,
                    cache=cache, tree_mask=jnp.asarray(np.broadcast_to(mask, (2, 5, 5)))).cache
    # Row 0 accepts 0 -> 2 -> 4 (two drafts); row 1 accepts only the root.
    cache = cache.commit(jnp.array([[0, 2, 4], [0, 0, 0]]), jnp.array([2, 0]))
    np.testing.assert_array_equal(cache.lengths, [7, 5])
    nxt = jnp.array([[11], [12]])
    cont = forward(model.config, model.params, nxt, cache=cache).logits[:, 0]
    ref0 = sj.forward(model, jnp.array([prefix + [26, 35, 40, 11]]))[0, -1]
    ref1 = sj.forward(model, jnp.array([prefix + [26, 12]]))[0, -1]
    np.testing.assert_allclose(cont[0], ref0, atol=1e-5)
    np.testing.assert_allclose(cont[1], ref1, atol=1e-5)


def test_filling_a_fresh_cache_equals_a_forward_through_it():
    """`fill` (the prefill: the prompt attends to itself alone) leaves the cache, hidden states
    and logits a forward through the whole fresh cache gives, on a ragged pair of rows."""
    from specjax.models.target import fill

    model = _branches_model()
    tokens = jnp.array([[3, 14, 15, 9, 26], [5, 35, 8, 0, 0]])
    cache = KVCache.init(model.config, 2, 12)
    want = forward(model.config, model.params, tokens, cache=cache, return_layers=(0,))
    got = fill(model, tokens, cache, return_layers=(0,))
    for a, b in [(got.logits, want.logits), (got.hidden, want.hidden), (got.layer_hidden, want.layer_hidden),
                 (got.cache.k, want.cache.k), (got.cache.v, want.cache.v)]:
        np.testing.assert_allclose(a, b, atol=1e-6)
    np.testing.assert_array_equal(got.cache.lengths, want.cache.lengths)
    assert got.new_kv is None


def test_sampling_is_reproducible_with_a_key():
    model = _branches_model()
    run = lambda seed: sj.generate(model, [[1, 2, 3]], max_new_tokens=12, temperature=1.0,
                                   top_k=20, top_p=0.9, key=jax.random.key(seed)).tokens
    np.testing.assert_array_equal(run(0), run(0))
    assert not np.array_equal(run(0), run(1))


def test_eos_stops_each_row_and_pads_with_minus_one():
    model = _branches_model()
    greedy = sj.generate(model, [[1, 2, 3], [4, 5]], max_new_tokens=6)
    eos = int(greedy.tokens[0, 2])  # row 0's third token becomes the EOS
    out = sj.generate(model, [[1, 2, 3], [4, 5]], max_new_tokens=6, eos_token_id=eos)
    assert out.tokens[0].tolist() == greedy.tokens[0, :3].tolist() + [-1, -1, -1]
    assert out.num_tokens[0] == 3
    row1 = greedy.tokens[1].tolist()
    cut = row1.index(eos) + 1 if eos in row1 else 6
    assert out.tokens[1].tolist()[:cut] == row1[:cut]
    assert out.num_tokens[1] == cut


def test_make_generate_is_a_pure_function_under_jit_and_vmap():
    model = _branches_model()
    gen = sj.make_generate(model.config, prompt_len=3, max_new_tokens=5)
    prompts = jnp.array([[1, 2, 3], [4, 5, 0]])
    lengths = jnp.array([3, 2])
    tokens, num = jax.jit(gen)(model.params, prompts, lengths, jax.random.key(0))
    ref = sj.generate(model, [[1, 2, 3], [4, 5]], max_new_tokens=5)
    np.testing.assert_array_equal(tokens, ref.tokens)
    # vmap over independent groups of prompts
    batched = jax.vmap(gen, in_axes=(None, 0, 0, None))(model.params, prompts[:, None], lengths[:, None],
                                                        jax.random.key(0))
    np.testing.assert_array_equal(batched[0][:, 0], ref.tokens)


def test_bfloat16_forward_is_close_to_float32(hf_family):
    _, folder = hf_family("llama-mha-untied")
    f32, bf16 = sj.load(folder), sj.load(folder, dtype="bfloat16")
    assert bf16.params["layers"]["wq"].dtype == jnp.bfloat16
    tokens = jnp.arange(3, 19)[None]
    np.testing.assert_allclose(sj.forward(bf16, tokens), sj.forward(f32, tokens), atol=0.05)


def test_a_masked_diffusion_config_attends_both_ways_and_round_trips():
    config = dataclasses.replace(tiny_llama_config(), mask_token_id=63)
    model = sj.Model.init(config, jax.random.PRNGKey(0))
    tokens = jnp.array([[5, 9, 63, 63, 2]])
    later_changed = sj.forward(model, tokens.at[0, 4].set(7))
    assert not np.allclose(sj.forward(model, tokens)[0, 0], later_changed[0, 0])  # position 0 sees 4
    causal = sj.Model(model.params, tiny_llama_config())
    np.testing.assert_allclose(sj.forward(causal, tokens)[0, 0], sj.forward(causal, tokens.at[0, 4].set(7))[0, 0])
    assert sj.ModelConfig.from_hf(config.to_hf()) == config
