"""A reduced draft vocabulary (EAGLE-3, FR-Spec): the target's most frequent output tokens, so
the draft's LM head is a fraction of the target's. `d2t[i]` is the target id of draft id i.
Verification stays exact: the draft's q is zero outside this set."""

from __future__ import annotations

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
