"""Training windows from the cached target features (`train.features`), memory-mapped: the
draft never runs the target. A window is T + 1 tokens of one (prompt + answer) sequence with,
at its first T positions, the fused layer outputs, the target's top-k next-token distribution
and `loss_mask` (the position predicts an answer token: p >= answer_start - 1 and p + 1 < L).
Windows start at a random offset that keeps most of the answer in view (at least T // 4 prompt
tokens before it when the sequence has them); short sequences are zero-padded and masked.
Every `HELD_OUT`-th sequence and the last are held out (their last windows); the sampler's numpy RNG state is
checkpointable, like `data.WindowSampler`."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from specjax.train import shards

HELD_OUT = 20  # every 20th sequence is held out


class FeatureWindows:
    """Random windows of `length` = T + 1 tokens (a batch dict, see `window`) over the cache in
    `folder`, fusing the cached layers `layers` (their outputs side by side: [T, len(layers) E])."""

    def __init__(self, folder: str | Path, layers: tuple[int, ...], length: int, seed: int):
        folder = Path(folder)
        if not (folder / "meta.json").is_file():
            raise FileNotFoundError(f"{folder}: not a feature cache (no meta.json; build one with "
                                    f"`python -m specjax.train distill`)")
        cached = json.loads((folder / "meta.json").read_text())["layers"]
        missing = [i for i in layers if i not in cached]
        if missing:
            raise ValueError(f"{folder} caches layers {cached}, not {missing}")
        self.taps = [cached.index(i) for i in layers]
        self.shards = [shards.read_shard(folder, i) for i in shards.finished(folder)]
        if not self.shards:
            raise FileNotFoundError(f"{folder}: no finished feature shard")
        rows = [(k, s["offsets"][j], s["offsets"][j + 1] - s["offsets"][j], s["answer_start"][j])
                for k, s in enumerate(self.shards) for j in range(len(s["answer_start"]))]
        seqs = np.array(rows, np.int64)  # shard, offset, length, answer start
        if len(seqs) < 2:
            raise ValueError(f"{folder}: {len(seqs)} sequence(s); training needs at least 2 (one held out)")
        held = (np.arange(len(seqs)) % HELD_OUT == HELD_OUT - 1) | (np.arange(len(seqs)) == len(seqs) - 1)
        self.train, self.val = seqs[~held], seqs[held]
        self.length = length
        answer = np.maximum(self.train[:, 2] - self.train[:, 3], 1).astype(np.float64)
        self.weights = answer / answer.sum()  # every answer token equally likely to be drawn
        self.rng = np.random.Generator(np.random.PCG64(seed))

    def _starts(self, seqs: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(first, last) window starts per sequence: the last window, and the earliest one
        with T // 4 positions of context before the first loss position."""
        t = self.length - 1
        last = np.maximum(seqs[:, 2] - self.length, 0)
        return np.minimum(np.maximum(seqs[:, 3] - 1 - t // 4, 0), last), last

    def window(self, seq: np.ndarray, start: int) -> dict:
        """One window: tokens int32 [T+1], features float16 [T, F], topk_ids int32 [T, k],
        topk_probs float16 [T, k], loss_mask bool [T]."""
        k, off, n, answer = (int(x) for x in seq)
        s, t = self.shards[k], self.length - 1
        a, b = off + start, off + min(start + self.length, n)
        tokens = np.zeros(self.length, np.int32)
        tokens[: b - a] = s["tokens"][a:b]
        m = min(b - a, t)
        hidden = np.asarray(s["hidden"][a: a + m])[:, self.taps]
        features = np.zeros((t, hidden.shape[1] * hidden.shape[2]), np.float16)
        features[:m] = hidden.reshape(m, -1)
        ids = np.zeros((t, s["topk_ids"].shape[1]), np.int32)
        probs = np.zeros((t, s["topk_probs"].shape[1]), np.float16)
        ids[:m], probs[:m] = s["topk_ids"][a: a + m], s["topk_probs"][a: a + m]
        p = start + np.arange(t)
        return {"tokens": tokens, "features": features, "topk_ids": ids, "topk_probs": probs,
                "loss_mask": (p >= answer - 1) & (p + 1 < n)}

    def batch(self, seqs: np.ndarray, starts: np.ndarray) -> dict:
        windows = [self.window(q, int(st)) for q, st in zip(seqs, starts)]
        return {key: np.stack([w[key] for w in windows]) for key in windows[0]}

    def next(self, batch_size: int) -> dict:
        seqs = self.train[self.rng.choice(len(self.train), batch_size, p=self.weights)]
        first, last = self._starts(seqs)
        return self.batch(seqs, self.rng.integers(first, last + 1))

    def held_out(self, count: int | None = None) -> dict:
        """The last window of `count` held-out sequences spread over the cache (all when None)."""
        seqs = self.val
        if count is not None and count < len(seqs):
            seqs = seqs[np.linspace(0, len(seqs) - 1, count).astype(int)]
        return self.batch(seqs, self._starts(seqs)[1])

    def state(self) -> dict:
        return self.rng.bit_generator.state

    def set_state(self, state: dict) -> None:
        self.rng.bit_generator.state = state
