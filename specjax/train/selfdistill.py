"""Self-distillation data for draft heads (EAGLE/Medusa recipe): the target answers the training
prompts (`specjax.data.distill_prompts`) itself, in large batches sampled at several
temperatures, so the heads learn what they will draft. Then its features are cached once
(`train.features`).

`python -m specjax.train distill --model smollm2 --out runs/smollm2-distill --num-prompts 1500`

Layout of --out: `prompts.jsonl` (the rows), `answers/` (shards: `tokens` prompt + answer ids
packed with `offsets`, `answer_start` per sequence, `prompt_index`, `temperature`),
`features/` (see `train.features`), `progress.jsonl` (one line per finished shard: wall and
CPU seconds, tokens). Prompts
are sorted by length into batches (little padding); shard i samples at temperature
`temperatures[i % len]` with a key from the seed and i, so every shard is reproducible and a
rerun after a kill resumes where it stopped."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import time
from pathlib import Path

import jax
import numpy as np
from tqdm import tqdm

from specjax.data.chat import prompt_ids
from specjax.data.distill_prompts import build_prompts
from specjax.decoding import generate
from specjax.train import shards


@dataclasses.dataclass(frozen=True)
class DistillConfig:
    model: str
    out: str
    num_prompts: int = 1500
    batch_size: int = 32
    max_new_tokens: int = 192
    temperatures: tuple[float, ...] = (0.0, 0.7, 1.0)
    seed: int = 0
    max_prompt_tokens: int = 768

    def __post_init__(self):
        if self.num_prompts < 1 or self.batch_size < 1 or self.max_new_tokens < 1 or self.max_prompt_tokens < 1:
            raise ValueError("num_prompts, batch_size, max_new_tokens and max_prompt_tokens must be >= 1")
        if not self.temperatures or any(t < 0 for t in self.temperatures):
            raise ValueError(f"temperatures must be a non-empty list of values >= 0, got {self.temperatures}")


def encode_prompts(cfg: DistillConfig, tokenizer) -> tuple[list[dict], list[list[int]]]:
    """The training rows and their ids (rows longer than `max_prompt_tokens` left out)."""
    rows, ids = [], []
    for row in build_prompts(cfg.num_prompts, cfg.seed):
        p = prompt_ids(tokenizer, row)
        if len(p) <= cfg.max_prompt_tokens:
            rows.append(row)
            ids.append(p)
    return rows, ids


def shard_plan(lengths, batch_size: int) -> list[np.ndarray]:
    """Prompt indices per shard: sorted by length, `batch_size` at a time."""
    order = np.argsort(np.asarray(lengths), kind="stable")
    return [order[i: i + batch_size] for i in range(0, len(order), batch_size)]


def generate_answers(model, tokenizer, cfg: DistillConfig, progress: bool = True) -> Path:
    """Write every missing answer shard under `cfg.out/answers`; returns that folder."""
    out = Path(cfg.out)
    rows, ids = encode_prompts(cfg, tokenizer)
    digest = hashlib.sha256(json.dumps(ids).encode()).hexdigest()[:16]
    folder = shards.open_run(out / "answers", {**dataclasses.asdict(cfg), "out": None, "prompts_sha": digest,
                                               "num_kept": len(ids)})
    if not (out / "prompts.jsonl").is_file():
        (out / "prompts.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    plan = shard_plan([len(p) for p in ids], cfg.batch_size)
    todo = [i for i in np.random.default_rng(cfg.seed).permutation(len(plan)) if not shards.is_done(folder, i)]
    bar = tqdm(total=len(plan), initial=len(plan) - len(todo), desc="answers", unit="shard",
               disable=not progress, dynamic_ncols=True)
    for i in todo:
        t0, cpu0, temperature = time.perf_counter(), time.process_time(), cfg.temperatures[i % len(cfg.temperatures)]
        prompts = [ids[j] for j in plan[i]]
        res = generate(model, prompts, max_new_tokens=cfg.max_new_tokens, temperature=temperature,
                          key=jax.random.fold_in(jax.random.key(cfg.seed), i),
                          eos_token_id=list(tokenizer.eos_token_ids) or None)
        answers = [res.tokens[r, : res.num_tokens[r]] for r in range(len(prompts))]
        tokens, offsets = shards.pack([np.concatenate([p, a]).astype(np.int32) for p, a in zip(prompts, answers)])
        shards.write_shard(folder, i, {"tokens": tokens, "offsets": offsets,
                                       "answer_start": np.array([len(p) for p in prompts], np.int32),
                                       "prompt_index": plan[i].astype(np.int32),
                                       "temperature": np.float32(temperature)})
        seconds, new = time.perf_counter() - t0, int(res.num_tokens.sum())
        _log(out, {"stage": "answers", "shard": int(i), "seconds": round(seconds, 2),
                   "cpu_seconds": round(time.process_time() - cpu0, 2), "new_tokens": new,
                   "prompt_tokens": int(sum(map(len, prompts))), "temperature": temperature})
        bar.set_postfix(tok_s=f"{new / seconds:.1f}")
        bar.update()
    bar.close()
    return folder


def sequences(answers: str | Path):
    """Yield (shard index, token ids, answer start) for every finished answer shard."""
    for i in shards.finished(answers):
        s = shards.read_shard(answers, i)
        for j in range(len(s["answer_start"])):
            yield i, np.asarray(shards.unpack(s["tokens"], s["offsets"], j)), int(s["answer_start"][j])


def _log(out: Path, record: dict) -> None:
    with open(out / "progress.jsonl", "a") as f:
        f.write(json.dumps({"time": time.strftime("%Y-%m-%dT%H:%M:%S"), **record}) + "\n")
