"""The pieces the objectives share, as plain functions: cross-entropies, SmoothL1, top-k hits
and the held-out per-rank accuracies that build a drafter's sparse tree."""

from __future__ import annotations

import jax
import jax.numpy as jnp

RANKS = 10  # ranks whose held-out hit rates are measured (the sparse tree's candidates)


def next_token_loss(logits: jax.Array, targets: jax.Array) -> tuple[jax.Array, jax.Array]:
    """Mean cross-entropy and accuracy of float logits [B,T,V] against int targets [B,T]."""
    logp = jax.nn.log_softmax(logits.astype(jnp.float32), axis=-1)
    nll = -jnp.take_along_axis(logp, targets[..., None], axis=-1)[..., 0]
    acc = (jnp.argmax(logits, axis=-1) == targets).astype(jnp.float32)
    return nll.mean(), acc.mean()


def token_nll(logits: jax.Array, labels: jax.Array) -> jax.Array:
    """-log softmax(logits)[label] per position (float32), [B, T] from logits [B, T, V]."""
    logp = jax.nn.log_softmax(logits.astype(jnp.float32), -1)
    return -jnp.take_along_axis(logp, labels[..., None], -1)[..., 0]


def hard_ce(logits: jax.Array, labels: jax.Array, mask: jax.Array | None = None) -> jax.Array:
    """Mean over positions [B, T'] (those `mask` keeps, when given) of -log q(label)."""
    logp = jax.nn.log_softmax(logits, -1)
    return masked_mean(-jnp.take_along_axis(logp, labels[..., None], -1)[..., 0], mask)


def soft_ce(target_logits: jax.Array, logits: jax.Array) -> jax.Array:
    """Mean over positions of -sum_v p_target(v) log q(v)."""
    p = jax.nn.softmax(target_logits.astype(jnp.float32), -1)
    return -(p * jax.nn.log_softmax(logits, -1)).sum(-1).mean()


def entropy(logits: jax.Array) -> jax.Array:
    """Mean over positions of the entropy of softmax(logits)."""
    logp = jax.nn.log_softmax(logits.astype(jnp.float32), -1)
    return -(jnp.exp(logp) * logp).sum(-1).mean()


def smooth_l1(x: jax.Array) -> jax.Array:
    ax = jnp.abs(x)
    return jnp.where(ax < 1.0, 0.5 * x * x, ax - 0.5)


def top1_hits(logits: jax.Array, labels: jax.Array) -> jax.Array:
    """float 1 where the argmax is the label."""
    return (jnp.argmax(logits, -1) == labels).astype(jnp.float32)


def top1(logits: jax.Array, labels: jax.Array) -> jax.Array:
    """The fraction of positions whose argmax is the label."""
    return top1_hits(logits, labels).mean()


def masked_mean(x: jax.Array, mask: jax.Array | None) -> jax.Array:
    """The mean of x over its leading axes where `mask` (their shape) holds; all when None."""
    if mask is None:
        return x.mean((0, 1))
    m = mask.astype(jnp.float32).reshape(mask.shape + (1,) * (x.ndim - mask.ndim))
    return (x * m).sum((0, 1)) / jnp.maximum(m.sum((0, 1)), 1.0)


def rank_metrics(pairs, masks=None) -> dict:
    """Per (logits, labels) pair: top-1, top-5 and the per-rank hit rates [RANKS] of the labels
    (over the positions `masks[i]` keeps, when given)."""
    first, five, rank = [], [], []
    for i, (logits, labels) in enumerate(pairs):
        hit = (jax.lax.top_k(logits, RANKS)[1] == labels[..., None]).astype(jnp.float32)  # [B, T', R]
        mask = None if masks is None else masks[i]
        rank.append(masked_mean(hit, mask))
        first.append(rank[-1][0])
        five.append(rank[-1][:5].sum())
    return {"top1": jnp.stack(first), "top5": jnp.stack(five), "rank_accuracy": jnp.stack(rank)}


def accuracy_table(held_out: dict) -> tuple:
    """The held-out per-rank accuracies [K][RANKS] (floored at 1e-4) that build a sparse tree."""
    return tuple(tuple(round(max(a, 1e-4), 4) for a in row) for row in held_out["rank_accuracy"])


def distill(pairs, decay: float, name: str, features=(), feature_weight: float = 0.0,
            ce_weight: float = 1.0) -> tuple[jax.Array, dict]:
    """Distillation toward the frozen target over draft steps (EAGLE, Clover) or guesses (PPD,
    Hidden Transfer). pairs: [(draft logits, target logits)] per step i; features: [(draft
    output, target feature)] per step, or () for no feature regression. Loss sum_i decay^i
    (feature_weight SmoothL1 + ce_weight CE(p_target, draft)); metrics per step: {name}{i}_ce,
    _kl (KL(target || draft): 0 at a perfect draft), _top1 (against the target's greedy token),
    _feature_loss."""
    total, metrics = 0.0, {}
    for i, (d, tl) in enumerate(pairs):
        ce = soft_ce(tl, d)
        step = ce_weight * ce
        if features:
            out, feat = features[i]
            metrics[f"{name}{i}_feature_loss"] = jnp.mean(smooth_l1(out - feat))
            step = feature_weight * metrics[f"{name}{i}_feature_loss"] + step
        total = total + decay ** i * step
        metrics[f"{name}{i}_ce"] = ce
        metrics[f"{name}{i}_kl"] = ce - entropy(tl)
        metrics[f"{name}{i}_top1"] = top1(d, jnp.argmax(tl, -1))
    return total, metrics


def greedy_rank_metrics(pairs) -> dict:
    """`rank_metrics` of each draft's logits against the target's greedy token, what decides
    acceptance. pairs: [(draft logits, target logits)]."""
    return rank_metrics([(d, jnp.argmax(tl, -1)) for d, tl in pairs])


def sparse_distill(steps, decay: float, name: str, features=(), feature_weight: float = 0.0,
                   ce_weight: float = 1.0) -> tuple[jax.Array, dict]:
    """`distill` toward a sparse target: per draft step i, (draft logits [B,T',Vd], the
    target's top-k ids in the draft vocabulary [B,T',k] (-1: outside it), their probabilities,
    loss mask [B,T']). The target is restricted to the draft vocabulary and renormalised; a
    position with no mass there is masked. Features and metrics as `distill`'s, over the
    kept positions; _top1 against the target's greedy token (a miss when outside the vocabulary)."""
    total, metrics = 0.0, {}
    for i, (d, ids, probs, mask) in enumerate(steps):
        w = jnp.where(ids >= 0, probs.astype(jnp.float32), 0.0)
        mass = w.sum(-1)
        w = w / jnp.maximum(mass, 1e-9)[..., None]
        if features:
            out, feat = features[i]
            metrics[f"{name}{i}_feature_loss"] = masked_mean(smooth_l1(out - feat).mean(-1), mask)
        mask = mask & (mass > 0)
        logq = jnp.take_along_axis(jax.nn.log_softmax(d, -1), jnp.maximum(ids, 0), -1)
        ce = masked_mean(-(w * logq).sum(-1), mask)
        step = ce_weight * ce
        if features:
            step = feature_weight * metrics[f"{name}{i}_feature_loss"] + step
        total = total + decay ** i * step
        metrics[f"{name}{i}_ce"] = ce
        metrics[f"{name}{i}_kl"] = ce - masked_mean(-(w * jnp.log(jnp.maximum(w, 1e-30))).sum(-1), mask)
        metrics[f"{name}{i}_top1"] = masked_mean(top1_hits(d, ids[..., 0]), mask)
    return total, metrics
