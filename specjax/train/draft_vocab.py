"""A reduced draft vocabulary (EAGLE-3, FR-Spec): the target's most frequent output tokens, so
the draft's LM head is a fraction of the target's. `d2t[i]` is the target id of draft id i.
Verification stays exact: the draft's q is zero outside this set."""

from __future__ import annotations

from pathlib import Path

import numpy as np


def token_counts(answers, vocab_size: int) -> np.ndarray:
    """int64[vocab_size]: how often each token occurs in the target's answers, from
    (token ids, answer start) pairs."""
    counts = np.zeros(vocab_size, np.int64)
    for tokens, start in answers:
        counts += np.bincount(np.asarray(tokens[start:]), minlength=vocab_size)[:vocab_size]
    return counts


def draft_vocabulary(counts: np.ndarray, size: int) -> np.ndarray:
    """d2t int32[min(size, V)]: the `size` most frequent ids (ties to the smaller id), ascending."""
    if size < 1:
        raise ValueError(f"draft vocabulary size must be >= 1, got {size}")
    order = np.lexsort((np.arange(len(counts)), -counts))  # by count desc, then id
    return np.sort(order[:size]).astype(np.int32)


def coverage(counts: np.ndarray, d2t: np.ndarray) -> float:
    """The share of answer tokens that the draft vocabulary holds."""
    total = counts.sum()
    return float(counts[d2t].sum() / total) if total else 0.0


def from_settings(settings) -> np.ndarray | None:
    """d2t of the reduced vocabulary a [heads] section asks for (`draft_vocab_size` ids of its
    `token_counts` file); None: the target's."""
    if not settings.draft_vocab_size:
        return None
    if not settings.token_counts:
        raise ValueError("[heads] draft_vocab_size needs token_counts (a feature cache's counts.npy)")
    if not Path(settings.token_counts).is_file():
        raise FileNotFoundError(f"[heads] token_counts: no file {settings.token_counts} (a feature cache's "
                                f"counts.npy, written by `python -m specjax.train distill`)")
    return draft_vocabulary(np.load(settings.token_counts), settings.draft_vocab_size)


def target_to_draft(d2t: np.ndarray, vocab_size: int) -> np.ndarray:
    """int32[vocab_size]: the draft id of each target id, -1 outside the draft vocabulary."""
    t2d = np.full(vocab_size, -1, np.int32)
    t2d[d2t] = np.arange(len(d2t), dtype=np.int32)
    return t2d
