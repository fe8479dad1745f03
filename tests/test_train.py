"""`specjax.train` on a tiny model and a tiny corpus: learning, exact resume, config errors,
export."""

import json
import os
import signal
from pathlib import Path

import jax
import numpy as np
import pytest

from specjax.train.__main__ import main as cli
from specjax.train.loop import _StopFlag, train
from specjax.train.run_config import from_dict, load_config

@pytest.fixture(scope="module")
def corpus(code_corpus):
    return code_corpus, code_corpus / "tok"


def raw_config(corpus, out, **train):
    root, tok_dir = corpus
    return {
        "model": {"model_type": "llama", "vocab_size": 300, "hidden_size": 32,
                  "intermediate_size": 64, "num_layers": 1, "num_heads": 2, "num_kv_heads": 1,
                  "head_dim": 16, "max_position_embeddings": 64, "tie_word_embeddings": True},
        "data": {"tokenizer": str(tok_dir), "cache_dir": str(root / "cache"),
                 "corpus": str(root / "src"), "held_out": ["m3.py"], "seq_len": 16},
        "optim": {"lr": 1e-2, "warmup_steps": 2},
        "train": {"out": str(out), "batch_size": 4, "log_every": 1, "eval_every": 1000,
                  "save_every": 1000, **train},
    }


def test_training_lowers_the_loss_and_resumes_exactly(corpus, tmp_path):
    straight = train(from_dict(raw_config(corpus, tmp_path / "a", steps=30)), progress=False)
    records = [json.loads(line) for line in (tmp_path / "a" / "metrics.jsonl").read_text().splitlines()]
    first = next(r["loss"] for r in records if r["split"] == "train")
    assert first > 5.0  # ~log(300) at init
    assert straight["val"]["loss"] < first - 2.0
    assert (tmp_path / "a" / "curve.png").stat().st_size > 0

    # Interrupted after 13 steps, then resumed: same data order, same final params.
    cfg = from_dict(raw_config(corpus, tmp_path / "b", steps=30))
    half = train(cfg, progress=False, stop_after=13)
    assert half["step"] == 13
    assert sorted(p.name for p in (tmp_path / "b" / "checkpoints").iterdir()) == ["13"]
    resumed = train(cfg, progress=False, resume=True)
    assert resumed["step"] == 30
    assert resumed["train"]["loss"] == straight["train"]["loss"]
    for a, b in zip(jax.tree.leaves(straight["params"]), jax.tree.leaves(resumed["params"])):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


def test_sigterm_and_sigint_become_a_stop_flag():
    before = signal.getsignal(signal.SIGTERM)
    with _StopFlag() as stop:
        os.kill(os.getpid(), signal.SIGTERM)
        assert stop.signum == signal.SIGTERM
        os.kill(os.getpid(), signal.SIGINT)  # Ctrl-C: no KeyboardInterrupt mid-update
        assert stop.signum == signal.SIGINT
    assert signal.getsignal(signal.SIGTERM) is before


def test_resume_without_checkpoint_is_an_error(corpus, tmp_path):
    with pytest.raises(FileNotFoundError, match="no checkpoint"):
        train(from_dict(raw_config(corpus, tmp_path / "none", steps=2)), resume=True, progress=False)


@pytest.mark.parametrize("mutate, message", [
    (lambda r: r["train"].update(stepz=3), r"unknown key\(s\) in \[train\]: stepz"),
    (lambda r: r.update(optimizer={}), r"unknown config section\(s\): optimizer"),
    (lambda r: r["data"].pop("tokenizer"), r"missing key\(s\) in \[data\]: tokenizer"),
    (lambda r: r["model"].update(model_type="gpt2"), "unsupported model_type"),
])
def test_bad_config_errors(corpus, tmp_path, mutate, message):
    raw = raw_config(corpus, tmp_path, steps=1)
    mutate(raw)
    with pytest.raises(ValueError, match=message):
        from_dict(raw)


