"""EAGLE heads (`specjax.heads.eagle`), two objectives:

- eagle (EAGLE-1): SmoothL1(f^_{t+1}, f_{t+1}) + ce_weight CE(p_target(t+1), draft logits), input
  features with uniform noise U(-noise, noise) drawn from the loss's key; `ttt_steps` > 1 also
  unrolls the draft on its own features.
- eagle3 (EAGLE-3): fused 3-layer features, training-time test over `ttt_steps` (>= 3) steps,
  loss sum_i decay^i CE(p_target, draft logits at step i).

What the head reads from the frozen target is one dict (`target_pass`): "features" and
"target_logits" per position. A batch that carries both (cached features, computed once by
`target_pass` or offline) skips the target's forward; the target then only lends its embedding
(and, for EAGLE-1, its LM head). A batch from the feature cache (`train.feature_windows`) carries
the target's top-k distribution ("topk_ids", "topk_probs") instead of logits, and "loss_mask"
(the answer positions). Held-out accuracies are per step, against the target's greedy token.

EAGLE-3 with `draft_vocab_size` < V drafts over the `token_counts`' most frequent ids (d2t,
saved with the head). The target distribution is restricted to them and renormalised: the
draft's q is zero outside at inference, and among such q the restricted p maximises the
acceptance sum_v min(p, q) (it reaches p's mass on the vocabulary), so a separate 'other'
class would only learn mass the drafter cannot use."""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np

from specjax.heads import eagle as eagle_head
from specjax.models import Model, float_lm_head, forward
from specjax.train import draft_vocab
from specjax.train.objectives.base import Objective
from specjax.train.objectives.scoring import distill, greedy_rank_metrics, rank_metrics, sparse_distill


@dataclasses.dataclass(frozen=True)
class EagleSettings:
    """[heads] of eagle and eagle3."""

    target: str = "tiny"  # the target: a folder, a shipped name, or "random" (tests)
    ttt_steps: int = 1  # draft steps unrolled in training (EAGLE-3: 3 or more)
    decay: float = 0.8  # weight decay^i of step i
    intermediate_size: int = 0  # the head layer's MLP width (0: the target's)
    target_layers: tuple[int, ...] = ()  # eagle3: the fused taps (default: EAGLE-3's rule)
    feature_weight: float = 1.0  # eagle: SmoothL1 feature regression weight
    ce_weight: float = 0.1  # eagle: cross-entropy to the target's distribution
    noise: float = 0.1  # eagle: uniform input-feature noise U(-noise, noise)
    top_k: int = 6  # the exported drafter's EAGLE-2 tree
    depth: int = 5
    total_tokens: int = 32
    draft_vocab_size: int = 0  # eagle3: the draft's vocabulary (0: the target's)
    token_counts: str = ""  # eagle3: counts.npy whose most frequent ids make that vocabulary


def eagle(settings: EagleSettings) -> Objective:
    return _eagle(settings, version=1)


def eagle3(settings: EagleSettings) -> Objective:
    return _eagle(settings, version=3)


def head_config(s: EagleSettings, version: int, target: Model) -> eagle_head.EagleConfig:
    cfg = eagle_head.EagleConfig.for_target(target.config, version, s.target_layers or None,
                                            intermediate_size=s.intermediate_size or None)
    return dataclasses.replace(cfg, draft_vocab_size=s.draft_vocab_size or None)


def target_pass(cfg: eagle_head.EagleConfig, target: Model, tokens: jax.Array) -> dict:
    """The frozen target over the windows' inputs tokens[:, :-1] ([B, T]): "features" [B, T, F]
    (EAGLE-1: the final normed hidden, F = E; EAGLE-3: the three tapped layers' outputs side by
    side, F = 3E) and "target_logits" [B, T, V]. This is what a batch may carry precomputed."""
    out = forward(target.config, target.params, tokens[:, :-1], return_layers=cfg.target_layers)
    features = out.hidden if cfg.version == 1 else jnp.concatenate(list(out.layer_hidden), -1)
    return jax.lax.stop_gradient({"features": features, "target_logits": out.logits})


def shifted(x: jax.Array, steps: int, t: int) -> list:
    """For draft steps i < steps at positions 0..t-1: x at position t+1+i (what step i predicts)."""
    return [x[:, 1 + i: 1 + i + t] for i in range(steps)]


