"""A reduced draft vocabulary for heads that read the target's LM head (Medusa, Clover), as
FR-Spec does: params["d2t"] int32[Vd] lists the target ids the head drafts, so its logits are the
LM head's d2t columns only (a fraction of the target's head read per draft step) and the ids it
picks map back through d2t. Drafts are deterministic top-k, so verification is unchanged."""

from __future__ import annotations

import jax
import numpy as np


def lm_head(params: dict, target_lm_head: jax.Array) -> jax.Array:
    """The LM head [E, Vd] the head drafts with: the target's [E, V], or its d2t columns."""
    return target_lm_head if "d2t" not in params else target_lm_head[:, params["d2t"]]


def target_ids(params: dict, ids: jax.Array) -> jax.Array:
    """Draft ids -> target ids (the same ids without a reduced vocabulary)."""
    return ids if "d2t" not in params else params["d2t"][ids]


def check_ids(params: dict, vocab_size: int, name: str) -> None:
    """A one-line error unless d2t (when there) lists distinct ids of a `vocab_size` target."""
    if "d2t" not in params:
        return
    d2t = np.asarray(params["d2t"])
    if d2t.ndim != 1 or d2t.dtype.kind not in "iu" or len(np.unique(d2t)) != len(d2t) \
            or d2t.min(initial=0) < 0 or d2t.max(initial=0) >= vocab_size:
        raise ValueError(f"{name} head's draft vocabulary (d2t) is not a set of distinct ids of the "
                         f"target's vocabulary [0, {vocab_size})")


__all__ = ["lm_head", "target_ids", "check_ids"]
