"""Self-distillation data (`specjax.data.distill_prompts`, `selfdistill`, `features`, `draft_vocab`):
the training prompts leave the benchmarks out; answer shards on the tiny target are its own
output and resume after a kill; the feature cache equals a direct forward; the draft vocabulary."""

import json
import shutil

import jax
import numpy as np
import pytest

import specjax as sj
from specjax.data.distill_prompts import CATEGORIES, build_prompts
from specjax.models import forward
from specjax.train import shards
from specjax.train.draft_vocab import coverage, draft_vocabulary, token_counts
from specjax.train.features import cache_features
from specjax.train.__main__ import main as cli
from specjax.train.selfdistill import DistillConfig, generate_answers, sequences

NGRAM = 50


def _ngrams(texts, n=NGRAM) -> set:
    out = set()
    for t in texts:
        t = " ".join(t.split())
        out.update(t[i: i + n] for i in range(len(t) - n + 1))
    return out


def _leaks(rows, bench: set) -> list[str]:
    return [g for r in rows for g in _ngrams(r["turns"] + r["replies"]) if g in bench]


def test_training_prompts_are_varied_deterministic_and_leave_the_benchmarks_out():
    from specjax.data.prompts import benchmark_prompt_texts

    rows = build_prompts(3000, seed=0)
    assert build_prompts(300, seed=0) == rows[:300] != build_prompts(300, seed=1)
    assert len({"\0".join(r["turns"] + r["replies"]) for r in rows}) == 3000
    assert {r["category"] for r in rows} == set(CATEGORIES)
    assert all(len(r["turns"]) == len(r["replies"]) + 1 for r in rows)
    bench = _ngrams(benchmark_prompt_texts())
    assert _leaks(rows, bench) == []
    # negative control: a benchmark passage pasted into a prompt is caught
    from specjax.data.prompts import chat_prompts

    passage = chat_prompts(["summarization"])[0]["turns"][0].split("\n\n", 1)[1][40:200]
    planted = [{**rows[0], "turns": [f"Summarize this text.\n\n{passage}"]}]
    assert _leaks(planted, bench)


@pytest.fixture(scope="module")
def tiny():
    return sj.load("tiny"), sj.load_tokenizer("tiny")


@pytest.fixture(scope="module")
def distilled(tiny, tmp_path_factory):
    model, tok = tiny
    cfg = DistillConfig("tiny", str(tmp_path_factory.mktemp("distill")), num_prompts=24, batch_size=3,
                        max_new_tokens=8, temperatures=(0.0, 1.0), max_prompt_tokens=60)
    return cfg, generate_answers(model, tok, cfg, progress=False)


def _trained_prompts(answers, count=2):
    """Prompts of the greedy shard a head trained on: there it has learned what the target says,
    so its drafts are accepted whatever the float rounding of a 40-step run."""
    s = shards.read_shard(answers, 0)
    return [list(shards.unpack(s["tokens"], s["offsets"], j)[:s["answer_start"][j]]) for j in range(count)]


def test_answer_shards_are_the_targets_output_and_resume_after_a_kill(tiny, distilled):
    model, tok = tiny
    cfg, answers = distilled
    done = shards.finished(answers)
    assert len(done) >= 2
    rows = [json.loads(line) for line in (answers.parent / "prompts.jsonl").read_text().splitlines()]
    # a greedy shard is what sj.generate answers for its prompts
    s = shards.read_shard(answers, 0)
    assert float(s["temperature"]) == 0.0
    seqs = [shards.unpack(s["tokens"], s["offsets"], j) for j in range(len(s["answer_start"]))]
    prompts = [list(q[:a]) for q, a in zip(seqs, s["answer_start"])]
    out = sj.generate(model, prompts, max_new_tokens=cfg.max_new_tokens, eos_token_id=list(tok.eos_token_ids))
    for q, a, toks, n in zip(seqs, s["answer_start"], out.tokens, out.num_tokens):
        np.testing.assert_array_equal(q[a:], toks[:n])
    assert all(len(rows[i]["turns"]) for i in s["prompt_index"])

    # killed while writing shard 1: it is missing and a partial folder is left behind
    before = {i: (shards.shard_path(answers, i) / "tokens.npy").stat().st_mtime_ns for i in done}
    kept = np.load(shards.shard_path(answers, 1) / "tokens.npy")
    shutil.rmtree(shards.shard_path(answers, 1))
    (answers / ".00001.partial").mkdir()
    (answers / ".00001.partial" / "tokens.npy").write_bytes(b"junk")
    generate_answers(model, tok, cfg, progress=False)
    assert shards.finished(answers) == done
    assert not (answers / ".00001.partial").exists()
    np.testing.assert_array_equal(np.load(shards.shard_path(answers, 1) / "tokens.npy"), kept)
    assert all((shards.shard_path(answers, i) / "tokens.npy").stat().st_mtime_ns == before[i] for i in done if i != 1)

    with pytest.raises(ValueError, match="other settings .*max_new_tokens"):
        generate_answers(model, tok, DistillConfig(**{**cfg.__dict__, "max_new_tokens": 9}), progress=False)