def test_bad_paths_and_objective(corpus, tmp_path, capsys):
    with pytest.raises(FileNotFoundError, match="config file not found"):
        load_config(tmp_path / "nope.toml")
    raw = raw_config(corpus, tmp_path / "r", steps=1, objective="medusa9")
    with pytest.raises(ValueError, match="unknown objective 'medusa9'"):
        train(from_dict(raw), progress=False)
    raw = raw_config(corpus, tmp_path / "r", steps=1)
    raw["data"].update(tokenizer=str(tmp_path / "tok"), corpus=str(tmp_path / "missing"))
    with pytest.raises(FileNotFoundError, match="corpus folder not found"):
        train(from_dict(raw), progress=False)
    (tmp_path / "c.toml").write_text("[train]\nout = 'x'\nbogus = 1\n")
    assert cli(["--config", str(tmp_path / "c.toml")]) == 2
    assert "unknown key(s) in [train]: bogus" in capsys.readouterr().err


def test_cli_overrides_export_and_evaluate(corpus, tmp_path, capsys):
    import tomli_w

    raw = raw_config(corpus, tmp_path / "unused", steps=100)
    (tmp_path / "c.toml").write_bytes(tomli_w.dumps(raw).encode())
    out = tmp_path / "run"
    assert cli(["--config", str(tmp_path / "c.toml"), "--steps", "2", "--out", str(out),
                "--set", "optim.lr=3e-3", "--no-progress"]) == 0
    saved = json.loads((out / "config.json").read_text())
    assert saved["train"]["steps"] == 2 and saved["optim"]["lr"] == 3e-3
    assert cli(["export", "--config", str(tmp_path / "c.toml"), "--out", str(out), str(tmp_path / "hf")]) == 0

    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from specjax.models import forward
    from specjax.train.export import load_trained_params

    params, step = load_trained_params(load_config(tmp_path / "c.toml", {"train.out": str(out)}))
    assert step == 2
    tok = AutoTokenizer.from_pretrained(tmp_path / "hf")
    hf = AutoModelForCausalLM.from_pretrained(tmp_path / "hf")
    ids = tok.encode("def f3(x, y=3):\n")
    want = np.asarray(forward(from_dict(raw).model, params, np.array([ids])).logits)
    with torch.no_grad():
        got = hf(torch.tensor([ids])).logits.numpy()
    np.testing.assert_allclose(got, want, atol=2e-4, rtol=1e-3)

    capsys.readouterr()  # evaluation: held-out loss, and greedy samples decoded by sj.generate
    (tmp_path / "e.toml").write_bytes(tomli_w.dumps({**raw, "train": {**raw["train"], "out": str(out)}}).encode())
    assert cli(["evaluate", "--config", str(tmp_path / "e.toml"), "--new-tokens", "4", "--windows", "2"]) == 0
    report = capsys.readouterr().out
    assert f"| {out.name} | " in report and report.count("greedy, 4 new tokens") == 3


def test_steps_below_one_are_one_line_and_exit_2(corpus, tmp_path, capsys):
    import tomli_w

    (tmp_path / "c.toml").write_bytes(tomli_w.dumps(raw_config(corpus, tmp_path / "run")).encode())
    for steps in ("0", "-3"):
        assert cli(["--config", str(tmp_path / "c.toml"), "--steps", steps]) == 2
        err = capsys.readouterr().err
        assert err.startswith(f"error: argument --steps: must be an integer >= 1, got {steps} (")
        assert err.count("\n") == 1
    assert cli(["--config", str(tmp_path / "c.toml"), "--set", "train.steps=0"]) == 2
    assert capsys.readouterr().err == "error: [train] steps must be an integer >= 1, got 0\n"
    assert not (tmp_path / "run").exists()


