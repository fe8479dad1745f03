"""The masked-diffusion objectives (`mdm`, `dparallel`) against slow per-token references, the
canvas batches they train on, and short training runs on a stand-in for the task module."""

import dataclasses
import json
import types
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from specjax.models import ModelConfig, forward, init_params
from specjax.train import canvas_batches
from specjax.train.canvas_batches import TaskBatches, canvas_batch
from specjax.convert import load
from specjax.train.export import export
from specjax.train.loop import train
from specjax.train.task_decoding import write_trajectories
from specjax.train.objectives import dparallel as dp
from specjax.train.objectives import mdm
from specjax.train.run_config import from_dict, load_config

PAD, EOS, MASK, SEP = 0, 1, 2, 3  # then the digits 0-9 at ids 4-13
GEN = 6


def _bench():
    """A stand-in for specjax.data.parallel_bench's API: reverse 2-5 digits, and copy them."""
    vocab = ("<pad>", "<eos>", "<mask>", "|", *"0123456789")
    ids = {w: i for i, w in enumerate(vocab)}
    Example = dataclasses.make_dataclass("Example", ["task", "prompt", "answer"], frozen=True)

    def sample(task, rng):
        digits = tuple(str(d) for d in rng.integers(0, 10, rng.integers(2, 6)))
        return Example(task, (task, *digits, "|"), digits[::-1] if task == "reverse" else digits)

    def decode(row):
        words = [vocab[i] for i in row]
        return tuple(words[:words.index("<eos>")] if "<eos>" in words else words)

    def tokenizer():
        from tokenizers import Tokenizer, pre_tokenizers
        from tokenizers.models import WordLevel

        tok = Tokenizer(WordLevel({w: i for i, w in enumerate(vocab + ("reverse", "copy"))}, unk_token=None))
        tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
        return tok

    return types.SimpleNamespace(
        TASKS=("reverse", "copy"), VOCAB=vocab + ("reverse", "copy"), PAD_ID=PAD, EOS_ID=EOS, MASK_ID=MASK,
        GEN_LENGTH=GEN, sample=sample, decode=decode, check=lambda e, out: tuple(out) == e.answer,
        encode=lambda e: ([ids.get(w, 14 + (w == "copy")) for w in e.prompt], [ids[w] for w in e.answer]),
        tokenizer=tokenizer)


BENCH = _bench()
CONFIG = ModelConfig(model_type="llama", vocab_size=16, hidden_size=32, intermediate_size=64, num_layers=2,
                     num_heads=2, num_kv_heads=2, head_dim=16, max_position_embeddings=64, mask_token_id=MASK)
WIDTH = 14  # "reverse" + 5 digits + "|" + 6 slots, left-padded


@pytest.fixture(scope="module")
def params():
    return init_params(CONFIG, jax.random.key(0), std=0.3)


def _batch(n=6, seed=0):
    return {k: jnp.asarray(v) for k, v in TaskBatches((), WIDTH, seed, bench=BENCH).next(n).items()}


def _log_softmax(logits):
    z = logits - logits.max(-1, keepdims=True)
    return z - np.log(np.exp(z).sum(-1, keepdims=True))


@jax.jit
def _forward(params, tokens, valid):
    return forward(CONFIG, params, tokens, tree_mask=jnp.repeat(valid[:, None, :], tokens.shape[1], 1)).logits


def _logits(params, tokens, valid):
    return np.asarray(_forward(params, jnp.asarray(tokens), jnp.asarray(valid)), np.float64)


pretrain_loss = jax.jit(mdm.pretrain_loss, static_argnums=0)
sft_loss = jax.jit(mdm.sft_loss, static_argnums=0)


def test_canvas_batch_is_the_sampling_layout():
    batch = canvas_batch([[5, 6], [7, 8, 9]], [[4], [4, 5]], 8, 4, MASK, PAD, EOS)
    np.testing.assert_array_equal(batch["tokens"], [[PAD, PAD, 5, 6, 4, EOS, EOS, EOS],
                                                    [PAD, 7, 8, 9, 4, 5, EOS, EOS]])
    np.testing.assert_array_equal(batch["valid"], [[0, 0, 1, 1, 1, 1, 1, 1], [0, 1, 1, 1, 1, 1, 1, 1]])
    np.testing.assert_array_equal(batch["answer"][0], [0, 0, 0, 0, 1, 1, 1, 1])
    with pytest.raises(ValueError, match="does not fit"):
        canvas_batch([[5] * 6], [[4]], 8, 4, MASK, PAD, EOS)


