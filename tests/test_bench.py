"""`python -m specjax bench --quick` end to end: specjax AR, the adaptive (goodput) method and
the transformers peer rows on the shipped tiny models (or, until they exist, a random Llama
stand-in in HF format with a tokenizer trained here), then results.json and chart.png."""

from __future__ import annotations

import json
from pathlib import Path

import jax
import pytest

import specjax as sj
from specjax.__main__ import main
from specjax.bench.harness import BenchConfig, caveat, skipped, write
from specjax.convert import ASSETS

pytest.importorskip("transformers")
pytest.importorskip("torch")

METHODS = ["ar", "adaptive-prompt-lookup", "hf-ar", "hf-assisted", "hf-prompt-lookup"]


def _stand_in(root: Path) -> tuple[str, str]:
    """A random target and a smaller random draft (HF folders sharing one tokenizer)."""
    from specjax.bench.prompts import heldout_prompts
    from specjax.train.tokenizer import save_tokenizer, train_tokenizer
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


def test_small_runs_are_marked_not_representative(tmp_path):
    row = {"method": "ar", "batch": 1, "verifier": "Greedy", "tau": 1.0, "acceptance_per_depth": [],
           "tokens_per_s": 9.0, "speedup": 1.0, "lossy": False}
    write([row], BenchConfig(num_prompts=2, max_new_tokens=16, repeats=1), tmp_path, "cmd")
    assert (tmp_path / "results.md").read_text().startswith("**Not representative:** 16 new tokens x 2 prompts")
    assert caveat(BenchConfig()) == ""
