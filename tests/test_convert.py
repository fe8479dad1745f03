"""Conversion round trips, the convert command, and clear errors on bad checkpoints and inputs."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from safetensors.numpy import load_file, save_file

import specjax as sj


def test_hf_roundtrip_is_exact(hf_family, tmp_path):
    for family in ("qwen2-tied", "qwen3-gqa"):
        _, folder = hf_family(family)
        sj.save(sj.load(folder), tmp_path / family, format="hf")
        a = load_file(folder / "model.safetensors")
        b = load_file(tmp_path / family / "model.safetensors")
        assert sorted(a) == sorted(b)
        for k in a:
            np.testing.assert_array_equal(a[k], b[k], err_msg=k)


def test_written_hf_folder_loads_in_transformers(hf_family, tmp_path):
    import torch
    import transformers
    hf, folder = hf_family("mistral-window")
    sj.save(sj.load(folder), tmp_path, format="hf")
    again = transformers.AutoModelForCausalLM.from_pretrained(tmp_path).eval()
    tokens = torch.arange(3, 20)[None]
    with torch.no_grad():
        np.testing.assert_array_equal(again(tokens).logits.numpy(), hf(tokens).logits.numpy())


def test_specjax_checkpoint_roundtrip(hf_family, tmp_path):
    _, folder = hf_family("llama3-gqa-tied-scaled")
    model = sj.load(folder, dtype="bfloat16")
    sj.save(model, tmp_path / "ckpt")
    again = sj.load(tmp_path / "ckpt")
    assert again.config == model.config
    jax.tree.map(np.testing.assert_array_equal, again.params, model.params)


def test_convert_command(hf_family, tmp_path):
    _, folder = hf_family("qwen2-tied")
    r = subprocess.run([sys.executable, "-m", "specjax", "convert", str(folder), str(tmp_path / "o")],
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    assert "qwen2" in r.stdout
    np.testing.assert_array_equal(sj.load(tmp_path / "o").params["embed"], sj.load(folder).params["embed"])


def test_convert_copies_the_tokenizer_and_never_overwrites_silently(tmp_path, capsys):
    from specjax.__main__ import main

    out = tmp_path / "o"
    assert main(["convert", "tiny-draft", str(out), "--format", "hf"]) == 0
    assert "tokenizer copied" in capsys.readouterr().out
    for name in ("tokenizer.json", "tokenizer_config.json"):
        assert (out / name).read_bytes() == (sj.convert.resolve("tiny-draft") / name).read_bytes()
    assert main(["convert", "tiny-draft", str(out)]) == 2  # exists: one line, nothing touched
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"{out} exists; pass --force to replace" in err
    assert not (out / "specjax_config.json").exists()
    assert main(["convert", str(out), str(out), "--force"]) == 0  # in place, tokenizer kept
    assert (out / "specjax_config.json").is_file() and (out / "tokenizer.json").is_file()
    assert not (out / "model.safetensors").exists()
    (tmp_path / "notes").mkdir()
    (tmp_path / "notes" / "a.txt").write_text("mine")
    with pytest.raises(FileExistsError, match="not a model folder"):
        sj.save(sj.load(out), tmp_path / "notes", overwrite=True)
    with pytest.raises(FileExistsError, match="exists; pass overwrite=True"):
        sj.save(sj.load(out), tmp_path / "notes" / "a.txt", format="hf")
    assert (tmp_path / "notes" / "a.txt").read_text() == "mine"


def test_truncated_weights_are_named(hf_family, tmp_path):
    _, folder = hf_family("qwen2-tied")
    d = _copy(folder, tmp_path / "m")
    (d / "model.safetensors").write_bytes((d / "model.safetensors").read_bytes()[:-10])
    with pytest.raises(ValueError, match=r"model.safetensors: not a readable safetensors file"):
        sj.load(d)


def _copy(folder, dst):
    shutil.copytree(folder, dst)
    return dst


def test_unknown_architecture_lists_supported(hf_family, tmp_path):
    _, folder = hf_family("qwen2-tied")
    d = _copy(folder, tmp_path / "m")
    cfg = json.loads((d / "config.json").read_text())
    cfg["model_type"] = "gpt_neox"
    (d / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ValueError, match="gpt_neox.*supported: llama, mistral, qwen2, qwen3"):
        sj.load(d)


@pytest.mark.parametrize("edit, message", [
    (lambda t: t.pop("model.layers.1.mlp.up_proj.weight"), r"missing tensors: \['model.layers.1.mlp.up_proj.weight'\]"),
    (lambda t: t.update({"model.extra.weight": np.zeros(3, np.float32)}), r"unexpected tensors: \['model.extra.weight'\]"),
    (lambda t: t.update({"model.norm.weight": np.zeros(7, np.float32)}), r"model.norm.weight: expected shape \(32,\).*got \(7,\)"),
])
def test_bad_tensors_are_named(hf_family, tmp_path, edit, message):
    _, folder = hf_family("qwen2-tied")
    d = _copy(folder, tmp_path / "m")
    tensors = load_file(d / "model.safetensors")
    edit(tensors)
    save_file(tensors, d / "model.safetensors")
    with pytest.raises(ValueError, match=message):
        sj.load(d)


def test_missing_folder_and_files(tmp_path):
    with pytest.raises(FileNotFoundError, match="no model at"):
        sj.load(tmp_path / "nope")
    with pytest.raises(FileNotFoundError, match="no config.json"):
        sj.load(tmp_path)


@pytest.fixture(scope="module")
def small():
    config = sj.ModelConfig(model_type="llama", vocab_size=50, hidden_size=16, intermediate_size=32,
                            num_layers=1, num_heads=2, num_kv_heads=1, head_dim=8,
                            max_position_embeddings=20)
    return sj.Model.init(config, jax.random.key(0))


@pytest.mark.parametrize("kwargs, message", [
    (dict(prompts=[[1, 2, 3]], max_new_tokens=18), "exceeds the model's max_position_embeddings 20"),
    (dict(prompts=[[1, 50]]), r"outside the vocabulary \[0, 50\): \[50\]"),
    (dict(prompts=[[1, -1]]), "outside the vocabulary"),
    (dict(prompts=[[1], []]), "prompt 1 is empty"),
    (dict(prompts=[[1]], temperature=-0.5), "temperature must be a finite number >= 0"),
    (dict(prompts=[[1]], temperature=1.0, top_p=1.5), r"top_p must be in \(0, 1\]"),
    (dict(prompts=[[1]], temperature=1.0, top_p=0.0), r"top_p must be in \(0, 1\]"),
    (dict(prompts=[[1]], temperature=1.0, top_k=0), "top_k must be an integer >= 1"),
    (dict(prompts=[[1]], max_new_tokens=0), "max_new_tokens must be an integer >= 1"),
])
def test_bad_generate_input(small, kwargs, message):
    with pytest.raises(ValueError, match=message):
        sj.generate(small, **kwargs)


@pytest.mark.parametrize("tokens, message", [
    ([[1, 50]], r"outside the vocabulary \[0, 50\): \[50\]"), ([[-3, 1]], r"outside the vocabulary.*\[-3\]"),
    ([1, 2], r"integer ids \[B, T\]"), ([[0.5]], r"integer ids \[B, T\]"),
    ([[1] * 21], "21 tokens exceed the model's max_position_embeddings 20"),
])
def test_bad_forward_input(small, tokens, message):
    with pytest.raises(ValueError, match=message):
        sj.forward(small, jnp.array(tokens))


def test_forward_checks_only_concrete_tokens(small):
    want = sj.forward(small, [[1, 2, 49]])
    np.testing.assert_allclose(jax.jit(sj.forward)(small, jnp.array([[1, 2, 49]])), want, atol=1e-6)


def test_generate_accepts_arrays_and_single_lists(small):
    a = sj.generate(small, jnp.array([[1, 2, 3]]), max_new_tokens=3).tokens
    b = sj.generate(small, [1, 2, 3], max_new_tokens=3).tokens
    np.testing.assert_array_equal(a, b)