def test_task_batches_resume_and_hold_out():
    a, b = TaskBatches((), WIDTH, 3, bench=BENCH), TaskBatches((), WIDTH, 3, bench=BENCH)
    a.next(4)
    b.set_state(a.state())
    np.testing.assert_array_equal(a.next(5)["tokens"], b.next(5)["tokens"])
    np.testing.assert_array_equal(a.held_out(7)["tokens"], b.held_out(7)["tokens"])
    with pytest.raises(ValueError, match="unknown task"):
        TaskBatches(("sort",), WIDTH, 0, bench=BENCH)


def test_pretrain_loss_is_the_per_token_reference(params):
    tokens = jax.random.randint(jax.random.key(1), (3, 10), 3, 16)
    for seed in range(2):
        key = jax.random.key(seed)
        value, _ = pretrain_loss(CONFIG, params, tokens, key)
        masked, p, kept, valid = (np.asarray(x) for x in mdm.pretrain_noise(key, tokens.shape))
        logits = _logits(params, jnp.where(masked, MASK, tokens), valid)
        logp, total = _log_softmax(logits), 0.0
        for b in range(3):
            for i in range(10):
                if masked[b, i]:
                    total += -logp[b, i, tokens[b, i]] / p[b, 0]
        assert masked.any()
        np.testing.assert_allclose(float(value), total / (3 * kept), rtol=1e-5)


def test_pretrain_noise_cuts_one_batch_in_a_hundred():
    keys = jax.random.split(jax.random.key(0), 2000)
    kept = np.asarray(jax.vmap(lambda k: mdm.pretrain_noise(k, (2, 50))[2])(keys))
    assert 5 <= (kept < 50).sum() <= 40
    masked, p, _, _ = mdm.pretrain_noise(jax.random.key(0), (400, 400))
    np.testing.assert_allclose(np.asarray(masked).mean(1), np.asarray(p)[:, 0], atol=0.08)


def test_sft_loss_is_the_reference_and_never_masks_the_prompt(params):
    batch = _batch()
    for seed in range(2):
        key = jax.random.key(seed)
        value, _ = sft_loss(CONFIG, params, batch, key)
        masked, p = (np.asarray(x) for x in mdm.sft_noise(key, batch["answer"]))
        assert not (masked & ~np.asarray(batch["answer"])).any()  # the prompt and its pads: never
        logits = _logits(params, jnp.where(masked, MASK, batch["tokens"]), batch["valid"])
        logp, total = _log_softmax(logits), 0.0
        for b in range(len(masked)):
            for i in range(WIDTH):
                if masked[b, i]:
                    total += -logp[b, i, batch["tokens"][b, i]] / p[b, 0] / GEN
        np.testing.assert_allclose(float(value), total / len(masked), rtol=1e-5)


def _scramble_pads(batch):
    return {**batch, "tokens": jnp.where(batch["valid"], batch["tokens"], 9)}


def test_pads_are_never_attended(params):
    batch = _batch()
    assert not np.asarray(batch["valid"]).all()
    key = jax.random.key(5)
    np.testing.assert_allclose(sft_loss(CONFIG, params, batch, key)[0],
                               sft_loss(CONFIG, params, _scramble_pads(batch), key)[0], rtol=1e-6)
    loss = jax.jit(dp.dparallel(CONFIG, dp.DParallelSettings(target="x", block_size=4)).loss)
    np.testing.assert_allclose(loss(params, batch, key)[0], loss(params, _scramble_pads(batch), key)[0], rtol=1e-6)


def test_block_masks_split_one_block():
    answer = jnp.asarray(canvas_batches.answer_slots((64, 12), 10))
    settings = dp.DParallelSettings(target="x", block_size=4)
    m, comp, later = (np.asarray(x) for x in dp.block_masks(jax.random.key(0), answer, settings))
    assert not (m & comp).any() and not ((m | comp | later) & ~np.asarray(answer)).any()
    chosen = set()
    for row in range(64):
        block = np.flatnonzero(m[row] | comp[row]) - 2
        b = block[0] // 4
        chosen.add(b)
        np.testing.assert_array_equal(block, np.arange(4 * b, min(4 * b + 4, 10)))  # the last block: 2
        np.testing.assert_array_equal(np.flatnonzero(later[row]) - 2, np.arange(4 * b + 4, 10))
    assert chosen == {0, 1, 2}
    assert 0.35 < m.sum() / (m | comp).sum() < 0.65


def test_dparallel_loss_is_the_reference(params):
    batch = _batch()
    settings = dp.DParallelSettings(target="x", block_size=4)
    value, _ = jax.jit(dp.dparallel(CONFIG, settings).loss)(params, batch, jax.random.key(2))
    m, comp, later = (np.asarray(x) for x in dp.block_masks(jax.random.key(2), batch["answer"], settings))
    tokens = np.asarray(batch["tokens"])
    total, any_right = 0.0, False
    for masked in (m, comp):
        logits = _logits(params, jnp.where(masked | later, MASK, tokens), batch["valid"])
        logp = _log_softmax(logits)
        probs = np.exp(_log_softmax(logits / 0.5))
        entropy = -(probs * np.log(probs + 1e-12)).sum(-1)
        ce, h = [], []
        for b, i in zip(*np.nonzero(masked)):
            ce.append(-logp[b, i, tokens[b, i]])
            if logits[b, i].argmax() == tokens[b, i]:
                h.append(entropy[b, i])
        any_right |= bool(h)
        total += np.mean(ce) + 2.0 * (np.mean(h) if h else 0.0)
    assert any_right
    np.testing.assert_allclose(float(value), total, rtol=1e-5)


