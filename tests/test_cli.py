"""`python -m specjax generate` end to end on the shipped model, and its clean failures."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import numpy as np
import pytest
import torch
import transformers

import specjax as sj
from pallas_kernels import ffi
from specjax.__main__ import main
from specjax.convert import resolve


def run(*args, timeout=600, env=None):
    return subprocess.run([sys.executable, "-m", "specjax", *args], capture_output=True, text=True,
                          timeout=timeout, env=env)


def test_shipped_models_match_transformers():
    for name in ("tiny", "tiny-draft"):
        folder = resolve(name)
        hf = transformers.AutoModelForCausalLM.from_pretrained(folder).eval()
        tok = transformers.AutoTokenizer.from_pretrained(folder)
        ids = tok("def parse_args(argv):\n    parser = argparse.", return_tensors="pt").input_ids
        with torch.no_grad():
            ref = hf(ids).logits.numpy()
        np.testing.assert_allclose(sj.forward(sj.load(name), ids.numpy()), ref, atol=1e-4)


def test_generate_command_runs_on_the_shipped_model():
    r = run("generate", "--prompt", "def parse_args(argv):", "--max-new-tokens", "24",
            "--drafter", "prompt-lookup")
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith("def parse_args(argv):") and len(r.stdout) > len("def parse_args(argv):")
    assert "new tokens" in r.stderr and "tau" in r.stderr and "method prompt-lookup" in r.stderr


def test_a_second_run_takes_its_programs_from_the_compile_cache(tmp_path):
    """`generate` keeps its compiled programs in the specjax cache: a second run of the same
    command compiles nothing new (no entry added) and prints the same text."""
    env = {**os.environ, "SPECJAX_CACHE": str(tmp_path), "JAX_ENABLE_COMPILATION_CACHE": "true"}
    if ffi.available():  # the kernels as built for the suite, not built again in this cache
        (tmp_path / "kernels").mkdir()
        shutil.copy(ffi.build(), tmp_path / "kernels")
    args = ["generate", "--prompt", "def f(x):", "--max-new-tokens", "12", "--drafter", "prompt-lookup"]
    first = run(*args, env=env)
    assert first.returncode == 0, first.stderr
    (folder,) = (tmp_path / "xla").iterdir()  # one folder for this jaxlib and CPU
    entries = sorted(p.name for p in folder.iterdir())
    assert len(entries) >= 2, entries
    second = run(*args, env=env)
    assert second.returncode == 0, second.stderr
    assert second.stdout == first.stdout
    assert sorted(p.name for p in folder.iterdir()) == entries


def test_generate_command_matches_the_library():
    """The printed text is the greedy continuation sj.generate produces."""
    from tokenizers import Tokenizer
    tok = Tokenizer.from_file(str(resolve("tiny") / "tokenizer.json"))
    prompt = "def hls_to_rgb(h, l, s):"
    ids = tok.encode(prompt).ids
    model = sj.load("tiny")
    out = sj.generate(model, [ids], max_new_tokens=16, eos_token_id=model.config.eos_token_id)
    want = tok.decode(ids + out.tokens[0, : out.num_tokens[0]].tolist())
    r = run("generate", "--prompt", prompt, "--max-new-tokens", "16", "--drafter", "ar")
    assert r.returncode == 0, r.stderr
    assert r.stdout.rstrip("\n") == want.rstrip("\n")


@pytest.mark.parametrize("args, message", [
    (["--model", "/nonexistent/folder"], "no model at '/nonexistent/folder'"),
    (["--drafter", "bogus"], "argument --drafter: invalid choice: 'bogus' (choose from 'ar', "),
    (["--temperature", "-1"], "argument --temperature: must be a finite number >= 0, got -1"),
    (["--top-p", "2", "--temperature", "1"], "argument --top-p: must be a finite number in (0, 1], got 2"),
    (["--top-k", "0", "--temperature", "1"], "argument --top-k: must be an integer >= 1, got 0"),
    (["--temperature", "nan"], "argument --temperature: must be a finite number >= 0, got nan"),
])
def test_bad_input_is_one_line_and_exit_code_2(args, message):
    r = run("generate", "--prompt", "x = 1", *args, timeout=120)
    assert r.returncode == 2
    assert r.stderr.strip().count("\n") == 0 and message in r.stderr, r.stderr
    assert "Traceback" not in r.stderr


def test_int8_activations_on_a_quantized_model_and_one_line_on_a_float_one(tmp_path):
    sj.save(sj.quantize(sj.load("tiny"), "int4"), tmp_path / "q", tokenizer="tiny")
    r = run("generate", "--prompt", "def f(x):", "--model", str(tmp_path / "q"), "--int8-activations",
            "--max-new-tokens", "8", timeout=300)
    assert r.returncode == 0 and r.stdout.strip(), r.stderr[-2000:]
    r = run("bench", "--model", str(tmp_path / "q"), "--int8-activations", "--quick", "--methods", "ar",
            "prompt-lookup", "--out", str(tmp_path / "bench"), timeout=600)
    assert r.returncode == 0 and "prompt-lookup" in r.stdout, r.stderr[-2000:]
    for command in ("generate --prompt x", "bench --quick"):
        r = run(*command.split(), "--model", "tiny", "--int8-activations", timeout=120)
        assert r.returncode == 2 and "--int8-activations: tiny has float matmul weights" in r.stderr
        assert len(r.stderr.strip().splitlines()) == 1, r.stderr


def test_folder_without_tokenizer_or_with_bad_config(tmp_path):
    sj.save(sj.load("tiny-draft"), tmp_path / "m", format="hf")
    r = run("generate", "--prompt", "x", "--model", str(tmp_path / "m"), timeout=120)
    assert r.returncode == 2 and "has no tokenizer.json" in r.stderr
    (tmp_path / "bad").mkdir()
    (tmp_path / "bad" / "tokenizer.json").write_text((resolve("tiny") / "tokenizer.json").read_text())
    (tmp_path / "bad" / "config.json").write_text("{not json")
    r = run("generate", "--prompt", "x", "--model", str(tmp_path / "bad"), timeout=120)
    assert r.returncode == 2 and "not valid JSON" in r.stderr and "Traceback" not in r.stderr
    (tmp_path / "bad" / "config.json").write_text(json.dumps({"model_type": "bert"}))
    r = run("generate", "--prompt", "x", "--model", str(tmp_path / "bad"), timeout=120)
    assert r.returncode == 2 and "unsupported model_type 'bert'" in r.stderr


def one_line_error(capsys, argv) -> str:
    """Run the CLI in this process; assert exit code 2 and one line on stderr, and return it."""
    assert main(argv) == 2
    out, err = capsys.readouterr()
    assert err.count("\n") == 1 and err.startswith("error: ") and "Traceback" not in err, err
    return out, err


def test_help_lists_every_drafter_method(capsys, monkeypatch):
    from specjax.methods import METHODS

    monkeypatch.setenv("COLUMNS", "10000")  # argparse wraps at hyphens ("hidden- transfer")
    with pytest.raises(SystemExit):
        main(["generate", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    drafters = [m for m in METHODS.values()
                if m.runner == "drafter" and not m.argument and "constraint" not in m.needs]
    assert all(f"{m.name}: {m.description}" in text or f"{m.name} (needs: {m.needs[0]}): {m.description}" in text
               for m in drafters), text
    assert "draft-chain (needs: draft model): " in text and "medusa (needs: shipped head): " in text
    assert "forced:" not in text  # needs a constraint: the structured bench's, not --drafter's


def test_prompt_longer_than_the_context_fails_before_the_echo(capsys):
    out, err = one_line_error(capsys, ["generate", "--prompt", "x = 1\n" * 3000, "--max-new-tokens", "1000000000"])
    assert out == "" and "exceeds the model's max_position_embeddings 2048" in err
    assert "+ max_new_tokens 1000000000" in err


def test_non_utf8_prompt_is_one_line(capsys):
    prompt = b"x = '\xff'".decode("utf-8", "surrogateescape")  # what Python makes of such argv bytes
    _, err = one_line_error(capsys, ["generate", "--prompt", prompt])
    assert "argument --prompt: not valid UTF-8 (byte 0xff at character 5)" in err


def test_truncated_weights_are_one_line(tmp_path, capsys):
    import shutil

    shutil.copytree(resolve("tiny-draft"), tmp_path / "m")
    weights = tmp_path / "m" / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:5000])
    _, err = one_line_error(capsys, ["generate", "--prompt", "x", "--model", str(tmp_path / "m")])
    assert f"{weights}: not a readable safetensors file" in err


def test_default_drafter_when_sampling_is_plain_decoding():
    """Prompt lookup at temperature 0.8 ran 2.5x slower than AR on the shipped model: the default
    when sampling on a target that fits in cache is AR, and the status line says it was chosen
    as the default."""
    r = run("generate", "--prompt", "def parse_args(argv):", "--max-new-tokens", "8", "--temperature", "0.8",
            "--top-p", "0.9")
    assert r.returncode == 0, r.stderr
    assert "method ar (default at temperature 0.8), verifier none (sampling)" in r.stderr
    assert "compile" in r.stderr


def test_chat_flags_need_a_chat_template(capsys):
    _, err = one_line_error(capsys, ["generate", "--prompt", "x", "--chat"])
    assert "--chat: the model tiny has no chat template" in err
    _, err = one_line_error(capsys, ["generate", "--prompt", "x", "--system", "Be brief."])
    assert "--system needs --chat" in err


def test_a_prompt_outside_the_vocabulary_is_one_line(capsys):
    # the task dLLM's word-level vocabulary has no unknown token
    _, err = one_line_error(capsys, ["generate", "--model", "tiny-dllm-tasks", "--prompt", "hello there"])
    assert "cannot tokenize the prompt" in err and "outside the model's vocabulary" in err


def test_ctrl_c_while_streaming_prints_what_came_and_exits_130():
    import os
    import signal

    prompt = "def parse_args(argv):"
    p = subprocess.Popen([sys.executable, "-m", "specjax", "generate", "--prompt", prompt, "--max-new-tokens",
                          "2000", "--drafter", "ar"], stdout=subprocess.PIPE, stderr=subprocess.PIPE,  # ~the context
                         preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))  # a test worker ignores it
    out = b""
    while len(out) < len(prompt) + 20:  # the echo and a few tokens
        out += os.read(p.stdout.fileno(), 4096)
    p.send_signal(signal.SIGINT)
    rest, err = p.communicate(timeout=120)
    assert p.returncode == 130
    assert (out + rest).decode().startswith(prompt) and len(out + rest) > len(prompt) + 20
    n = int(err.decode().removeprefix("interrupted after ").removesuffix(" tokens\n"))
    assert n >= 1 and "Traceback" not in err.decode()


def test_ctrl_c_while_loading_is_one_line(capsys, monkeypatch):
    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(sj, "load", interrupted)
    assert main(["generate", "--prompt", "x"]) == 130
    assert capsys.readouterr().err == "interrupted after 0 tokens\n"


@pytest.fixture(scope="module")
def other_target(tmp_path_factory):
    """A random 2-layer target (vocabulary 5000, hidden size 64) with tiny's tokenizer: no
    shipped draft model or head fits it."""
    import jax

    folder = tmp_path_factory.mktemp("other") / "m"
    cfg = sj.ModelConfig(model_type="llama", vocab_size=5000, hidden_size=64, intermediate_size=128, num_layers=2,
                         num_heads=2, num_kv_heads=1, head_dim=32, max_position_embeddings=256)
    sj.save(sj.Model.init(cfg, jax.random.key(0)), folder, format="hf", tokenizer=resolve("tiny"))
    return folder


@pytest.mark.parametrize("drafter, message", [
    ("draft-chain", "draft-chain needs a draft model with the target's vocabulary of 5000 tokens (the draft model "
                    "has 4096): pass one (--draft PATH)"),
    ("draft-dyspec", "draft-dyspec needs a draft model with the target's vocabulary of 5000 tokens"),
    ("ppd", "no ppd head is shipped for this target"),
    ("hidden-transfer", "no hidden-transfer head is shipped for this target"),
    ("eagle", "no eagle head is shipped for this target"),
    ("swift", "swift does not fit this target: "),
])
def test_drafters_that_do_not_fit_are_refused_before_they_run(other_target, capsys, drafter, message):
    out, err = one_line_error(capsys, ["generate", "--prompt", "x = ", "--model", str(other_target),
                                       "--drafter", drafter])
    assert out == "" and message in err


def test_heads_shipped_for_another_target_are_named():
    import types

    from specjax import methods
    from specjax.convert import heads

    signature = json.loads((heads.ASSETS / "smollm2-eagle" / "head.json").read_text())["target"]
    smollm2 = types.SimpleNamespace(config=sj.ModelConfig(**signature, head_dim=64, max_position_embeddings=8192))
    with pytest.raises(ValueError, match=r"^no ppd head is shipped for this target \(\{.*\}\); heads shipped "
                                         "for smollm2, a target of this shape: clover, eagle, medusa$"):
        methods.make("ppd", smollm2)


def test_draft_flag_gives_the_draft_model(other_target, capsys):
    assert main(["generate", "--prompt", "x = ", "--model", str(other_target), "--drafter", "draft-chain",
                 "--draft", str(other_target), "--max-new-tokens", "3"]) == 0
    assert "method draft-chain" in capsys.readouterr().err
    _, err = one_line_error(capsys, ["generate", "--prompt", "x", "--drafter", "sam", "--draft", "tiny-draft"])
    assert "--draft is for the drafters that need a draft model (draft-chain, " in err and err.endswith("not sam\n")


def test_constraints_with_plain_decoding(capsys):
    """AR, the default when sampling on tiny, carries a regex as it is."""
    pytest.importorskip("outlines_core")
    assert main(["generate", "--prompt", "x = ", "--regex", "[0-9]+", "--temperature", "0.7",
                 "--max-new-tokens", "4"]) == 0
    out, err = capsys.readouterr()
    assert out.removeprefix("x = ").strip().isdigit() and "method ar (default" in err
    _, err = one_line_error(capsys, ["generate", "--prompt", "x", "--regex", r"(a)\1"])
    assert "(a regular expression: no backreferences or lookarounds)" in err


def test_eos_outside_the_vocabulary_is_refused(tmp_path, capsys):
    import shutil

    shutil.copytree(resolve("tiny"), tmp_path / "m")
    config = json.loads((tmp_path / "m" / "config.json").read_text())
    (tmp_path / "m" / "config.json").write_text(json.dumps({**config, "eos_token_id": 99999}))
    _, err = one_line_error(capsys, ["generate", "--prompt", "x", "--model", str(tmp_path / "m")])
    assert "eos_token_id must be in the vocabulary [0, 4096), got [0, 99999]" in err


@pytest.mark.parametrize("args, message", [
    (["--prompt", ""], "argument --prompt: empty; give it some text"),
    (["--prompt", "x", "--seed", str(2**70)], "argument --seed: must be an integer in [0, 9223372036854775807]"),
    (["--prompt", "x", "--seed", "-1"], "argument --seed: must be an integer in [0, "),
    (["--prompt", "x", "--max-new-tokens", "1e3"], "argument --max-new-tokens: expected an integer >= 1, got '1e3'"),
    (["--prompt", "x", "--top-p", "0"], "argument --top-p: must be a finite number in (0, 1], got 0"),
    (["--prompt", "x", "--bogus"], "unrecognized arguments: --bogus"),
    ([], "the following arguments are required: --prompt"),
])
def test_flags_are_checked_at_parse_time(capsys, args, message):
    _, err = one_line_error(capsys, ["generate", *args])
    assert message in err and err.rstrip().endswith("--help)"), err


def test_help_shows_every_option_with_its_help_and_default(capsys, monkeypatch):
    from specjax.__main__ import _parser

    monkeypatch.setenv("COLUMNS", "10000")
    parser = _parser()
    commands = parser._subparsers._group_actions[0].choices
    for name, sub in commands.items():
        for action in sub._actions:
            assert action.help, f"{name} {action.option_strings or action.dest} has no help"
        with pytest.raises(SystemExit):
            main([name, "--help"])
        text = capsys.readouterr().out
        assert all(f"(default: {a.default})" in text for a in sub._actions
                   if a.option_strings and a.default not in (None, False, "==SUPPRESS==")), text
    with pytest.raises(SystemExit):
        main(["--help"])
    text = capsys.readouterr().out
    assert all(f"  {name} " in text for name in commands), text
