"""LLaDA and Dream HF folders load into the one forward: shrunk random checkpoints with the real
tensor names and config keys, against reference forwards written in torch from their public
modeling code (LLaDA's modeling_llada.py, LLaDALlamaBlock; Dream's modeling_dream.py, Qwen2
attention with q/k/v biases), bidirectional, unpadded and with left pads hidden."""

from __future__ import annotations

import dataclasses
import json

import numpy as np
import pytest

import specjax as sj
from specjax.diffusion import key_mask, make_canvas

torch = pytest.importorskip("torch")
F = torch.nn.functional
from safetensors.numpy import load_file  # noqa: E402
from safetensors.torch import save_file  # noqa: E402  (after torch's skip)

V, MASK = 96, 95  # the tokenizer's vocabulary; a mask id inside it (the real ones are far larger)


def _linear(rng, out, inp):
    return torch.randn(out, inp, generator=rng) / inp ** 0.5  # torch Linear layout [out, in]


def _norm(rng, n):
    return 1 + 0.1 * torch.randn(n, generator=rng)


def _write(folder, config: dict, tensors: dict) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps(config))
    save_file({k: v.contiguous() for k, v in tensors.items()}, str(folder / "model.safetensors"))


def _rms(x, w, eps):
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * w


def _rope(x, positions, theta):
    """Rotate-half RoPE of x [B, H, T, D] at positions [B, T] (HF Llama's and LLaDA's layout)."""
    d = x.shape[-1]
    inv_freq = 1.0 / theta ** (torch.arange(0, d, 2, dtype=torch.float32) / d)
    freqs = positions[..., None].float() * inv_freq
    emb = torch.cat([freqs, freqs], -1)[:, None]
    x1, x2 = x[..., : d // 2], x[..., d // 2:]
    return x * emb.cos() + torch.cat([-x2, x1], -1) * emb.sin()


def _attention(x, wq, wk, wv, wo, heads, kv_heads, positions, theta, valid, biases=(None, None, None)):
    """Non-causal SDPA; pad keys get the additive finfo.min bias both models build from
    `attention_mask`. Returns the output projection of the heads."""
    b, t, _ = x.shape
    q, k, v = (F.linear(x, w, bias).view(b, t, n, -1).transpose(1, 2)
               for w, bias, n in zip((wq, wk, wv), biases, (heads, kv_heads, kv_heads)))
    q, k = _rope(q, positions, theta), _rope(k, positions, theta)
    k, v = (a.repeat_interleave(heads // kv_heads, dim=1) for a in (k, v))
    mask = None if valid is None else torch.where(valid[:, None, None, :], 0.0, torch.finfo(torch.float32).min)
    out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=False)
    return F.linear(out.transpose(1, 2).reshape(b, t, -1), wo)


# ---- LLaDA -----------------------------------------------------------------------------------------

def _llada(folder, *, n_kv_heads: int, tied: bool, embedding_size: int, seed: int = 0):
    """A 2-layer LLaDA with LLaDA-8B-Instruct's config keys and tensor names, shrunk."""
    config = {"architectures": ["LLaDAModelLM"], "model_type": "llada", "activation_type": "silu",
              "alibi": False, "block_type": "llama", "block_group_size": 1, "d_model": 64,
              "embedding_size": embedding_size, "vocab_size": V, "eos_token_id": 2, "pad_token_id": 2,
              "include_bias": False, "include_qkv_bias": False, "input_emb_norm": False,
              "layer_norm_type": "rms", "mask_token_id": MASK, "max_sequence_length": 128,
              "mlp_hidden_size": 96, "n_heads": 4, "n_kv_heads": n_kv_heads, "n_layers": 2,
              "rms_norm_eps": 1e-5, "rope": True, "rope_full_precision": True, "rope_theta": 500000.0,
              "scale_logits": False, "weight_tying": tied, "use_cache": False, "torch_dtype": "float32"}
    rng = torch.Generator().manual_seed(seed)
    d, f, kv = 64, 96, n_kv_heads * 16
    w = {"model.transformer.wte.weight": torch.randn(embedding_size, d, generator=rng),
         "model.transformer.ln_f.weight": _norm(rng, d)}
    if not tied:
        w["model.transformer.ff_out.weight"] = _linear(rng, embedding_size, d)
    for i in range(2):
        b = f"model.transformer.blocks.{i}."
        w.update({b + "attn_norm.weight": _norm(rng, d), b + "ff_norm.weight": _norm(rng, d),
                  b + "q_proj.weight": _linear(rng, d, d), b + "k_proj.weight": _linear(rng, kv, d),
                  b + "v_proj.weight": _linear(rng, kv, d), b + "attn_out.weight": _linear(rng, d, d),
                  b + "ff_proj.weight": _linear(rng, f, d), b + "up_proj.weight": _linear(rng, f, d),
                  b + "ff_out.weight": _linear(rng, d, f)})
    _write(folder, config, w)
    return config, w


def _llada_reference(config, w, ids, valid=None):
    """LLaDAModel.forward with LLaDALlamaBlocks: RMSNorm, rotate-half RoPE at arange(T), SDPA
    with is_causal=False, SwiGLU ff_out(silu(ff_proj(x)) * up_proj(x)); logits over all
    embedding_size rows (the head is wte when weight_tying)."""
    eps, theta = config["rms_norm_eps"], config["rope_theta"]
    x = w["model.transformer.wte.weight"][ids]
    positions = torch.arange(ids.shape[1])[None].expand(ids.shape[0], -1)
    for i in range(config["n_layers"]):
        p = {k.removeprefix(f"model.transformer.blocks.{i}."): v for k, v in w.items()}
        h = _rms(x, p["attn_norm.weight"], eps)
        x = x + _attention(h, p["q_proj.weight"], p["k_proj.weight"], p["v_proj.weight"], p["attn_out.weight"],
                           config["n_heads"], config["n_kv_heads"], positions, theta, valid)
        h = _rms(x, p["ff_norm.weight"], eps)
        x = x + F.linear(F.silu(F.linear(h, p["ff_proj.weight"])) * F.linear(h, p["up_proj.weight"]),
                         p["ff_out.weight"])
    x = _rms(x, w["model.transformer.ln_f.weight"], eps)
    head = w["model.transformer.wte.weight" if config["weight_tying"] else "model.transformer.ff_out.weight"]
    return F.linear(x, head)


# ---- Dream -----------------------------------------------------------------------------------------

def _dream(folder, seed: int = 0):
    """A 2-layer Dream (GQA 4/2, q/k/v biases, untied) with Dream-v0-Instruct-7B's config keys."""
    config = {"architectures": ["DreamModel"], "model_type": "Dream", "hidden_act": "silu", "hidden_size": 64,
              "intermediate_size": 96, "num_hidden_layers": 2, "num_attention_heads": 4,
              "num_key_value_heads": 2, "max_position_embeddings": 128, "max_window_layers": 2,
              "rms_norm_eps": 1e-6, "rope_scaling": None, "rope_theta": 1000000.0, "sliding_window": 8,
              "use_sliding_window": False, "tie_word_embeddings": False, "torch_dtype": "float32",
              "vocab_size": V, "mask_token_id": MASK, "pad_token_id": 0, "bos_token_id": 1, "eos_token_id": 2,
              "use_cache": False, "attention_dropout": 0.0}
    rng = torch.Generator().manual_seed(seed)
    d, f, kv = 64, 96, 2 * 16
    w = {"model.embed_tokens.weight": torch.randn(V, d, generator=rng), "model.norm.weight": _norm(rng, d),
         "lm_head.weight": _linear(rng, V, d)}
    for i in range(2):
        b = f"model.layers.{i}."
        w.update({b + "input_layernorm.weight": _norm(rng, d), b + "post_attention_layernorm.weight": _norm(rng, d),
                  b + "self_attn.q_proj.weight": _linear(rng, d, d), b + "self_attn.k_proj.weight": _linear(rng, kv, d),
                  b + "self_attn.v_proj.weight": _linear(rng, kv, d), b + "self_attn.o_proj.weight": _linear(rng, d, d),
                  b + "self_attn.q_proj.bias": 0.1 * torch.randn(d, generator=rng),
                  b + "self_attn.k_proj.bias": 0.1 * torch.randn(kv, generator=rng),
                  b + "self_attn.v_proj.bias": 0.1 * torch.randn(kv, generator=rng),
                  b + "mlp.gate_proj.weight": _linear(rng, f, d), b + "mlp.up_proj.weight": _linear(rng, f, d),
                  b + "mlp.down_proj.weight": _linear(rng, d, f)})
    _write(folder, config, w)
    return config, w


def _dream_reference(config, w, ids, valid=None):
    """DreamModel.forward: Qwen2 layers (q/k/v biases, no o_proj bias), SDPA with
    is_causal=False; positions as Dream's diffusion_generate numbers them with an attention
    mask (cumsum(mask) - 1: the first real token at 0). Logits unshifted (the sampler shifts)."""
    eps, theta = config["rms_norm_eps"], config["rope_theta"]
    x = w["model.embed_tokens.weight"][ids]
    positions = (torch.arange(ids.shape[1])[None].expand(ids.shape[0], -1) if valid is None
                 else (valid.long().cumsum(-1) - 1).clamp(min=0))
    for i in range(config["num_hidden_layers"]):
        p = {k.removeprefix(f"model.layers.{i}."): v for k, v in w.items()}
        h = _rms(x, p["input_layernorm.weight"], eps)
        x = x + _attention(h, *(p[f"self_attn.{n}_proj.weight"] for n in "qkvo"), config["num_attention_heads"],
                           config["num_key_value_heads"], positions, theta, valid,
                           biases=tuple(p[f"self_attn.{n}_proj.bias"] for n in "qkv"))
        h = _rms(x, p["post_attention_layernorm.weight"], eps)
        x = x + F.linear(F.silu(F.linear(h, p["mlp.gate_proj.weight"])) * F.linear(h, p["mlp.up_proj.weight"]),
                         p["mlp.down_proj.weight"])
    return F.linear(_rms(x, w["model.norm.weight"], eps), w["lm_head.weight"])


# ---- logits against the references -----------------------------------------------------------------

CASES = {
    "llada-mha-untied-padded-embedding": (lambda f: _llada(f, n_kv_heads=4, tied=False, embedding_size=128),
                                          _llada_reference),
    "llada-gqa-tied": (lambda f: _llada(f, n_kv_heads=2, tied=True, embedding_size=V), _llada_reference),
    "dream": (_dream, _dream_reference),
}


@pytest.mark.parametrize("case", CASES)
def test_logits_match_the_reference_forward(case, tmp_path):
    build, reference = CASES[case]
    config, w = build(tmp_path)
    model = sj.load(tmp_path)
    assert model.config.bidirectional and model.config.mask_token_id == MASK
    rows = w["model.transformer.wte.weight" if "llada" in case else "model.embed_tokens.weight"].shape[0]
    assert model.config.vocab_size == rows  # the logits span every row of the embedding

    ids = np.random.default_rng(0).integers(0, V, (2, 12))
    ids[:, 6:] = MASK
    got = np.asarray(model(ids).logits)
    with torch.no_grad():
        want = reference(config, w, torch.from_numpy(ids)).numpy()
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)

    # a left-padded batch: pads hidden from every query by key_mask, as the samplers do
    canvas = make_canvas([[5, 6, 7, 8, 9], [10, 11]], gen_length=6, mask_id=MASK, pad_id=0)
    t = canvas.tokens.shape[1]
    got = np.asarray(model(canvas.tokens, tree_mask=key_mask(canvas.valid, t)).logits)
    valid = np.array(canvas.valid)
    with torch.no_grad():
        want = reference(config, w, torch.from_numpy(np.array(canvas.tokens)).long(),
                         torch.from_numpy(valid)).numpy()
    np.testing.assert_allclose(got[valid], want[valid], rtol=1e-4, atol=1e-4)


def test_llada_and_dream_folders_round_trip(tmp_path):
    """sj.save writes each family's own config.json and tensor names, which load back exactly."""
    _llada(tmp_path / "llada", n_kv_heads=2, tied=False, embedding_size=128)
    _dream(tmp_path / "dream")
    for name in ("llada", "dream"):
        model = sj.load(tmp_path / name)
        sj.save(model, tmp_path / f"{name}-again", format="hf")
        written = json.loads((tmp_path / f"{name}-again" / "config.json").read_text())
        original = json.loads((tmp_path / name / "config.json").read_text())
        assert written["model_type"] == original["model_type"]
        assert written["architectures"] == original["architectures"]
        a, b = (load_file(tmp_path / n / "model.safetensors") for n in (name, f"{name}-again"))
        assert sorted(a) == sorted(b)
        for k in a:
            np.testing.assert_array_equal(a[k], b[k], err_msg=k)
        again = sj.load(tmp_path / f"{name}-again")
        assert again.config == model.config


# ---- configs -----------------------------------------------------------------------------------------

LLADA_8B = {"activation_type": "silu", "alibi": False, "architectures": ["LLaDAModelLM"],
            "attention_layer_norm": False, "block_group_size": 1, "block_type": "llama", "d_model": 4096,
            "embedding_size": 126464, "eos_token_id": 126081, "include_bias": False, "include_qkv_bias": False,
            "input_emb_norm": False, "layer_norm_type": "rms", "layer_norm_with_affine": True,
            "mask_token_id": 126336, "max_sequence_length": 4096, "mlp_hidden_size": 12288,
            "model_type": "llada", "multi_query_attention": None, "n_heads": 32, "n_kv_heads": 32, "n_layers": 32,
            "pad_token_id": 126081, "rms_norm_eps": 1e-05, "rope": True, "rope_full_precision": True,
            "rope_theta": 500000.0, "scale_logits": False, "vocab_size": 126464, "weight_tying": False,
            "torch_dtype": "bfloat16"}
DREAM_7B = {"architectures": ["DreamModel"], "model_type": "Dream", "hidden_act": "silu", "hidden_size": 3584,
            "intermediate_size": 18944, "max_position_embeddings": 131072, "max_window_layers": 28,
            "num_attention_heads": 28, "num_hidden_layers": 28, "num_key_value_heads": 4, "rms_norm_eps": 1e-06,
            "rope_scaling": None, "rope_theta": 1000000.0, "sliding_window": 131072, "tie_word_embeddings": False,
            "torch_dtype": "bfloat16", "use_sliding_window": False, "vocab_size": 152064, "mask_token_id": 151666,
            "pad_token_id": 151643, "bos_token_id": 151643, "eos_token_id": 151643}


def test_full_size_configs_read_and_write_back():
    llada = sj.ModelConfig.from_hf(LLADA_8B)
    assert (llada.model_type, llada.hidden_size, llada.num_layers, llada.num_heads, llada.num_kv_heads,
            llada.head_dim, llada.intermediate_size, llada.vocab_size, llada.tie_word_embeddings,
            llada.attention_bias, llada.dtype) == ("llada", 4096, 32, 32, 32, 128, 12288, 126464, False, False,
                                                   "bfloat16")
    assert (llada.mask_token_id, llada.eos_token_id, llada.shift_logits) == (126336, 126081, False)
    dream = sj.ModelConfig.from_hf(DREAM_7B)
    assert (dream.model_type, dream.attention_bias, dream.num_kv_heads, dream.head_dim, dream.sliding_window,
            dream.mask_token_id, dream.shift_logits) == ("dream", True, 4, 128, None, 151666, True)
    for config in (llada, dream):
        assert sj.ModelConfig.from_hf(config.to_hf()) == config
    # the mask ids their configs default to when config.json leaves it out
    assert sj.ModelConfig.from_hf({k: v for k, v in LLADA_8B.items() if k != "mask_token_id"}).mask_token_id == 126336
    assert sj.ModelConfig.from_hf({k: v for k, v in DREAM_7B.items() if k != "mask_token_id"}).mask_token_id == 151666


@pytest.mark.parametrize("change, message", [
    (dict(include_bias=True), r"LLaDA with include_bias=True is not supported: the llama forward runs "
                              r"include_bias=False"),
    (dict(block_type=None), r"LLaDA with block_type='sequential' is not supported: .* \(a key left out takes"),
    (dict(scale_logits=True, attention_layer_norm=True), r"attention_layer_norm=True, scale_logits=True"),
    (dict(architectures=["LLaDAMoEModelLM"], num_experts=64, num_experts_per_tok=8),
     r"LLaDA variant \['LLaDAMoEModelLM'\] with \['num_experts', 'num_experts_per_tok'\] is not supported: "
     r"only the dense LLaDAModelLM"),
    (dict(model_type="lladamoe"), r"unsupported model_type 'lladamoe' .*\(mixture-of-experts dLLMs are not"),
    (dict(model_type="llada2_moe", architectures=["LLaDA2MoeModelLM"]), r"mixture-of-experts dLLMs are not"),
    (dict(embedding_size=1000), r"embedding_size 1000 is below vocab_size 126464"),
])
def test_configs_we_cannot_run_are_refused(change, message):
    with pytest.raises(ValueError, match=message):
        sj.ModelConfig.from_hf({**LLADA_8B, **change})


def test_to_hf_refuses_what_the_family_config_cannot_express():
    llada = sj.ModelConfig.from_hf(LLADA_8B)
    with pytest.raises(ValueError, match="a llada config.json cannot express this config's head_dim, qk_norm"):
        dataclasses.replace(llada, head_dim=64, qk_norm=True).to_hf()
    dream = sj.ModelConfig.from_hf(DREAM_7B)
    with pytest.raises(ValueError, match="cannot express this config's shift_logits"):
        dataclasses.replace(dream, shift_logits=False).to_hf()


# ---- left-to-right decoding refuses a masked-diffusion model --------------------------------------

def test_generate_and_stream_refuse_a_masked_diffusion_model(tmp_path):
    _llada(tmp_path, n_kv_heads=2, tied=True, embedding_size=V)
    model = sj.load(tmp_path)
    with pytest.raises(ValueError, match=r"masked-diffusion LM \(mask_token_id 95\): decode it with specjax.diffusion"):
        sj.generate(model, [[1, 2, 3]], max_new_tokens=4)
    with pytest.raises(ValueError, match="decode it with specjax.diffusion"):
        sj.stream(model, [1, 2, 3], max_new_tokens=4)


def test_cli_generate_decodes_a_masked_diffusion_model_with_a_sampler(tmp_path, capsys):
    import jax

    from specjax.__main__ import main
    from specjax.convert import resolve

    tiny = sj.load("tiny").config
    config = sj.ModelConfig(model_type="llada", vocab_size=tiny.vocab_size, hidden_size=32, intermediate_size=64,
                            num_layers=1, num_heads=2, num_kv_heads=2, head_dim=16, max_position_embeddings=1024,
                            mask_token_id=tiny.vocab_size - 1)
    sj.save(sj.Model.init(config, jax.random.key(0)), tmp_path / "m", format="hf", tokenizer=resolve("tiny"))
    model = ["--model", str(tmp_path / "m"), "--prompt", "x = "]
    assert main(["generate", *model, "--max-new-tokens", "8", "--block", "4", "--sampler", "static"]) == 0
    out, err = capsys.readouterr()
    assert out.startswith("x = ") and "8 forwards" in err and "sampler static" in err
    for bad in (["--drafter", "prompt-lookup"], ["--sampler", "fastest"], ["--sampler", "learn2pd"]):
        assert main(["generate", *model, *bad]) == 2
        out, err = capsys.readouterr()
        assert out == "" and err.count("\n") == 1, bad
    assert main(["generate", "--model", "tiny", "--prompt", "x", "--sampler", "static"]) == 2
    assert "masked-diffusion" in capsys.readouterr().err