def test_feature_cache_matches_a_direct_forward(tiny, distilled, tmp_path):
    model, _ = tiny
    _, answers = distilled
    c, layers, k = model.config, (1, 3, 5), 4
    folder = cache_features(model, answers, tmp_path / "features", layers=layers, top_k=k, draft_vocab=64,
                            progress=False)
    direct = jax.jit(lambda params, tokens: forward(c, params, tokens, return_layers=layers)[:3])
    checked = 0
    for i in shards.finished(answers):
        f = shards.read_shard(folder, i)
        assert f["hidden"].dtype == np.float16 and f["hidden"].shape[1:] == (3, c.hidden_size)
        for j in range(len(f["answer_start"])):
            seq = shards.unpack(f["tokens"], f["offsets"], j)
            padded = np.zeros((1, 128), np.int32)  # one compilation; right padding changes nothing before it
            padded[0, : len(seq)] = seq
            out = jax.tree.map(lambda x: np.asarray(x)[..., : len(seq), :], direct(model.params, padded))
            want = out[2][:, 0].transpose(1, 0, 2)
            np.testing.assert_allclose(shards.unpack(f["hidden"], f["offsets"], j).astype(np.float32), want,
                                       rtol=2e-3, atol=2e-3 * np.abs(want).max())
            probs = np.asarray(jax.nn.softmax(out[0][0], -1))
            ids = shards.unpack(f["topk_ids"], f["offsets"], j).astype(np.int64)
            got = shards.unpack(f["topk_probs"], f["offsets"], j).astype(np.float32)
            np.testing.assert_allclose(np.take_along_axis(probs, ids, 1), got, rtol=3e-3, atol=1e-4)
            np.testing.assert_allclose(got[:, -1], np.sort(probs, 1)[:, -k], rtol=3e-3, atol=1e-4)  # the top k
            checked += 1
    assert checked >= 6

    # vocabulary: the answers' token counts and the most frequent ids
    counts = np.load(folder / "counts.npy")
    d2t = np.load(folder / "d2t.npy")
    answer_tokens = [t[s:] for _, t, s in sequences(answers)]
    assert counts.sum() == sum(map(len, answer_tokens))
    assert len(d2t) == 64 and np.all(np.diff(d2t) > 0) and counts[d2t].min() >= np.sort(counts)[-64]
    info = json.loads((folder / "vocab.json").read_text())
    assert info["coverage"] == pytest.approx(counts[d2t].sum() / counts.sum())

    # a feature shard lost to a kill is rebuilt alone
    kept = np.load(shards.shard_path(folder, 0) / "hidden.npy")
    shutil.rmtree(shards.shard_path(folder, 0))
    cache_features(model, answers, folder, layers=layers, top_k=k, draft_vocab=64, progress=False)
    np.testing.assert_array_equal(np.load(shards.shard_path(folder, 0) / "hidden.npy"), kept)


def test_draft_vocabulary_keeps_the_most_frequent_ids():
    counts = token_counts([(np.array([9, 9, 4, 4, 4, 0, 2, 2, 4]), 2), (np.array([3, 0]), 0)], 6)
    np.testing.assert_array_equal(counts, [2, 0, 2, 1, 4, 0])  # answers only: positions >= start
    d2t = draft_vocabulary(counts, 3)
    np.testing.assert_array_equal(d2t, [0, 2, 4])  # 4 (4 times), then 0 and 2 (twice each) before 3 (once)
    assert coverage(counts, d2t) == pytest.approx(8 / 9)
    with pytest.raises(ValueError, match="size must be >= 1"):
        draft_vocabulary(counts, 0)


@pytest.mark.parametrize("args", [["distill", "--temperatures", "0,-1"], ["distill", "--num-prompts", "0"],
                                  ["distill", "--top-k", "0"], ["features"]])  # features: no answers there
def test_distill_cli_rejects_bad_settings(args, tmp_path, capsys):
    assert cli([args[0], "--model", "tiny", "--out", str(tmp_path), *args[1:]]) == 2
    assert capsys.readouterr().err.startswith("error: ")