def _raw(tmp_path, **train):
    return {"model": {**{k: v for k, v in dataclasses.asdict(CONFIG).items() if v is not None},
                      "rope_theta": 10000.0},
            "data": {"tokenizer": str(tmp_path / "tok"), "cache_dir": str(tmp_path / "cache"),
                     "corpus": "parallel_bench", "seq_len": WIDTH},
            "optim": {"lr": 1e-2, "warmup_steps": 2},
            "train": {"out": str(tmp_path / "run"), "objective": "mdm", "batch_size": 16, "log_every": 5,
                      "eval_every": 1000, "save_every": 1000, "eval_batches": 2, **train}}


def test_mdm_then_dparallel_on_its_own_answers(tmp_path, monkeypatch):
    """mdm (SFT) lowers the loss in 30 steps; its export answers prompts (static greedy), which
    dparallel fine-tunes it on; both exports load as masked-diffusion LMs."""
    monkeypatch.setattr(canvas_batches, "task_bench", lambda: BENCH)
    done = train(from_dict(_raw(tmp_path, steps=30, log_every=1)), progress=False)
    records = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    losses = [r["loss"] for r in records if r["split"] == "train"]
    assert np.mean(losses[-5:]) < np.mean(losses[:5]) - 0.5, losses
    assert done["val"]["accuracy"] > 0.3
    assert (tmp_path / "tok" / "tokenizer.json").is_file()  # the tasks' tokenizer, written on first use
    export(from_dict(_raw(tmp_path, steps=30)), tmp_path / "teacher")
    teacher = load(tmp_path / "teacher")
    assert teacher.config == CONFIG

    write_trajectories(tmp_path / "answers.npz", teacher, (), 40, WIDTH, bench=BENCH)
    with np.load(tmp_path / "answers.npz") as rows:
        assert rows["tokens"].shape == (40, WIDTH) and (rows["tokens"][:, -GEN:] != MASK).all()
    raw = _raw(tmp_path, steps=3, objective="dparallel", out=str(tmp_path / "dp"))
    raw["data"]["corpus"] = str(tmp_path / "answers.npz")
    raw["heads"] = {"target": str(tmp_path / "teacher"), "block_size": 2}
    config = from_dict(raw)
    done = train(config, progress=False)
    assert np.isfinite(done["train"]["loss"]) and "entropy" in done["val"]
    export(config, tmp_path / "student")
    assert load(tmp_path / "student").config.mask_token_id == MASK
    with pytest.raises(ValueError, match="mask_token_id must be the tasks' MASK id"):
        raw = _raw(tmp_path, steps=1)
        raw["model"]["mask_token_id"] = 4
        train(from_dict(raw), progress=False)


def test_export_appends_the_mask_token_to_a_tokenizer(code_corpus, tmp_path):
    from tokenizers import Tokenizer

    mdm.export_tokenizer(code_corpus / "tok", tmp_path, 300)
    tok = Tokenizer.from_file(str(tmp_path / "tokenizer.json"))
    assert tok.id_to_token(300) == mdm.MASK_TOKEN and tok.encode("def f(x):").ids[-1] < 300
    with pytest.raises(ValueError, match="neither in the tokenizer nor the next id"):
        mdm.export_tokenizer(code_corpus / "tok", tmp_path, 305)


ASSETS = Path(__file__).resolve().parents[1] / "specjax" / "assets"
CONFIGS = Path(__file__).resolve().parents[1] / "configs"
SHIPPED = ("tiny-dllm-code", "tiny-dllm-tasks", "tiny-dllm-tasks-dparallel")


@pytest.mark.parametrize("name", SHIPPED)
def test_shipped_dllms_match_their_configs_and_size_budget(name):
    if not (ASSETS / name / "model.safetensors").is_file():
        pytest.skip(f"{name} absent (build it with recipes/make_tiny_dllm.sh)")
    assert sum(f.stat().st_size for f in (ASSETS / name).iterdir()) < 11 * 2**20
    model = load(name)
    assert model.config == load_config(CONFIGS / f"{name}.toml").model
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(ASSETS / name / "tokenizer.json"))
    assert tok.id_to_token(model.config.mask_token_id) in (mdm.MASK_TOKEN, "<mask>")