def step_targets(seen: dict, d2t: np.ndarray | None, n: int, t: int, vocab_size: int) -> list:
    """Per draft step i < n at positions 0..t-1, what the loss compares the draft with: (target
    logits,) restricted to the draft vocabulary d2t, or, from a feature cache ("topk_ids" in
    `seen`), (top-k draft ids (-1: outside it), probabilities, loss mask)."""
    if "topk_ids" not in seen:
        logits = seen["target_logits"] if d2t is None else seen["target_logits"][..., d2t]
        return [(x,) for x in shifted(logits, n, t)]
    ids = seen["topk_ids"].astype(jnp.int32)
    if d2t is not None:
        ids = jnp.asarray(draft_vocab.target_to_draft(d2t, vocab_size))[ids]
    mask = seen.get("loss_mask", jnp.ones(ids.shape[:2], bool))
    return list(zip(*(shifted(x, n, t) for x in (ids, seen["topk_probs"], mask))))


def step_loss(draft: list, want: list, decay: float, features=(), feature_weight: float = 0.0,
              ce_weight: float = 1.0) -> tuple[jax.Array, dict]:
    """The distillation loss of draft logits per step against `step_targets` (dense or sparse),
    metrics named step{i}_..."""
    if len(want[0]) > 1:
        return sparse_distill([(d, *w) for d, w in zip(draft, want)], decay, "step", features=features,
                              feature_weight=feature_weight, ce_weight=ce_weight)
    return distill([(d, w[0]) for d, w in zip(draft, want)], decay, "step", features=features,
                   feature_weight=feature_weight, ce_weight=ce_weight)


def step_metrics(draft: list, want: list) -> dict:
    """Held-out per-rank accuracies against the target's greedy token (over the answer positions
    of a feature cache)."""
    if len(want[0]) > 1:
        return rank_metrics([(d, w[0][..., 0]) for d, w in zip(draft, want)], [w[2] for w in want])
    return greedy_rank_metrics([(d, w[0]) for d, w in zip(draft, want)])


def _eagle(s: EagleSettings, version: int) -> Objective:
    if s.ttt_steps < 1:
        raise ValueError(f"ttt_steps must be >= 1, got {s.ttt_steps}")
    if s.draft_vocab_size and version == 1:
        raise ValueError("draft_vocab_size is for eagle3 (EAGLE-1 drafts with the target's LM head)")
    d2t = draft_vocab.from_settings(s)

    def init(key, target):
        return eagle_head.init(head_config(s, version, target), key, target.params, d2t=d2t)

    def run(params, batch, key, target):
        """(head outputs, draft logits, targets (see `targets`), target features), each a list
        over steps of [B, T', ...]; `key` None: no feature noise."""
        cfg, n, tokens = head_config(s, version, target), s.ttt_steps, batch["tokens"]
        seen = batch if "features" in batch else target_pass(cfg, target, tokens)
        t = tokens.shape[1] - 1 - n  # positions 0..t-1 have targets for every step
        f = seen["features"][:, :t]
        feat = eagle_head.target_feature(cfg, params, f, None if version == 1 else jnp.split(f, 3, -1))
        if key is not None and version == 1 and s.noise > 0:
            feat = feat + jax.random.uniform(key, feat.shape, minval=-s.noise, maxval=s.noise)
        emb = eagle_head.embed(params, target.params["embed"], tokens[:, 1: t + n])
        hs = eagle_head.unroll(cfg, params, emb, feat, n)
        head_w = float_lm_head(target.config, target.params)
        draft = [eagle_head.logits(cfg, params, h, head_w) for h in hs]
        return hs, draft, step_targets(seen, d2t, n, t, target.config.vocab_size), shifted(seen["features"], n, t)

    def loss(params, batch, key, target):
        hs, draft, want, feats = run(params, batch, key, target)
        total, metrics = step_loss(draft, want, s.decay, features=list(zip(hs, feats)) if version == 1 else (),
                                   feature_weight=s.feature_weight, ce_weight=s.ce_weight if version == 1 else 1.0)
        return total, {**metrics, "loss": total}

    def evaluate(params, batch, target):
        _, draft, want, _ = run(params, batch, None, target)
        return step_metrics(draft, want)

    def export(params, out_dir, target, held_out):
        from specjax.drafters.eagle import Eagle

        params = jax.tree.map(np.asarray, params)
        Eagle(params if d2t is None else {**params, "d2t": d2t}, head_config(s, version, target), top_k=s.top_k,
              depth=s.depth, total_tokens=s.total_tokens).save(out_dir, target)

    def feature_layers(target_config):
        return eagle_head.EagleConfig.for_target(target_config, 3, s.target_layers or None).target_layers

    return Objective(init, loss, evaluate, export, feature_layers if version == 3 else None)