def test_sparse_distillation_is_the_restricted_renormalised_target():
    """With every id in the top-k, the sparse loss equals the dense soft CE against the target
    restricted to the draft vocabulary and renormalised; ids outside it carry no mass."""
    from specjax.train.objectives.scoring import distill, sparse_distill

    p = jax.random.normal(jax.random.key(0), (2, 3, 6))
    d = jax.random.normal(jax.random.key(1), (2, 3, 4))
    d2t = np.array([0, 2, 3, 5])
    ids = jax.numpy.argsort(-p, -1)  # all 6 target ids, by probability
    t2d = np.full(6, -1)
    t2d[d2t] = np.arange(4)
    mask = np.ones((2, 3), bool)
    sparse, m = sparse_distill([(d, t2d[np.asarray(ids)], jax.numpy.take_along_axis(jax.nn.softmax(p), ids, -1),
                                 mask)], 0.8, "s")
    dense, want = distill([(d, p[..., d2t])], 0.8, "s")
    np.testing.assert_allclose(sparse, dense, rtol=1e-5)
    np.testing.assert_allclose(m["s0_kl"], want["s0_kl"], rtol=1e-4, atol=1e-6)
    wrong, _ = distill([(d, p[..., :4])], 0.8, "s")  # negative control: another restriction differs
    assert abs(float(wrong) - float(dense)) > 1e-3


