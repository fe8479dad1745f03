"""Draft heads: Medusa and EAGLE (1 and 3) — training, greedy equality in the engine,
published-layout loaders against references written here from the papers' definitions, and
clear errors."""

from __future__ import annotations

import dataclasses
import json
import shutil

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from safetensors.numpy import save_file

import specjax as sj
from pallas_kernels import QuantizedWeight, dequantize
from specjax.drafters import Eagle, Medusa
from specjax.tree.sparse import medusa_tree
from specjax.heads import eagle as eh
from specjax.heads import medusa as mh

RAGGED = [[5, 17, 33, 9, 60, 5, 17, 33], [40, 3], [8, 8, 50, 14, 22, 8, 8], [11]]
E, V = 32, 64


def _config(layers=4):
    return sj.ModelConfig(model_type="llama", vocab_size=V, hidden_size=E, intermediate_size=64,
                          num_layers=layers, num_heads=4, num_kv_heads=2, head_dim=8,
                          max_position_embeddings=256)


@pytest.fixture(scope="module")
def target():
    return sj.Model.init(_config(), jax.random.key(0))


# ---- numpy references from the papers' definitions ----------------------------------------------

def silu(x):
    return x / (1 + np.exp(-x))


def rms(x, w, eps=1e-6):
    return w * x / np.sqrt((x * x).mean(-1, keepdims=True) + eps)


def rope(x, pos, theta=10000.0):  # x [T, H, hd], HF rotate-half
    hd = x.shape[-1]
    inv = 1.0 / theta ** (np.arange(0, hd, 2) / hd)
    ang = pos[:, None] * inv  # [T, hd/2]
    cos, sin = np.cos(ang)[:, None], np.sin(ang)[:, None]
    x1, x2 = x[..., : hd // 2], x[..., hd // 2:]
    return np.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], -1)


