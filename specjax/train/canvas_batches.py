"""Canvas batches, what the masked-diffusion objectives train on in the SFT form (`mdm`,
`dparallel`): rows in the layout the samplers decode (`specjax.diffusion.make_canvas`), a
left-padded prompt then the G answer slots, here holding the answer and its EOS padding.
A batch is {"tokens" int32 [B, T], "valid" bool [B, T] (False at the pads, hidden from
attention), "answer" bool [B, T] (the G slots)}, T = [data] seq_len for every batch.

Two sources: `TaskBatches` draws fresh seeded examples of the ParallelBench-style tasks
(`specjax.data.parallel_bench`, `[data] corpus = "parallel_bench"`) each step; `CanvasFile`
reads the rows of a saved .npz (`save`; the teacher trajectories dParallel distills)."""

from __future__ import annotations

import importlib
from pathlib import Path
from typing import Sequence

import numpy as np

from specjax.diffusion import make_canvas

HELD_OUT_SEED = 1_000_003  # added to the run's seed for the held-out examples


def prompt_canvas(prompts: Sequence[Sequence[int]], width: int, gen_length: int, mask_id: int,
                  pad_id: int) -> tuple[np.ndarray, np.ndarray]:
    """(tokens, valid) [B, width]: `make_canvas`'s rows, prompts left-padded to `width - gen_length`."""
    longest = max((len(p) for p in prompts), default=0)
    if longest > width - gen_length:
        raise ValueError(f"a prompt of {longest} tokens does not fit [data] seq_len {width} with "
                         f"{gen_length} answer slots")
    canvas = make_canvas(prompts, gen_length, mask_id, pad_id, prompt_width=width - gen_length)
    return np.array(canvas.tokens), np.array(canvas.valid)


def canvas_batch(prompts: Sequence[Sequence[int]], answers: Sequence[Sequence[int]], width: int,
                 gen_length: int, mask_id: int, pad_id: int, eos_id: int) -> dict:
    """The batch of (prompt, answer) id lists: each prompt left-padded to `width - gen_length`,
    each answer followed by EOS up to `gen_length` (EOS padding is trained on)."""
    tokens, valid = prompt_canvas(prompts, width, gen_length, mask_id, pad_id)
    for row, answer in enumerate(answers):
        if len(answer) > gen_length:
            raise ValueError(f"an answer of {len(answer)} tokens does not fit {gen_length} slots")
        tokens[row, width - gen_length:] = list(answer) + [eos_id] * (gen_length - len(answer))
    return {"tokens": tokens, "valid": valid, "answer": answer_slots(tokens.shape, gen_length)}


def answer_slots(shape: tuple[int, int], gen_length: int) -> np.ndarray:
    """bool [B, T]: the last `gen_length` positions of each row."""
    slots = np.zeros(shape, bool)
    slots[:, shape[1] - gen_length:] = True
    return slots


def task_bench(name: str = "specjax.data.parallel_bench"):
    """The task module (sample, encode, tokenizer, TASKS, GEN_LENGTH, PAD_ID, EOS_ID, MASK_ID)."""
    return importlib.import_module(name)


class TaskBatches:
    """Fresh examples of `tasks` (all of the bench's when empty), a task drawn uniformly per row,
    from a seeded numpy RNG whose state `state`/`set_state` checkpoint."""

    def __init__(self, tasks: Sequence[str], width: int, seed: int, bench=None):
        self.bench = bench or task_bench()
        self.tasks = tuple(tasks) or tuple(self.bench.TASKS)
        unknown = set(self.tasks) - set(self.bench.TASKS)
        if unknown:
            raise ValueError(f"unknown task(s) {', '.join(sorted(unknown))}; known: {', '.join(self.bench.TASKS)}")
        self.width, self.seed = width, seed
        self.rng = np.random.Generator(np.random.PCG64(seed))

    def examples(self, count: int, rng: np.random.Generator) -> list:
        return [self.bench.sample(self.tasks[rng.integers(len(self.tasks))], rng) for _ in range(count)]

    def batch(self, examples) -> dict:
        b = self.bench
        pairs = [b.encode(e) for e in examples]
        return canvas_batch([p for p, _ in pairs], [a for _, a in pairs], self.width, b.GEN_LENGTH,
                            b.MASK_ID, b.PAD_ID, b.EOS_ID)

    def next(self, batch_size: int) -> dict:
        return self.batch(self.examples(batch_size, self.rng))

    def held_out(self, count: int) -> dict:
        """`count` examples from a seed of their own (the same every call)."""
        return self.batch(self.examples(count, np.random.Generator(np.random.PCG64(self.seed + HELD_OUT_SEED))))

    def state(self) -> dict:
        return self.rng.bit_generator.state

    def set_state(self, state: dict) -> None:
        self.rng.bit_generator.state = state


def save(path: str | Path, batch: dict) -> None:
    """Write canvas rows (a batch dict) to the .npz `path` (as named) that `CanvasFile` reads."""
    with open(path, "wb") as f:
        np.savez(f, **{k: np.asarray(v) for k, v in batch.items()})


class CanvasFile:
    """Random rows of a saved canvas file; the last `held_out` rows are kept for evaluation."""

    def __init__(self, path: str | Path, width: int, seed: int, held_out: int):
        with np.load(path) as data:
            self.rows = {k: data[k] for k in ("tokens", "valid", "answer")}
        n, t = self.rows["tokens"].shape
        if t != width:
            raise ValueError(f"{path}: rows of {t} tokens, but [data] seq_len is {width}")
        if n <= held_out:
            raise ValueError(f"{path}: {n} rows, not more than the {held_out} held out")
        self.train, self.held = n - held_out, held_out
        self.rng = np.random.Generator(np.random.PCG64(seed))

    def next(self, batch_size: int) -> dict:
        idx = self.rng.integers(0, self.train, size=batch_size)
        return {k: v[idx] for k, v in self.rows.items()}

    def held_out(self) -> dict:
        return {k: v[self.train:] for k, v in self.rows.items()}

    def state(self) -> dict:
        return self.rng.bit_generator.state

    def set_state(self, state: dict) -> None:
        self.rng.bit_generator.state = state