def test_eagle3_trains_on_the_feature_cache_with_a_reduced_vocabulary(tiny, distilled, tmp_path, capsys):
    """`[data] features` + `[heads] draft_vocab_size`: the windows are the cache's, the loss
    falls, and the exported head (with d2t) decodes greedily exactly as the target alone."""
    import dataclasses

    from specjax.drafters import Eagle
    from specjax.train.run_config import from_dict
    from specjax.train.export import export
    from specjax.train.feature_windows import FeatureWindows
    from specjax.train.loop import train

    model, tok = tiny
    _, answers = distilled
    folder = cache_features(model, answers, tmp_path / "features", layers=(1, 3, 4, 5), top_k=8, draft_vocab=64,
                            progress=False)
    # a window is the cache at its positions; the loss mask keeps the answer's predictions
    windows = FeatureWindows(folder, (1, 3, 4), 33, seed=0)
    k, off, n, a = (int(x) for x in windows.train[3])
    w = windows.window(windows.train[3], 0)
    s = shards.read_shard(folder, k)
    m = min(n, 32)
    np.testing.assert_array_equal(w["tokens"][:n], s["tokens"][off: off + n][:33])
    np.testing.assert_array_equal(w["features"][:m].reshape(m, 3, -1), s["hidden"][off: off + m][:, :3])
    np.testing.assert_array_equal(w["topk_ids"][:m], s["topk_ids"][off: off + m])
    np.testing.assert_array_equal(np.flatnonzero(w["loss_mask"]), np.arange(a - 1, min(n - 1, 32)))
    state = windows.state()
    first = windows.next(4)
    windows.set_state(state)
    np.testing.assert_array_equal(windows.next(4)["features"], first["features"])

    raw = {"model": dataclasses.asdict(model.config),
           "data": {"tokenizer": "", "cache_dir": "", "features": str(folder), "seq_len": 32},
           "optim": {"lr": 1e-2, "warmup_steps": 2, "weight_decay": 0.0},
           "train": {"out": str(tmp_path / "run"), "objective": "eagle3", "steps": 40, "batch_size": 4,
                     "log_every": 1, "eval_every": 1000, "save_every": 1000, "eval_batches": 2},
           "heads": {"target": "tiny", "ttt_steps": 2, "target_layers": [1, 3, 4], "draft_vocab_size": 64,
                     "token_counts": str(folder / "counts.npy"), "top_k": 2, "depth": 3, "total_tokens": 6}}
    config = from_dict(raw)
    result = train(config, progress=False)
    records = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    first = next(r["step0_kl"] for r in records if r["split"] == "train")
    assert result["train"]["step0_kl"] < 0.7 * first, (first, result["train"])
    assert len(result["val"]["top1"]) == 2

    export(config, tmp_path / "head")
    head = Eagle.load(tmp_path / "head")
    assert head.config.draft_vocab_size == 64 and head.params["lm_head"].shape[-1] == 64
    np.testing.assert_array_equal(head.params["d2t"], np.load(folder / "d2t.npy"))
    prompts = _trained_prompts(answers)
    want = sj.generate(model, prompts, max_new_tokens=16)
    got = sj.generate(model, prompts, max_new_tokens=16, drafter=head)
    np.testing.assert_array_equal(got.tokens, want.tokens)
    assert got.stats.target_calls < want.stats.target_calls

    # bad settings are one-line errors
    from specjax.train.loop import data_source
    from specjax.train.objectives import make_objective

    eagle1 = from_dict({**raw, "train": {**raw["train"], "objective": "eagle"}, "heads": {"target": "tiny"}})
    with pytest.raises(ValueError, match=r"the eagle objective trains on token windows, not on a feature cache"):
        data_source(eagle1, make_objective(eagle1))
    with pytest.raises(ValueError, match="draft_vocab_size needs token_counts"):
        make_objective(from_dict({**raw, "heads": {**raw["heads"], "token_counts": ""}}))
    with pytest.raises(ValueError, match="caches layers"):
        FeatureWindows(folder, (1, 2, 4), 33, seed=0)
    with pytest.raises(FileNotFoundError, match="token_counts: no file .*nowhere.npy"):  # the CLI: exit 2
        make_objective(from_dict({**raw, "heads": {**raw["heads"], "token_counts": str(tmp_path / "nowhere.npy")}}))
    import tomli_w

    cfg = tmp_path / "missing.toml"
    model_section = {k: v for k, v in raw["model"].items() if v is not None}  # TOML has no null
    cfg.write_text(tomli_w.dumps({**raw, "model": model_section,
                                  "data": {**raw["data"], "features": str(tmp_path / "nowhere")}}))
    capsys.readouterr()
    assert cli(["--config", str(cfg), "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and "not a feature cache" in err and err.count("\n") == 1, err


@pytest.mark.parametrize("objective", ["medusa1", "clover"])
def test_medusa_and_clover_train_on_the_feature_cache_with_a_reduced_vocabulary(objective, tiny, distilled, tmp_path):
    """Medusa-1 and Clover from the cached last layer, drafting over a reduced vocabulary (FR-Spec):
    the loss falls, the exported head keeps d2t, drafts only ids from it, and decodes greedily
    exactly as the target alone."""
    import dataclasses

    from specjax.drafters import Clover, Medusa
    from specjax.train.run_config import from_dict
    from specjax.train.export import export
    from specjax.train.loop import train

    model, tok = tiny
    _, answers = distilled
    folder = cache_features(model, answers, tmp_path / "features", layers=(5,), top_k=8, draft_vocab=64,
                            progress=False)
    heads = {"medusa1": {"num_heads": 3, "tree_size": 8},
             "clover": {"num_heads": 3, "block_layers": 1, "tree_size": 8}}[objective]
    raw = {"model": dataclasses.asdict(model.config),
           "data": {"tokenizer": "", "cache_dir": "", "features": str(folder), "seq_len": 32},
           "optim": {"lr": 1e-2, "warmup_steps": 2, "weight_decay": 0.0},
           "train": {"out": str(tmp_path / "run"), "objective": objective, "steps": 40, "batch_size": 4,
                     "log_every": 1, "eval_every": 1000, "save_every": 1000, "eval_batches": 2},
           "heads": {"target": "tiny", "draft_vocab_size": 64, "token_counts": str(folder / "counts.npy"), **heads}}
    config = from_dict(raw)
    result = train(config, progress=False)
    records = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    name = "head0_loss" if objective == "medusa1" else "step0_ce"
    first = next(r[name] for r in records if r["split"] == "train")
    assert result["train"][name] < 0.8 * first, (first, result["train"])
    assert len(result["val"]["top1"]) == 3

    export(config, tmp_path / "head")
    head = (Medusa if objective == "medusa1" else Clover).load(tmp_path / "head")
    d2t = np.load(folder / "d2t.npy")
    np.testing.assert_array_equal(head.params["d2t"], d2t)
    prompts = _trained_prompts(answers)
    want = sj.generate(model, prompts, max_new_tokens=16)
    got = sj.generate(model, prompts, max_new_tokens=16, drafter=head)
    np.testing.assert_array_equal(got.tokens, want.tokens)
    assert got.stats.target_calls < want.stats.target_calls
    from specjax.drafters.base import Context
    from specjax.sampling import SamplingParams

    tokens = jax.numpy.asarray(got.tokens)
    length = jax.numpy.full(2, tokens.shape[1], jax.numpy.int32)
    state = head.init(model, tokens, length, tokens.shape[1] + 16)
    tree, _ = head.propose(state, Context(tokens, length, SamplingParams(), model), jax.random.key(0))
    assert np.isin(np.asarray(tree.tokens)[:, 1:], d2t).all()  # every drafted token is in the vocabulary
