"""`python -m specjax bench --dllm` end to end on a random tiny masked-diffusion LM with
parallel_bench's vocabulary: the three files, FreeDave equal to static decoding, the closed-form
column, and one-line usage errors."""

from __future__ import annotations

import dataclasses
import json

import jax
import pytest

import specjax as sj
from specjax.__main__ import main
from specjax.bench import dllm
from specjax.data import parallel_bench as pb


def _config(**diffusion):
    return sj.ModelConfig(model_type="llama", vocab_size=len(pb.VOCAB), hidden_size=32, intermediate_size=64,
                          num_layers=2, num_heads=4, num_kv_heads=2, head_dim=8, max_position_embeddings=64,
                          **diffusion)


@pytest.fixture(scope="module")
def dllm_folder(tmp_path_factory):
    folder = tmp_path_factory.mktemp("dllm") / "model"
    sj.save(sj.Model.init(_config(mask_token_id=pb.MASK_ID), jax.random.key(0)), folder)
    return folder


def test_bench_dllm_end_to_end(dllm_folder, tmp_path, capsys):
    out = tmp_path / "bench"
    argv = ["bench", "--dllm", str(dllm_folder), "--tasks", "copy", "shuffle", "--samplers", "static",
            "threshold-0.9", "freedave-4", "--num-examples", "4", "--batch", "3", "--out", str(out)]
    assert main(argv) == 0
    result = json.loads((out / "results.json").read_text())
    rows = {(r["task"], r["sampler"], r["cache"]) for r in result["rows"]}
    assert rows == {(t, s, c) for t in ("copy", "shuffle") for s, c in
                    (("static", None), ("threshold-0.9", None), ("threshold-0.9", "dual"), ("freedave-4", None))}
    for r in result["rows"]:
        assert 0 <= r["accuracy"] <= 1 and r["tokens_per_s"] > 0 and r["examples"] == 4
        assert r["tokens_per_forward"] == pytest.approx(pb.GEN_LENGTH / r["nfe_mean"])
        if r["sampler"] == "static":
            assert r["nfe_mean"] == pb.GEN_LENGTH  # one slot per forward, every slot
    assert all(r["mismatches_vs_static"] == 0 for r in result["rows"] if r["sampler"] == "freedave-4")
    closed = result["closed_form"]
    assert [(c["task"], c["k"]) for c in closed] == [(t, k) for t in ("copy", "shuffle") for k in dllm.CLOSED_FORM_K]
    assert all(c["closed_form"] == 1.0 for c in closed if c["task"] == "copy")
    assert {c["greedy"] is None for c in closed if c["k"] > 1} == {True}  # topk-k did not run
    assert all(0 <= c["random_order"] <= 1 and c["random_order_se"] >= 0 for c in closed)
    assert all(c["closed_form_random_order"] == pytest.approx(1.0) for c in closed if c["task"] == "copy" or c["k"] == 1)
    assert all(c["random_order_relative"] == 1.0 for c in closed if c["k"] == 1 and c["random_order"] > 0)
    md = (out / "results.md").read_text()
    assert "### deterministic tasks" in md and "### dependent tasks" in md and "RandomK(k), temperature 1" in md
    assert "FREEDAVE DIFFERS" not in md and result["command"].startswith("python -m specjax bench --dllm")
    assert (out / dllm.PLOT).stat().st_size > 0
    assert "wrote" in capsys.readouterr().out


@pytest.mark.parametrize("extra, message", [
    (["--tasks", "copy", "nope"], "unknown task 'nope'"),
    (["--samplers", "static", "topk-3"], "unknown sampler 'topk-3'"),
    (["--samplers", "learn2pd"], "learn2pd.npz"),
    (["--batch", "2", "4"], "one size"),
])
def test_bench_dllm_bad_names(dllm_folder, tmp_path, capsys, extra, message):
    assert main(["bench", "--dllm", str(dllm_folder), "--out", str(tmp_path / "b"), *extra]) == 2
    err = capsys.readouterr().err
    assert message in err and len(err.strip().splitlines()) == 1 and not (tmp_path / "b").exists()


def test_bench_dllm_needs_a_diffusion_model(tmp_path, capsys):
    folder = tmp_path / "causal"
    sj.save(sj.Model.init(_config(), jax.random.key(0)), folder)
    assert main(["bench", "--dllm", str(folder), "--tasks", "copy"]) == 2
    assert "not a masked-diffusion model" in capsys.readouterr().err


def test_dllm_options_need_dllm(capsys):
    assert main(["bench", "--tasks", "copy"]) == 2
    assert "--tasks is for --dllm" in capsys.readouterr().err
    assert main(["bench", "--samplers"]) == 0
    assert "freedave-8" in capsys.readouterr().out


def test_examples_are_seeded_per_task():
    assert dllm.examples("shuffle", 3) == dllm.examples("shuffle", 3)
    assert dllm.examples("shuffle", 2) == dllm.examples("shuffle", 3)[:2]


def test_bench_dllm_learn2pd_from_the_model_folder(tmp_path):
    learn2pd = pytest.importorskip("specjax.diffusion.learn2pd")
    folder = tmp_path / "model"
    sj.save(sj.Model.init(_config(mask_token_id=pb.MASK_ID), jax.random.key(0)), folder)
    n = 6  # the filter's block, not --block's
    learn2pd.save_filter(tuple((jax.random.normal(jax.random.key(i), (n, n)), jax.numpy.zeros(n)) for i in range(2)),
                         folder / dllm.FILTER_FILE)
    prep = dllm.prepare(dllm.DllmConfig(model=str(folder), tasks=("copy",), num_examples=2, batch=2))
    assert "learn2pd" in prep.samplers  # by default, since the folder has a filter
    prep = prep._replace(cfg=dataclasses.replace(prep.cfg, tasks=("reverse",)),
                         samplers={"learn2pd": prep.samplers["learn2pd"]})
    rows, _ = dllm.measure(prep, progress=False)
    assert [(r["sampler"], r["block"], r["eos_exit"]) for r in rows] == [("learn2pd", n, True)]
