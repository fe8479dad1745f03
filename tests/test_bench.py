"""`python -m specjax bench --quick` end to end: specjax AR, the adaptive (goodput) method and
the transformers peer rows on the shipped tiny models (or, until they exist, a random Llama
stand-in in HF format with a tokenizer trained here), then results.json and chart.png; ragged
prompts, and chat rows in a chat template."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import jax
import numpy as np
import pytest

import specjax as sj
from specjax.__main__ import main
from specjax.bench.harness import BenchConfig, _tokenized_prompts, run, skipped
from specjax.bench.report import caveat, write
from specjax.convert import resolve
from specjax.convert.model_paths import ASSETS
from specjax.data.prompts import prompt_set
from specjax.tokenizer import load_tokenizer

pytest.importorskip("transformers")
pytest.importorskip("torch")

METHODS = ["ar", "adaptive-prompt-lookup", "hf-ar", "hf-assisted", "hf-prompt-lookup"]


def _stand_in(root: Path) -> tuple[str, str]:
    """A random target and a smaller random draft (HF folders sharing one tokenizer)."""
    from specjax.data.prompts import heldout_prompts
    from specjax.train.bpe import save_tokenizer, train_tokenizer
    tok = train_tokenizer(heldout_prompts(16), vocab_size=300)
    paths = []
    for name, hidden, layers, seed in (("target", 32, 2, 0), ("draft", 16, 1, 1)):
        cfg = sj.ModelConfig(model_type="llama", vocab_size=tok.get_vocab_size(), hidden_size=hidden,
                             intermediate_size=2 * hidden, num_layers=layers, num_heads=4, num_kv_heads=2,
                             head_dim=hidden // 4, max_position_embeddings=256, tie_word_embeddings=True,
                             eos_token_id=0)
        sj.save(sj.Model.init(cfg, jax.random.key(seed)), root / name, format="hf")
        save_tokenizer(tok, root / name)
        paths.append(str(root / name))
    return paths[0], paths[1]


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    if (ASSETS / "tiny" / "model.safetensors").exists() and (ASSETS / "tiny-draft" / "model.safetensors").exists():
        return "tiny", "tiny-draft"
    return _stand_in(tmp_path_factory.mktemp("stand_in"))


def test_bench_quick(models, tmp_path, capsys):
    target, draft = models
    out = tmp_path / "bench"
    argv = ["bench", "--quick", "--model", target, "--draft", draft, "--methods", *METHODS, "--out", str(out)]
    assert main(argv) == 0
    result = json.loads((out / "results.json").read_text())
    rows = {r["method"]: r for r in result["rows"]}
    assert list(rows) == METHODS and all(r["batch"] == 1 for r in rows.values())
    for r in rows.values():
        assert {"method", "tau", "tokens_per_s", "speedup", "batch", "mem_mb"} <= set(r)
        assert r["tokens_per_s"] > 0 and r["tau"] >= 1.0
        assert r["new_tokens"] == 2 * 16  # quick: 2 prompts, 16 tokens each, no EOS stop
        assert r["matches_ar_first_prompt"], f"{r['method']} differs from specjax ar (greedy, same weights)"
    assert rows["ar"]["speedup"] == 1.0 and rows["ar"]["tau"] == 1.0 and rows["hf-ar"]["tau"] == 1.0
    assert sum(rows["adaptive-prompt-lookup"]["k_counts"].values()) > 0
    assert "torch" in result["machine"] and "threads" in result["machine"]
    assert (out / "chart.png").stat().st_size > 0 and (out / "results.md").exists()
    printed = capsys.readouterr().out
    assert "hf-assisted" in printed and "Not representative:** 16 new tokens x 2 prompts" in printed
    assert "Not representative" in (out / "results.md").read_text()


def test_peers_skipped_above_batch_1():
    cfg = BenchConfig(methods=("ar", "hf-ar", "hf-assisted", "hf-prompt-lookup"), batches=(1, 4))
    assert {(s["method"], s["batch"]) for s in skipped(cfg)} == {("hf-assisted", 4), ("hf-prompt-lookup", 4)}


def test_unknown_method_is_a_usage_error(tmp_path, capsys):
    assert main(["bench", "--quick", "--methods", "nope", "--out", str(tmp_path)]) == 2
    assert "unknown methods" in capsys.readouterr().err


def test_bad_flags_and_files_are_one_line_before_anything_runs(tmp_path, capsys):
    (tmp_path / "bad.jsonl").write_text('{"prompt": "x"}\n{bad\n')
    (tmp_path / "binary.jsonl").write_bytes(bytes(range(256)))
    for args, message in [
        (["--repeats", "0"], "argument --repeats: must be an integer >= 1, got 0"),
        (["--num-prompts", "0"], "argument --num-prompts: must be an integer >= 1, got 0"),
        (["--num-prompts", "-1"], "argument --num-prompts: must be an integer >= 1, got -1"),
        (["--batch", "0"], "argument --batch: must be an integer >= 1, got 0"),
        (["--prompts", str(tmp_path / "bad.jsonl")], f"{tmp_path / 'bad.jsonl'}:2: not JSON"),
        (["--prompts", str(tmp_path / "binary.jsonl")], f"{tmp_path / 'binary.jsonl'}: not UTF-8 text"),
        (["--prompts", "nope"], "prompts 'nope': not 'stdlib', 'humaneval', 'chat', nor a JSONL file"),
    ]:
        assert main(["bench", "--quick", "--out", str(tmp_path / "out"), *args]) == 2, args
        err = capsys.readouterr().err
        assert err.startswith(f"error: {message}") and err.count("\n") == 1, err
    assert not (tmp_path / "out").exists()


def test_methods_alone_lists_the_methods(capsys):
    from specjax.methods import METHODS

    assert main(["bench", "--methods"]) == 0
    listed = capsys.readouterr().out.splitlines()
    assert [line.split(" (needs")[0].split(": ")[0] for line in listed] == [
        u for u, m in METHODS.items() if "constraint" not in m.needs]
    assert "draft-chain (needs: draft model): a draft model drafts a chain of 3 tokens" in listed


def test_small_runs_are_marked_not_representative(tmp_path):
    row = {"method": "ar", "batch": 1, "verifier": "Greedy", "tau": 1.0, "acceptance_per_depth": [],
           "tokens_per_s": 9.0, "speedup": 1.0, "lossy": False}
    write([row], BenchConfig(num_prompts=2, max_new_tokens=16, repeats=1), tmp_path, "cmd")
    assert (tmp_path / "results.md").read_text().startswith("**Not representative:** 16 new tokens x 2 prompts")
    assert caveat(BenchConfig()) == ""


def _jsonl(path: Path, rows: list[dict]) -> str:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return str(path)


def test_ragged_prompts(models, tmp_path):
    """Prompts of different lengths, alone and together in one batch; transformers left-pads them."""
    target, _ = models
    path = _jsonl(tmp_path / "p.jsonl", [{"prompt": "def f(x):"},
                                         {"prompt": "import os\n\n\ndef walk(root, depth=0):"}])
    cfg = BenchConfig(model=target, methods=("ar", "hf-ar"), batches=(1, 2), prompts=path,
                      max_new_tokens=8, repeats=1)
    rows = run(cfg, progress=False)
    assert [(r["method"], r["batch"]) for r in rows] == [(m, b) for b in (1, 2) for m in cfg.methods]
    for r in rows:
        assert r["new_tokens"] == 2 * 8 and r["matches_ar_first_prompt"], r
        assert r["tau_per_category"] == {"all": pytest.approx(r["tau"])}

    from specjax.bench.peers import Peers
    tok = load_tokenizer(target)
    short, long = (tok.encode(t) for t in ("def f(x):", "import os\n\n\ndef walk(root, depth=0):"))
    assert len(short) < len(long)
    peers = Peers(resolve(target), None)
    together, _ = peers.decode("hf-ar", [short, long], 8)
    alone = [peers.decode("hf-ar", [p], 8)[0][0] for p in (short, long)]
    np.testing.assert_array_equal(together, np.stack(alone))


def test_chat_rows_in_chat_template(models, tmp_path):
    """A JSONL of chat rows on a model with a chat template: rendered by the template, tau per category."""
    folder = tmp_path / "chat-model"
    shutil.copytree(resolve(models[0]), folder)
    cfg_path = folder / "tokenizer_config.json"
    tok_cfg = json.loads(cfg_path.read_text()) if cfg_path.exists() else {}
    tok_cfg["chat_template"] = ("{% for m in messages %}<{{ m.role }}> {{ m.content }}\n{% endfor %}"
                                "{% if add_generation_prompt %}<assistant> {% endif %}")
    cfg_path.write_text(json.dumps(tok_cfg))
    path = _jsonl(tmp_path / "chat.jsonl", [
        {"id": "a", "category": "qa", "turns": ["What is a list?"]},
        {"id": "b", "category": "multi_turn", "turns": ["Name a loop.", "Another?"], "replies": ["for"]}])
    tok = load_tokenizer(folder)
    cfg = BenchConfig(model=str(folder), prompts=path, num_prompts=None)
    assert _tokenized_prompts(prompt_set(cfg.prompts, cfg.num_prompts), tok) == [
        ("qa", tok.encode("<user> What is a list?\n<assistant> ")),
        ("multi_turn", tok.encode("<user> Name a loop.\n<assistant> for\n<user> Another?\n<assistant> "))]

    out = tmp_path / "bench"
    assert main(["bench", "--model", str(folder), "--prompts", path, "--num-prompts", "all", "--methods", "ar",
                 "hf-ar", "--max-new-tokens", "8", "--repeats", "1", "--out", str(out)]) == 0
    rows = json.loads((out / "results.json").read_text())["rows"]
    assert all(set(r["tau_per_category"]) == {"qa", "multi_turn"} and r["matches_ar_first_prompt"] for r in rows)
    assert "tau per category" in (out / "results.md").read_text()


def test_peer_source_reads_gguf(tmp_path):
    from specjax.bench.peers import _source
    (tmp_path / "m.gguf").write_bytes(b"")
    assert _source(tmp_path / "m.gguf") == (str(tmp_path), {"gguf_file": "m.gguf"})
    assert _source(tmp_path) == (str(tmp_path), {"gguf_file": "m.gguf"})  # a folder holding one GGUF
    (tmp_path / "config.json").write_text("{}")
    assert _source(tmp_path) == (str(tmp_path), {})  # an HF folder


def test_forward_cost_times_the_forward_with_a_cut_lm_head():
    from specjax.bench.forward_cost import forward_seconds
    model = sj.load("tiny")
    for rows in (None, 0, 16):
        assert forward_seconds(model, 1, 2, cached=3, cache_len=8, loop=1, reps=1, head_rows=rows) > 0