def test_config_paths_are_relative_to_the_file_and_the_tokenizer_is_built(corpus, tmp_path, monkeypatch, capsys):
    import shutil

    import tomli_w

    repo = Path(__file__).resolve().parents[1]
    monkeypatch.chdir(tmp_path)  # not the repository: the shipped configs still mean repo/runs
    tiny = load_config(repo / "configs" / "tiny.toml")
    assert Path(tiny.data.tokenizer).resolve() == repo / "runs" / "tokenizer"
    assert Path(tiny.train.out).resolve() == repo / "runs" / "tiny" and tiny.data.corpus == "stdlib"

    folder = tmp_path / "exp"
    shutil.copytree(corpus[0] / "src", folder / "src")
    raw = raw_config(corpus, "run", steps=2)
    raw["data"].update(tokenizer="tok", cache_dir="cache", corpus="src")
    (folder / "c.toml").write_bytes(tomli_w.dumps(raw).encode())
    assert cli(["--config", "exp/c.toml", "--no-progress"]) == 0  # no tokenizer yet: trained first
    assert "no tokenizer in" in capsys.readouterr().out
    assert (folder / "tok" / "tokenizer.json").is_file() and (folder / "cache" / "train.npy").is_file()
    assert (folder / "run" / "checkpoints").is_dir() and not (tmp_path / "run").exists()


def test_resume_says_so_and_keeps_the_log_consistent(corpus, tmp_path, capsys):
    import shutil

    cfg = from_dict(raw_config(corpus, tmp_path / "r", steps=30, save_every=5))
    train(cfg, progress=False, stop_after=13)  # checkpoints 10 and 13, metrics of steps 1..13
    shutil.rmtree(tmp_path / "r" / "checkpoints" / "13")  # as if killed between two saves
    train(cfg, progress=False)
    assert "resumed from step 10 of 30" in capsys.readouterr().out
    steps = [json.loads(line)["step"] for line in (tmp_path / "r" / "metrics.jsonl").read_text().splitlines()
             if json.loads(line)["split"] == "train"]
    assert steps == list(range(1, 31))
    assert not (tmp_path / "r" / "metrics.jsonl.tmp").exists()


ASSETS = Path(__file__).resolve().parents[1] / "specjax" / "assets"


@pytest.mark.skipif(not (ASSETS / "tiny-draft" / "model.safetensors").is_file(),
                    reason="shipped tiny models absent (build them with recipes/make_tiny.sh)")
def test_shipped_tiny_models_match_their_configs_and_size_budget():
    from transformers import AutoConfig

    total = sum(f.stat().st_size for name in ("tiny", "tiny-draft") for f in (ASSETS / name).iterdir())
    assert total < 30 * 2**20
    for name in ("tiny", "tiny-draft"):
        hf = AutoConfig.from_pretrained(ASSETS / name)
        model = load_config(Path(__file__).resolve().parents[1] / "configs" / f"{name}.toml").model
        assert (hf.hidden_size, hf.num_hidden_layers, hf.vocab_size) == (
            model.hidden_size, model.num_layers, model.vocab_size)


def _write_config(tmp_path, raw) -> str:
    import tomli_w

    (tmp_path / "c.toml").write_bytes(tomli_w.dumps(raw).encode())
    return str(tmp_path / "c.toml")