def llama_attention(x, sd, pre, heads, kv, hd):  # causal self-attention over x [T, in]
    t = x.shape[0]
    q = (x @ sd[f"{pre}self_attn.q_proj.weight"].T).reshape(t, heads, hd)
    k = (x @ sd[f"{pre}self_attn.k_proj.weight"].T).reshape(t, kv, hd)
    v = (x @ sd[f"{pre}self_attn.v_proj.weight"].T).reshape(t, kv, hd)
    pos = np.arange(t, dtype=np.float64)
    q, k = rope(q, pos), rope(k, pos)
    k, v = np.repeat(k, heads // kv, 1), np.repeat(v, heads // kv, 1)
    s = np.einsum("thd,shd->hts", q, k) / np.sqrt(hd)
    s = np.where(np.tril(np.ones((t, t), bool)), s, -np.inf)
    p = np.exp(s - s.max(-1, keepdims=True))
    p /= p.sum(-1, keepdims=True)
    return np.einsum("hts,shd->thd", p, v).reshape(t, -1) @ sd[f"{pre}self_attn.o_proj.weight"].T


def llama_mlp(x, sd, pre):
    g = x @ sd[f"{pre}mlp.gate_proj.weight"].T
    u = x @ sd[f"{pre}mlp.up_proj.weight"].T
    return (silu(g) * u) @ sd[f"{pre}mlp.down_proj.weight"].T


def rand(rng, *shape, scale=0.2):
    return (scale * rng.standard_normal(shape)).astype(np.float32)


# ---- Medusa ------------------------------------------------------------------------------------

def medusa_fixture(tmp_path, heads=3, hidden=E, vocab=V, drop=()):
    rng = np.random.default_rng(0)
    sd = {}
    for i in range(heads):
        sd[f"{i}.0.linear.weight"] = rand(rng, hidden, hidden)
        sd[f"{i}.0.linear.bias"] = rand(rng, hidden)
        sd[f"{i}.1.weight"] = rand(rng, vocab, hidden)
    for k in drop:
        del sd[k]
    tmp_path.mkdir(parents=True, exist_ok=True)
    save_file(sd, str(tmp_path / "medusa_lm_head.safetensors"))
    # Medusa's uploaded configs understate the head count: the keys decide.
    (tmp_path / "config.json").write_text(json.dumps({"medusa_num_heads": 2, "medusa_num_layers": 1}))
    return sd


def test_medusa_published_layout_matches_the_paper(tmp_path):
    sd = medusa_fixture(tmp_path)
    drafter = Medusa.load(tmp_path)
    assert mh.num_heads(drafter.params) == 3 and drafter.num_layers == 1
    h = np.random.default_rng(1).standard_normal((5, E)).astype(np.float32)
    got = np.asarray(mh.apply(drafter.params, jnp.asarray(h)))  # [5, K, V]
    for k in range(3):  # head_k(h) = W2_k (h + SiLU(W1_k h + b1_k))
        x = h + silu(h @ sd[f"{k}.0.linear.weight"].T + sd[f"{k}.0.linear.bias"])
        np.testing.assert_allclose(got[:, k], x @ sd[f"{k}.1.weight"].T, rtol=1e-4, atol=1e-4)


def test_medusa_bad_checkpoints_fail_clearly(tmp_path, target):
    medusa_fixture(tmp_path / "a", drop=("1.0.linear.bias",))
    with pytest.raises(KeyError, match=r"missing key\(s\): 1\.0\.linear\.bias"):
        Medusa.load(tmp_path / "a")
    medusa_fixture(tmp_path / "b", hidden=48)
    with pytest.raises(ValueError, match="hidden size 48.*hidden size 32"):
        sj.generate(target, [[1, 2, 3]], max_new_tokens=2, drafter=Medusa.load(tmp_path / "b"))
    medusa_fixture(tmp_path / "c", vocab=80)
    with pytest.raises(ValueError, match="vocabulary 80.*vocabulary 64"):
        Medusa.load(tmp_path / "c").check(target)
    (tmp_path / "d").mkdir()
    (tmp_path / "d" / "medusa_lm_head.pt").write_bytes(b"not read")
    with pytest.raises(ValueError, match="allow_pickle=True"):
        Medusa.load(tmp_path / "d" / "medusa_lm_head.pt")
    with pytest.raises(FileNotFoundError, match="no head checkpoint"):
        Medusa.load(tmp_path / "nowhere")


def test_medusa_tree_is_the_greedy_best_subtree():
    acc = ((0.6, 0.2, 0.1), (0.4, 0.1, 0.05), (0.3, 0.1, 0.05))
    parents, rank = medusa_tree(acc, 6)
    # values: (0)=.6 (0,0)=.24 (1)=.2 (2)=.1 (1,0)=.08 | (0,0,0)=.072 (0,1)=.06 ...
    assert parents.tolist() == [-1, 0, 0, 0, 1, 2]
    assert rank.tolist() == [-1, 0, 1, 2, 0, 0]


# ---- EAGLE -------------------------------------------------------------------------------------

HF = {"hidden_size": E, "intermediate_size": 48, "num_attention_heads": 4, "num_key_value_heads": 2,
      "vocab_size": V, "rms_norm_eps": 1e-6, "rope_theta": 10000.0, "num_hidden_layers": 1}


def eagle_fixture(folder, version, drop=(), hidden=E):
    rng = np.random.default_rng(version)
    pre = "layers.0." if version == 1 else "midlayer."
    width = hidden if version == 1 else 2 * hidden
    sd = {f"{pre}self_attn.q_proj.weight": rand(rng, hidden, width),
          f"{pre}self_attn.k_proj.weight": rand(rng, hidden // 2, width),
          f"{pre}self_attn.v_proj.weight": rand(rng, hidden // 2, width),
          f"{pre}self_attn.o_proj.weight": rand(rng, hidden, hidden),
          f"{pre}mlp.gate_proj.weight": rand(rng, 48, hidden), f"{pre}mlp.up_proj.weight": rand(rng, 48, hidden),
          f"{pre}mlp.down_proj.weight": rand(rng, hidden, 48),
          f"{pre}post_attention_layernorm.weight": 1 + rand(rng, hidden)}
    hf = dict(HF, hidden_size=hidden)
    if version == 1:
        sd.update({"fc.weight": rand(rng, hidden, 2 * hidden), "fc.bias": rand(rng, hidden),
                   "embed_tokens.weight": rand(rng, V, hidden, scale=1.0)})
    else:
        vd = 40  # a smaller draft vocabulary, mapped to target ids by d2t offsets
        d2t_ids = np.sort(rng.choice(V, vd, replace=False))
        sd.update({"fc.weight": rand(rng, hidden, 3 * hidden), f"{pre}input_layernorm.weight": 1 + rand(rng, hidden),
                   f"{pre}hidden_norm.weight": 1 + rand(rng, hidden), "norm.weight": 1 + rand(rng, hidden),
                   "lm_head.weight": rand(rng, vd, hidden), "d2t": (d2t_ids - np.arange(vd)).astype(np.int64),
                   "t2d": np.isin(np.arange(V), d2t_ids)})
        hf["draft_vocab_size"] = vd
    for k in drop:
        del sd[k]
    folder.mkdir(parents=True, exist_ok=True)
    save_file(sd, str(folder / "model.safetensors"))
    (folder / "config.json").write_text(json.dumps(hf))
    return sd


def eagle1_reference(sd, emb, feat):
    """EAGLE-1 on a sequence (no cache): fc(concat(e, f)) + b, layer 0 with no input norm."""
    x = np.concatenate([emb, feat], -1) @ sd["fc.weight"].T + sd["fc.bias"]
    h = x + llama_attention(x, sd, "layers.0.", 4, 2, 8)
    return h + llama_mlp(rms(h, sd["layers.0.post_attention_layernorm.weight"]), sd, "layers.0.")


def eagle3_reference(sd, emb, layers):
    """EAGLE-3 on a sequence: g = fc(low|mid|high); attention over
    concat(input_norm(e), hidden_norm(g)); residual g; MLP; own norm + LM head; d2t offsets."""
    p = "midlayer."
    g = np.concatenate(layers, -1) @ sd["fc.weight"].T
    x = np.concatenate([rms(emb, sd[f"{p}input_layernorm.weight"]), rms(g, sd[f"{p}hidden_norm.weight"])], -1)
    h = g + llama_attention(x, sd, p, 4, 2, 8)
    h = h + llama_mlp(rms(h, sd[f"{p}post_attention_layernorm.weight"]), sd, p)
    draft_logits = rms(h, sd["norm.weight"]) @ sd["lm_head.weight"].T
    full = np.full((len(h), V), -np.inf)
    full[:, np.arange(len(sd["d2t"])) + sd["d2t"]] = draft_logits
    return h, full


def _causal(t):
    return jnp.broadcast_to(jnp.tril(jnp.ones((t, t), bool)), (1, t, t))


def test_eagle1_published_layout_matches_the_paper(tmp_path, target):
    sd = eagle_fixture(tmp_path, 1)
    drafter = Eagle.load(tmp_path, target=target)
    cfg, params = drafter.config, drafter.params
    assert cfg.version == 1 and "embed" in params
    rng = np.random.default_rng(3)
    tokens, feat = rng.integers(0, V, 7), rng.standard_normal((7, E)).astype(np.float32)
    want = eagle1_reference(sd, sd["embed_tokens.weight"][tokens], feat)
    emb = eh.embed(params, None, jnp.asarray(tokens)[None])
    cache = eh.init_cache(cfg, 1, 16)
    got, _, _ = eh.step(cfg, params, emb, jnp.asarray(feat)[None], jnp.arange(7)[None], cache, _causal(7))
    np.testing.assert_allclose(np.asarray(got[0]), want, rtol=2e-4, atol=2e-4)
    unrolled = eh.unroll(cfg, params, emb, jnp.asarray(feat)[None], 1)[0]  # the training path
    np.testing.assert_allclose(np.asarray(unrolled[0]), want, rtol=2e-4, atol=2e-4)
    head = np.asarray(target.params["lm_head"])  # the target's LM head
    np.testing.assert_allclose(np.asarray(eh.logits(cfg, params, got, jnp.asarray(head))[0]), want @ head,
                               rtol=2e-4, atol=2e-4)


def test_eagle3_published_layout_matches_the_paper(tmp_path, target):
    sd = eagle_fixture(tmp_path, 3)
    with pytest.raises(ValueError, match="target_layers"):
        Eagle.load(tmp_path)
    drafter = Eagle.load(tmp_path, target_layers=(0, 1, 3))
    cfg, params = drafter.config, drafter.params
    assert cfg.version == 3 and cfg.draft_vocab_size == 40 and drafter.target_layers == (0, 1, 3)
    rng = np.random.default_rng(4)
    tokens = rng.integers(0, V, 6)
    layers = [rng.standard_normal((6, E)).astype(np.float32) for _ in range(3)]
    embed = np.asarray(target.params["embed"])
    h_want, logits_want = eagle3_reference(sd, embed[tokens], layers)
    feat = eh.target_feature(cfg, params, None, jnp.asarray(np.stack(layers))[:, None])
    emb = eh.embed(params, jnp.asarray(embed), jnp.asarray(tokens)[None])
    h, _, _ = eh.step(cfg, params, emb, feat, jnp.arange(6)[None], eh.init_cache(cfg, 1, 8), _causal(6))
    np.testing.assert_allclose(np.asarray(h[0]), h_want, rtol=2e-4, atol=2e-4)
    logits = np.asarray(eh.logits(cfg, params, h)[0])
    mapped = np.isfinite(logits_want)
    np.testing.assert_allclose(logits[mapped], logits_want[mapped], rtol=2e-4, atol=2e-4)
    assert np.all(logits[~mapped] < -1e29)  # target ids outside the draft vocabulary: never drafted


def test_eagle_bad_checkpoints_fail_clearly(tmp_path, target):
    eagle_fixture(tmp_path / "a", 1, drop=("fc.bias", "layers.0.mlp.up_proj.weight"))
    with pytest.raises(KeyError, match=r"missing key\(s\): layers\.0\.mlp\.up_proj\.weight.*fc\.bias"):
        Eagle.load(tmp_path / "a")
    eagle_fixture(tmp_path / "b", 1, hidden=48)
    with pytest.raises(ValueError, match="hidden size 48.*hidden size 32"):
        Eagle.load(tmp_path / "b", target=target)
    eagle_fixture(tmp_path / "c", 3, drop=("midlayer.hidden_norm.weight",))
    with pytest.raises(KeyError, match="midlayer.hidden_norm.weight"):
        Eagle.load(tmp_path / "c", target_layers=(0, 1, 2))
    shutil.move(tmp_path / "b" / "model.safetensors", tmp_path / "b" / "pytorch_model.bin")
    with pytest.raises((ValueError, FileNotFoundError), match="allow_pickle|no head checkpoint"):
        Eagle.load(tmp_path / "b")
    cfg = eh.EagleConfig.for_target(_config(), 3, (0, 1, 7))
    with pytest.raises(ValueError, match="out of range for a 4-layer target"):
        Eagle(eh.init(cfg, jax.random.key(0)), cfg).check(target)
    with pytest.raises(ValueError, match="total_tokens"):
        Eagle(eh.init(cfg, jax.random.key(0)), cfg, top_k=2, depth=2, total_tokens=10)


def test_eagle_bad_tree_settings_fail_clearly(target):
    cfg = eh.EagleConfig.for_target(target.config, 1)
    params = eh.init(cfg, jax.random.key(0), target.params)
    with pytest.raises(ValueError, match=r"unknown EAGLE tree 'beam'; choose from \('topk', 'dyspec'\)"):
        Eagle(params, cfg, tree="beam")
    with pytest.raises(ValueError, match=r"depth=4 must be in \[1, total_tokens - 1 = 3\]"):
        Eagle(params, cfg, tree="dyspec", depth=4, total_tokens=4)
    with pytest.raises(ValueError, match="tree='dyspec' needs min_prob=0"):
        Eagle(params, cfg, tree="dyspec", min_prob=0.1)
    d = Eagle(params, cfg, tree="dyspec", depth=3, total_tokens=8)  # topk's candidate bound does not apply
    assert d.widths == (3, 2, 2) and d.num_nodes == 8 and d.max_depth == 3


def test_a_gated_head_loads_as_dyspec(target, tmp_path):
    """A head saved with a confidence-gated top-k tree (min_prob > 0, as SmolLM2's ships) loads
    with tree="dyspec": the stored gate does not carry over to DySpec, which keeps every node; a
    min_prob the caller passes with it is still refused."""
    cfg = eh.EagleConfig.for_target(target.config, 1)
    Eagle(eh.init(cfg, jax.random.key(0), target.params), cfg, top_k=2, depth=3, total_tokens=4,
          min_prob=0.1, verify_sizes=(1, 2)).save(tmp_path)
    assert Eagle.load(tmp_path).min_prob == 0.1
    d = Eagle.load(tmp_path, tree="dyspec")
    assert d.tree == "dyspec" and d.min_prob == 0.0 and d.verify_sizes == (1, 2)
    with pytest.raises(ValueError, match="tree='dyspec' needs min_prob=0"):
        Eagle.load(tmp_path, tree="dyspec", min_prob=0.1)


# ---- greedy equality in the engine, and the specjax format ---------------------------------------

def reduced_eagle3(target, d2t, key, **settings):
    """An EAGLE-3 head drafting over the target ids `d2t` only (SmolLM2's shipped head's layout)."""
    cfg = dataclasses.replace(eh.EagleConfig.for_target(target.config, 3, (0, 1, target.config.num_layers - 1)),
                              draft_vocab_size=len(d2t))
    params = eh.init(cfg, key, target.params, d2t=d2t)
    return Eagle({**params, "d2t": jnp.asarray(d2t, jnp.int32)}, cfg, **settings)


@pytest.mark.parametrize("tied", [False, True])
def test_eagle3_head_starts_from_a_quantized_targets_lm_head(tied):
    """A GGUF's target carries its LM head quantized (a tied one as a quantized copy): the draft's
    reduced LM head starts from those columns, dequantized."""
    float_target = sj.Model.init(dataclasses.replace(_config(), tie_word_embeddings=tied), jax.random.key(0))
    target = sj.quantize(float_target, "int8")
    assert isinstance(target.params["lm_head"], QuantizedWeight)
    d2t = np.array([3, 0, 17, 63, 40])
    cfg = dataclasses.replace(eh.EagleConfig.for_target(target.config, 3), draft_vocab_size=len(d2t))
    head = eh.init(cfg, jax.random.key(0), target.params, d2t=d2t)["lm_head"]
    assert head.dtype == jnp.float32
    np.testing.assert_array_equal(head, np.asarray(dequantize(target.params["lm_head"]))[:, d2t])
    float_head = float_target.params["embed"].T if tied else float_target.params["lm_head"]
    np.testing.assert_allclose(head, np.asarray(float_head)[:, d2t], atol=0.02)  # int8's rounding


def head_drafters(target):
    c = target.config
    mp = mh.init(jax.random.key(1), 3, E, V, own_lm_head=False)
    mp["w1"] = 0.1 * jax.random.normal(jax.random.key(2), mp["w1"].shape)
    e1, e3 = eh.EagleConfig.for_target(c, 1), eh.EagleConfig.for_target(c, 3, (0, 1, 3))
    eagle = Eagle(eh.init(e1, jax.random.key(3), target.params), e1, top_k=3, depth=3, total_tokens=8)
    return {"medusa": Medusa(mp, tree_size=8), "eagle": eagle,
            "eagle-confident": dataclasses.replace(eagle, min_prob=0.02, verify_sizes=(1, 4)),
            "eagle3": Eagle(eh.init(e3, jax.random.key(4), target.params), e3, top_k=2, depth=3, total_tokens=7),
            "eagle-dyspec": dataclasses.replace(eagle, tree="dyspec"),
            "eagle3-dyspec": reduced_eagle3(target, np.arange(0, V, 2)[::-1], jax.random.key(4), tree="dyspec",
                                            depth=3, total_tokens=7)}


def check_saved_head_is_lossless(target, drafter, folder):
    """The specjax head format round-trips, and greedy decoding with the loaded head equals
    plain autoregressive decoding token for token (batch 1 and a ragged batch of 4)."""
    drafter.save(folder)
    loaded = type(drafter).load(folder)
    assert jax.tree.structure(loaded) == jax.tree.structure(drafter)
    for a, b in zip(jax.tree.leaves(loaded), jax.tree.leaves(drafter)):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    for prompts in (RAGGED[:1], RAGGED):
        want = sj.generate(target, prompts, max_new_tokens=16)
        got = sj.generate(target, prompts, max_new_tokens=16, drafter=loaded)
        np.testing.assert_array_equal(got.tokens, want.tokens, err_msg=drafter.name)
        assert got.stats.target_calls <= want.stats.target_calls
    return loaded


@pytest.mark.parametrize("name", ["medusa", "eagle", "eagle-confident", "eagle3", "eagle-dyspec", "eagle3-dyspec"])
def test_greedy_equals_autoregressive(name, target, tmp_path):
    loaded = check_saved_head_is_lossless(target, head_drafters(target)[name], tmp_path)
    if isinstance(loaded, Eagle):
        assert loaded.tree == ("dyspec" if name.endswith("dyspec") else "topk")  # saved in head.json
    if name == "medusa":  # sampling: exact TopK by default, Medusa's typical acceptance on request
        assert loaded.default_verifier(sj.sampling.SamplingParams(0.8)) == sj.verify.TopK()
        out = sj.generate(target, RAGGED[:1], max_new_tokens=8, drafter=loaded, temperature=0.8,
                          verifier=sj.verify.Typical())
        assert out.num_tokens[0] == 8 and out.stats.verifier == "Typical"


def test_eagle3_drafting_with_int8_weights_is_lossless(target, tmp_path):
    """A head folder whose head.json says weights "int8" drafts with its matmuls quantized (fc,
    the layer's projections, its LM head; norms and d2t float), near the float head's logits,
    and greedy decoding still equals AR token for token; weights="float" overrides the folder,
    and a quantized head refuses to be saved (the folder stores the float weights)."""
    head = reduced_eagle3(target, np.arange(0, V, 2)[::-1], jax.random.key(4), top_k=2, depth=3, total_tokens=7)
    head.save(tmp_path)
    meta = json.loads((tmp_path / "head.json").read_text())
    (tmp_path / "head.json").write_text(json.dumps({**meta, "weights": "int8"}))
    quantized = Eagle.load(tmp_path, target=target)
    p = quantized.params
    for w in (p["fc_w"], p["lm_head"], *(p["layer"][n] for n in ("wq", "wk", "wv", "wo", "w_gate", "w_up", "w_down"))):
        assert isinstance(w, QuantizedWeight) and w.bits == 8
    assert not isinstance(p["norm"], QuantizedWeight) and p["d2t"].dtype == jnp.int32
    assert not isinstance(Eagle.load(tmp_path, weights="float").params["lm_head"], QuantizedWeight)

    out = target(jnp.asarray([RAGGED[0]]), return_layers=head.target_layers)
    h = jax.random.normal(jax.random.key(5), (1, 3, E))
    want, got = (np.asarray(eh.logits(d.config, d.params, h))[..., np.arange(0, V, 2)] for d in (head, quantized))
    assert np.abs(got - want).max() < 0.02 * np.abs(want).max()  # int8's rounding, not another function
    feats = [eh.target_feature(d.config, d.params, out.hidden, out.layer_hidden) for d in (head, quantized)]
    np.testing.assert_allclose(feats[1], feats[0], atol=0.02 * float(jnp.abs(feats[0]).max()))

    for prompts in (RAGGED[:1], RAGGED):
        ar = sj.generate(target, prompts, max_new_tokens=16)
        spec = sj.generate(target, prompts, max_new_tokens=16, drafter=quantized)
        np.testing.assert_array_equal(spec.tokens, ar.tokens)
    with pytest.raises(ValueError, match="quantized"):
        quantized.save(tmp_path / "again")
    with pytest.raises(ValueError, match="int8, int4"):
        Eagle.load(tmp_path, weights="int3")


def test_eagle_drafts_what_its_head_predicts(target):
    """The catch-up bookkeeping: after the prefill, the first-level draft is the head's argmax at
    the root, computed here in one causal pass over the prompt's target features."""
    drafter = head_drafters(target)["eagle"]
    prompt = jnp.asarray([RAGGED[0]])
    out = target(prompt)
    feat = eh.target_feature(drafter.config, drafter.params, out.hidden, None)
    emb = eh.embed(drafter.params, target.params["embed"], prompt[:, 1:])
    h = eh.unroll(drafter.config, drafter.params, emb, feat[:, :-1], 1)[0]
    head = target.params["embed"].T if target.config.tie_word_embeddings else target.params["lm_head"]
    want = int(jnp.argmax(eh.logits(drafter.config, drafter.params, h[:, -1], head)))
    pre = target(prompt[:, :-1], compute_logits=False)
    length = jnp.asarray([prompt.shape[1]])
    from specjax.drafters.base import Context
    from specjax.sampling import SamplingParams
    tokens = jnp.zeros((1, 32), jnp.int32).at[:, : prompt.shape[1]].set(prompt)

    @jax.jit  # one compilation per drafter setting instead of many eager ops
    def first_tree(drafter, pre, tokens, length):
        state = drafter.init(target, prompt, length, 32, pre)
        return drafter.propose(state, Context(tokens, length, SamplingParams(), target), jax.random.key(0))[0]

    tree = first_tree(drafter, pre, tokens, length)
    assert int(tree.tokens[0, 1]) == want and int(tree.parents[0, 1]) == 0
    assert bool(tree.valid.all())  # min_prob = 0: every node is kept

    # with min_prob, the nodes of path probability below it are dropped, the kept ones first
    valid = np.asarray(first_tree(dataclasses.replace(drafter, min_prob=0.05), pre, tokens, length).valid[0])
    kept = int(valid.sum())
    assert 1 <= kept < len(valid) and valid[:kept].all(), valid


# ---- sampling with EAGLE's DySpec tree ---------------------------------------------------------

def sharp_eagle(target, version, **settings):
    """A random head for the tests' sharp 6-token target: EAGLE-1, or EAGLE-3 drafting over
    4 of its 6 tokens (q is zero on tokens 1 and 4, which only the residual can emit)."""
    if version == 3:
        return reduced_eagle3(target, [5, 0, 3, 2], jax.random.key(6), tree="dyspec", **settings)
    cfg = eh.EagleConfig.for_target(target.config, 1)
    return Eagle(eh.init(cfg, jax.random.key(5), target.params, std=0.3), cfg, tree="dyspec", **settings)


# the child-scored control below fails at p ~ 6e-13 on 24k samples but only ~2e-5 on 12k: EAGLE's
# DySpec law is tested on 24k (4 calls of 6000), not the shared 6000
DYSPEC_SAMPLES = dict(samples=24_000, calls=4)


@pytest.mark.parametrize("version", [1, 3])
def test_dyspec_tree_keeps_the_autoregressive_law(version):
    """tree='dyspec' drafts children without replacement from the head's processed
    distribution, and RSD (the default when sampling) keeps the target's law of the first two
    tokens (tests/exactness.py, as for DraftModel's dyspec mode)."""
    from tests.exactness import chi_square_pvalue, exact_joint, sampled_joint, sharp_model

    target = sharp_model(3)
    drafter = sharp_eagle(target, version, depth=2, total_tokens=5)
    params = sj.sampling.SamplingParams(temperature=0.9, top_p=0.95)
    assert drafter.default_verifier(params) == sj.verify.RSD()
    counts = sampled_joint(target, drafter, None, params, **DYSPEC_SAMPLES)
    pvalue = chi_square_pvalue(counts, exact_joint(target, params))
    print(f"EAGLE-{version} dyspec/RSD p-value {pvalue:.3g}")
    assert pvalue > 1e-4, pvalue


@pytest.mark.parametrize("wrong", ["child-scored slots", "SpecInfer"])
def test_a_wrong_eagle_dyspec_is_detected(wrong, monkeypatch):
    """Negative controls, each must fail the test above: scoring a sampled slot by its own
    child's draft probability (EAGLE-2's key lets a child's token decide where it is drafted),
    or SpecInfer's rule (for i.i.d. children) on children drawn without replacement."""
    from specjax.tree import growth
    from tests.exactness import chi_square_pvalue, exact_joint, sampled_joint, sharp_model

    target = sharp_model(3)
    params = sj.sampling.SamplingParams(temperature=1.0)
    if wrong == "SpecInfer":  # p < 1e-300 on the shared 6000 samples
        drafter, verifier, samples = sharp_eagle(target, 1, depth=2, total_tokens=5), sj.verify.SpecInfer(), {}
    else:
        monkeypatch.setattr(growth, "_slot_gain", lambda child_q, greedy: child_q)
        jax.clear_caches()  # programs are traced with the wrong score here, and only here
        drafter, verifier = sharp_eagle(target, 1, depth=1, total_tokens=4), sj.verify.RSD()
        samples = DYSPEC_SAMPLES
    counts = sampled_joint(target, drafter, verifier, params, **samples)
    jax.clear_caches()
    pvalue = chi_square_pvalue(counts, exact_joint(target, params))
    print(f"EAGLE-1 dyspec, {wrong}: p-value {pvalue:.3g}")
    assert pvalue < 1e-6, pvalue


# ---- training ----------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def corpus(code_corpus):
    return code_corpus


HEAD_SETTINGS = {"medusa": {"num_heads": 2, "own_lm_head": True, "tree_size": 6},
                 "eagle": {"target_layers": [0, 1, 3], "top_k": 2, "depth": 3, "total_tokens": 6},
                 "clover": {"num_heads": 2, "tree_size": 6}, "ppd": {"tree_size": 6},
                 "hidden-transfer": {"tree_size": 6}}


def head_config(root, objective, steps):
    from specjax.train.run_config import from_dict

    return from_dict({
        "model": {"model_type": "llama", "vocab_size": 300, "hidden_size": 32, "intermediate_size": 64,
                  "num_layers": 4, "num_heads": 2, "num_kv_heads": 1, "head_dim": 16,
                  "max_position_embeddings": 64, "tie_word_embeddings": True},
        "data": {"tokenizer": str(root / "tok"), "cache_dir": str(root / "cache"), "corpus": str(root / "src"),
                 "held_out": ["m3.py"], "seq_len": 16},
        "optim": {"lr": 1e-2, "warmup_steps": 2, "weight_decay": 0.0},
        "train": {"out": str(root / f"run-{objective}"), "batch_size": 4, "log_every": 1,
                  "eval_every": 1000, "save_every": 1000, "steps": steps, "objective": objective},
        "heads": {"target": "random", **HEAD_SETTINGS[objective.rstrip("123")],
                  **({"ttt_steps": 3} if objective == "eagle3" else {})},
    })


@pytest.mark.parametrize("objective", ["medusa1", "medusa2", "eagle", "eagle3"])
def test_training_lowers_the_loss_and_raises_accuracy(corpus, objective):
    from specjax.train.token_windows import eval_windows, load_streams
    from specjax.train.export import export
    from specjax.train.loop import train
    from specjax.train.loop import held_out, score_function
    from specjax.train.objectives import make_objective
    from specjax.train.target import load_target

    cfg = head_config(corpus, objective, steps=30)
    obj, target = make_objective(cfg), load_target(cfg)
    _, val = load_streams(cfg.data)
    before = held_out(score_function(obj, 0), obj.init(jax.random.PRNGKey(0), target), eval_windows(val, 17, 16), 4,
                      target)
    result = train(cfg, progress=False)
    records = [json.loads(line) for line in (corpus / f"run-{objective}" / "metrics.jsonl").read_text().splitlines()]
    # EAGLE's CE to the target's distribution is bounded below by its entropy: track the KL.
    metric = "loss" if objective.startswith("medusa") else "step0_kl"
    first = next(r[metric] for r in records if r["split"] == "train")
    assert result["train"][metric] < 0.7 * first, (first, result["train"])
    after = result["val"]  # the loop's held-out eval carries the per-head accuracies
    heads = 2 if objective.startswith("medusa") else cfg.heads.ttt_steps
    assert len(after["top1"]) == len(after["top5"]) == heads
    assert after["top5"][0] > before["top5"][0] + 0.1, (before, after)
    assert all(a >= b for a, b in zip(after["top5"], after["top1"]))
    export(cfg, corpus / f"export-{objective}")
    loaded = (Medusa if objective.startswith("medusa") else Eagle).load(corpus / f"export-{objective}")
    if objective.startswith("medusa"):
        assert len(loaded.accuracy) == 2 and loaded.tree_size == 6  # measured, for the tree
    else:
        assert loaded.config.version == (3 if objective == "eagle3" else 1)


@pytest.mark.parametrize("objective", ["eagle", "eagle3"])
def test_eagle_objectives_take_cached_target_features(corpus, objective):
    """A batch carrying the target's features and logits (computed once, e.g. offline) gives
    the loss of the plain token batch; the key only drives EAGLE-1's feature noise."""
    from specjax.train.objectives import make_objective
    from specjax.train.objectives import eagle as eagle_objective
    from specjax.train.target import load_target

    cfg = head_config(corpus, objective, steps=1)
    obj, target = make_objective(cfg), load_target(cfg)
    tokens = jax.random.randint(jax.random.key(1), (2, 12), 0, cfg.model.vocab_size)
    params = obj.init(jax.random.key(0), target)
    head = eagle_objective.head_config(cfg.heads, 1 if objective == "eagle" else 3, target)
    cached = {"tokens": tokens, **eagle_objective.target_pass(head, target, tokens)}
    loss = lambda batch, seed: float(obj.loss(params, batch, jax.random.key(seed), target)[0])
    np.testing.assert_allclose(loss(cached, 0), loss({"tokens": tokens}, 0), rtol=1e-6)
    assert (loss(cached, 0) != loss(cached, 1)) == (objective == "eagle")


@pytest.mark.parametrize("name", ["medusa", "eagle", "clover", "ppd", "hidden-transfer"])
def test_shipped_heads_speed_up_the_shipped_target(name):
    from specjax.convert.model_paths import ASSETS
    from specjax import methods

    if not (ASSETS / "tiny" / "config.json").is_file() or not (ASSETS / f"tiny-{name}" / "head.json").is_file():
        pytest.skip("the shipped tiny target or heads are not built")
    tiny = sj.load("tiny")
    prompts = [[int(t) for t in row] for row in np.random.default_rng(0).integers(2, 4096, (2, 12))]
    prompts = [RAGGED[0] + prompts[0], prompts[1][:5]]
    want = sj.generate(tiny, prompts, max_new_tokens=24)
    got = sj.generate(tiny, prompts, max_new_tokens=24, drafter=methods.make(name, tiny))
    np.testing.assert_array_equal(got.tokens, want.tokens)
    assert got.stats.tau > 1.2, got.stats  # drafts are accepted (PPD, the weakest, reaches 1.26)


def test_shipped_eagle_head_drafts_dyspec_trees():
    """The shipped tiny head growing DySpec's tree (the named eagle's 8 nodes, in 4 rounds):
    AR's tokens at temperature 0 (batch 1 and a ragged batch), drafts accepted; RSD when
    sampling."""
    from specjax.convert.model_paths import ASSETS

    if not (ASSETS / "tiny" / "config.json").is_file() or not (ASSETS / "tiny-eagle" / "head.json").is_file():
        pytest.skip("the shipped tiny target or heads are not built")
    tiny = sj.load("tiny")
    drafter = Eagle.load("tiny", target=tiny, tree="dyspec", depth=4, total_tokens=8)
    assert drafter.widths == (2, 2, 2, 1)
    prompts = [[int(t) for t in row] for row in np.random.default_rng(0).integers(2, 4096, (2, 12))]
    prompts = [RAGGED[0] + prompts[0], prompts[1][:5]]
    for batch in (prompts[:1], prompts):
        want = sj.generate(tiny, batch, max_new_tokens=24)
        got = sj.generate(tiny, batch, max_new_tokens=24, drafter=drafter)
        np.testing.assert_array_equal(got.tokens, want.tokens)
        assert got.stats.tau > 1.2, got.stats
    out = sj.generate(tiny, prompts, max_new_tokens=8, drafter=drafter, temperature=0.7, key=jax.random.key(0))
    assert out.stats.verifier == "RSD" and (out.num_tokens == 8).all()


def test_a_head_folder_not_built_yet_does_not_hide_the_built_ones(tmp_path, monkeypatch):
    """An asset folder without its head.json (a partial checkout, a build under way) sorted
    before tiny's: the head shipped for tiny is still found."""
    from specjax.convert import heads as ckpt

    (tmp_path / "tiny-eagle").symlink_to(ckpt.shipped_heads("eagle")["tiny"])
    (tmp_path / "aaa-eagle").mkdir()
    monkeypatch.setattr(ckpt, "ASSETS", tmp_path)
    assert ckpt.shipped_target(sj.load("tiny").config, "eagle") == "tiny"


def test_shipped_heads_are_found_by_the_target_they_were_trained_for(target, tmp_path):
    """A head records its target's shape; the named eagle takes the head shipped for that shape
    (tiny's for tiny) and names the shape when none is shipped; a saved head keeps the record."""
    from specjax.convert import heads as ckpt
    from specjax import methods

    tiny = sj.load("tiny")
    assert ckpt.shipped_target(tiny.config, "eagle") == "tiny"
    assert methods.make("eagle", tiny).config.hidden_size == tiny.config.hidden_size
    with pytest.raises(ValueError, match="no eagle head is shipped for this target.*'hidden_size': 32"):
        methods.make("eagle", target)
    with pytest.raises(FileNotFoundError, match=r"shipped eagle heads: \[.*'tiny'"):
        Eagle.load("no-such-target")
    head_drafters(target)["eagle3"].save(tmp_path, target)
    assert json.loads((tmp_path / "head.json").read_text())["target"] == ckpt.target_signature(target.config)


def test_a_head_stored_in_bfloat16_loads_as_float32(tmp_path):
    """Shipped heads may be stored in bfloat16 (half the bytes); they load cast to float32, the
    values those of the bfloat16 copy."""
    import ml_dtypes

    from specjax.convert import heads as ckpt

    shutil.copytree(ckpt.ASSETS / "tiny-eagle", tmp_path / "head")
    ckpt.cast_head(tmp_path / "head", "bfloat16")
    small, full = Eagle.load(tmp_path / "head"), Eagle.load("tiny")
    for a, b in zip(jax.tree.leaves(small.params), jax.tree.leaves(full.params)):
        assert a.dtype == b.dtype
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b).astype(ml_dtypes.bfloat16).astype(b.dtype))
