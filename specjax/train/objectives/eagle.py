"""EAGLE heads (`specjax.heads.eagle`), two objectives:

- eagle (EAGLE-1): SmoothL1(f^_{t+1}, f_{t+1}) + ce_weight CE(p_target(t+1), draft logits), input
  features with uniform noise U(-noise, noise) drawn from the loss's key; `ttt_steps` > 1 also
  unrolls the draft on its own features.
- eagle3 (EAGLE-3): fused 3-layer features, training-time test over `ttt_steps` (>= 3) steps,
  loss sum_i decay^i CE(p_target, draft logits at step i).

What the head reads from the frozen target is one dict (`target_pass`): "features" and
"target_logits" per position. A batch that carries both (cached features, computed once by
`target_pass` or offline) skips the target's forward; the target then only lends its embedding
(and, for EAGLE-1, its LM head). Held-out accuracies are per step, against the target's greedy
token."""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np

from specjax.heads import eagle as eagle_head
from specjax.models import Model, forward, lm_head_weight
from specjax.train.objectives.base import Objective
from specjax.train.objectives.scoring import distill, greedy_rank_metrics


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


def eagle(settings: EagleSettings) -> Objective:
    return _eagle(settings, version=1)


def eagle3(settings: EagleSettings) -> Objective:
    return _eagle(settings, version=3)


def head_config(s: EagleSettings, version: int, target: Model) -> eagle_head.EagleConfig:
    return eagle_head.EagleConfig.for_target(target.config, version, s.target_layers or None,
                                             intermediate_size=s.intermediate_size or None)


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


def _eagle(s: EagleSettings, version: int) -> Objective:
    if s.ttt_steps < 1:
        raise ValueError(f"ttt_steps must be >= 1, got {s.ttt_steps}")

    def init(key, target):
        return eagle_head.init(head_config(s, version, target), key, target.params)

    def run(params, batch, key, target):
        """(head outputs, draft logits, target logits, target features), each a list over steps
        of [B, T', ...]; `key` None: no feature noise."""
        cfg, n, tokens = head_config(s, version, target), s.ttt_steps, batch["tokens"]
        seen = batch if "features" in batch else target_pass(cfg, target, tokens)
        t = tokens.shape[1] - 1 - n  # positions 0..t-1 have targets for every step
        f = seen["features"][:, :t]
        feat = eagle_head.target_feature(cfg, params, f, None if version == 1 else jnp.split(f, 3, -1))
        if key is not None and version == 1 and s.noise > 0:
            feat = feat + jax.random.uniform(key, feat.shape, minval=-s.noise, maxval=s.noise)
        emb = eagle_head.embed(params, target.params["embed"], tokens[:, 1: t + n])
        hs = eagle_head.unroll(cfg, params, emb, feat, n)
        head_w = lm_head_weight(target.config, target.params)
        draft = [eagle_head.logits(cfg, params, h, head_w) for h in hs]
        return hs, draft, shifted(seen["target_logits"], n, t), shifted(seen["features"], n, t)

    def loss(params, batch, key, target):
        hs, draft, target_logits, feats = run(params, batch, key, target)
        total, metrics = distill(list(zip(draft, target_logits)), s.decay, "step",
                                 features=list(zip(hs, feats)) if version == 1 else (),
                                 feature_weight=s.feature_weight, ce_weight=s.ce_weight if version == 1 else 1.0)
        return total, {**metrics, "loss": total}

    def evaluate(params, batch, target):
        _, draft, target_logits, _ = run(params, batch, None, target)
        return greedy_rank_metrics(list(zip(draft, target_logits)))

    def export(params, out_dir, target, held_out):
        from specjax.drafters.eagle import Eagle

        Eagle(jax.tree.map(np.asarray, params), head_config(s, version, target), top_k=s.top_k, depth=s.depth,
              total_tokens=s.total_tokens).save(out_dir)

    return Objective(init, loss, evaluate, export)