@pytest.mark.parametrize("args, message", [
    (["--set", "optim.lr=fast"], "error: [optim] lr must be a number, got 'fast'"),
    (["--set", "optim.lr=-1"], "error: [optim] lr must be a number > 0, got -1"),
    (["--set", "train.batch_size=2.5"], "error: [train] batch_size must be an integer, got 2.5"),
    (["--set", "data.held_out=m3.py"], "error: [data] held_out must be a list of strings, got 'm3.py'"),
    (["--set", "model.eos_token_id=300"], "error: [model] eos_token_id must be a token id in [0, vocab_size = 300)"),
    (["--set", "optimizer.lr=1"], "error: bad override 'optimizer.lr'"),
    (["--set", "lr"], "error: --set expects SECTION.KEY=VALUE, got 'lr'"),
    (["--mesh", "3,1"], "error: train.mesh (--mesh): mesh [3, 1] needs 3 devices; there are 1"),
    (["--mesh", "x"], "error: argument --mesh: expected D,M (two integers), got 'x'"),
    (["--mesh", "0,1"], "error: argument --mesh: D must be >= 1 or -1 and M >= 1, got '0,1'"),
])
def test_bad_values_are_one_line_before_training(corpus, tmp_path, capsys, args, message):
    config = _write_config(tmp_path, raw_config(corpus, tmp_path / "run", steps=2))
    assert cli(["--config", config, *args]) == 2
    err = capsys.readouterr().err
    assert err.startswith(message) and err.count("\n") == 1, err
    assert not (tmp_path / "run").exists()


def test_wrong_types_in_the_config_file_are_one_line(corpus, tmp_path, capsys):
    raw = raw_config(corpus, tmp_path / "run", steps=2)
    raw["optim"]["lr"] = "fast"
    assert cli(["--config", _write_config(tmp_path, raw)]) == 2
    assert capsys.readouterr().err == "error: [optim] lr must be a number, got 'fast'\n"


def test_other_commands_refuse_bad_input_in_one_line(corpus, tmp_path, capsys):
    config = _write_config(tmp_path, raw_config(corpus, tmp_path / "run", steps=2))
    for argv, message in [
        (["export", "--config", config, str(tmp_path / "hf")], "error: no checkpoint to export in "),
        (["evaluate", "--config", str(tmp_path / "none.toml")], "error: config file not found: "),
        (["tokenizer", "--out", str(tmp_path / "t"), "--vocab-size", "10"], "error: argument --vocab-size: must be"),
        (["tokenizer", "--out", str(tmp_path / "t"), "--corpus", str(tmp_path / "none")], "error: corpus folder not found"),
        (["distill", "--model", "tiny", "--out", str(tmp_path / "d"), "--temperatures", "0,-1"],
         "error: argument --temperatures: must be a finite number >= 0, got -1"),
        (["features", "--model", "tiny", "--out", str(tmp_path / "d")], "error: " + str(tmp_path / "d" / "answers")),
        (["bogus"], "error: argument COMMAND: invalid choice: 'bogus'"),
    ]:
        assert cli(argv) == 2, argv
        err = capsys.readouterr().err
        assert err.startswith(message) and err.count("\n") == 1, err


def test_ctrl_c_checkpoints_and_exits_130(corpus, tmp_path):
    import subprocess
    import sys
    import time

    out = tmp_path / "run"
    config = _write_config(tmp_path, raw_config(corpus, out, steps=100000))
    p = subprocess.Popen([sys.executable, "-m", "specjax.train", "--config", config, "--no-progress"],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    metrics = out / "metrics.jsonl"
    while not (metrics.is_file() and metrics.read_text().count("\n") >= 3):
        assert p.poll() is None, p.communicate()
        time.sleep(0.2)
    p.send_signal(signal.SIGINT)
    stdout, stderr = p.communicate(timeout=300)
    assert p.returncode == 130 and "Traceback" not in stderr, stderr
    step = int(stdout.split("stopped by signal 2 at step ")[1].split(";")[0])
    assert [p.name for p in (out / "checkpoints").iterdir()] == [str(step)]


def test_training_without_matplotlib_skips_the_curve(corpus, tmp_path, capsys, monkeypatch):
    import sys

    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import matplotlib raises ImportError
    config = _write_config(tmp_path, raw_config(corpus, tmp_path / "run", steps=2))
    assert cli(["--config", config, "--no-progress"]) == 0
    assert "no curve.png: matplotlib is not installed (pip install 'specjax[train]')\n" in capsys.readouterr().out
    assert not (tmp_path / "run" / "curve.png").exists() and (tmp_path / "run" / "checkpoints" / "2").is_dir()
