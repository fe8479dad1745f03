"""The clover objective (Clover-2, `specjax.heads.clover`), as its `main_clover2.py`: head i at
position t reads h_t and e(x_{t+1..t+1+i}) (the text's tokens: teacher forcing) and is trained
toward the target at t+1+i with EAGLE-1's loss shape, weighted decay^i: feature_weight
SmoothL1(o_i, f_{t+1+i}) + ce_weight CE(p_target(t+1+i), head i) (Clover-2's weights 10 and 1
and decay 0.7 in configs/clover.toml), without feature noise. Clover-2's "correctness mask"
(drop positions whose earlier tokens fall outside the target's top-p set) is not applied.
Held-out accuracies are per head, against the target's greedy token."""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np

from specjax.heads import clover as clover_head
from specjax.models import Model, forward, lm_head_weight
from specjax.train.objectives.base import Objective
from specjax.train.objectives.eagle import shifted
from specjax.train.objectives.scoring import accuracy_table, distill, greedy_rank_metrics


@dataclasses.dataclass(frozen=True)
class CloverSettings:
    """[heads] of clover."""

    target: str = "tiny"  # the target: a folder, a shipped name, or "random" (tests)
    num_heads: int = 4  # heads trained (head 0 and num_heads - 1 RNN steps)
    block_layers: int = 2  # decoder layers of the Augmenting Block
    decay: float = 0.8  # weight decay^i of head i (Clover-2: 0.7)
    feature_weight: float = 1.0  # SmoothL1 feature regression weight (Clover-2: 10)
    ce_weight: float = 0.1  # cross-entropy to the target's distribution (Clover-2: 1)
    tree_size: int = 16  # the exported drafter's tree size


def clover(s: CloverSettings) -> Objective:
    def head_config(target: Model):
        return clover_head.CloverConfig.for_target(target.config, s.block_layers, s.num_heads)

    def init(key, target):
        return clover_head.init(head_config(target), key, target.params)

    def run(params, tokens, target):
        """(head outputs, head logits, target logits, target features), each a list over heads
        of [B, T', ...]."""
        cfg, n, tc, tp = head_config(target), s.num_heads, target.config, target.params
        out = forward(tc, tp, tokens[:, :-1], return_layers=(tc.num_layers - 1,))
        out = jax.tree.map(jax.lax.stop_gradient, out)
        b, t = tokens.shape[0], tokens.shape[1] - 1 - n  # positions 0..t-1 have targets for every head
        emb = tp["embed"][tokens[:, 1: t + n]].astype(jnp.float32)  # emb[:, j] = e(x_{j+1})
        pos = jnp.broadcast_to(jnp.arange(t, dtype=jnp.int32), (b, t))
        causal = jnp.broadcast_to(jnp.tril(jnp.ones((t, t), bool)), (b, t, t))
        h, _, _ = clover_head.block(cfg, params, out.layer_hidden[0][:, :t], emb[:, :t], pos, causal)
        outs = clover_head.unroll(cfg, params, h, emb, n)
        head_w = lm_head_weight(tc, tp)
        return (outs, [clover_head.logits(o, head_w) for o in outs], shifted(out.logits, n, t),
                shifted(out.hidden, n, t))

    def loss(params, batch, key, target):
        outs, draft, target_logits, feats = run(params, batch["tokens"], target)
        total, metrics = distill(list(zip(draft, target_logits)), s.decay, "step", features=list(zip(outs, feats)),
                                 feature_weight=s.feature_weight, ce_weight=s.ce_weight)
        return total, {**metrics, "loss": total}

    def evaluate(params, batch, target):
        _, draft, target_logits, _ = run(params, batch["tokens"], target)
        return greedy_rank_metrics(list(zip(draft, target_logits)))

    def export(params, out_dir, target, held_out):
        """The head with the per-rank held-out accuracies that build the drafter's tree."""
        from specjax.drafters.clover import Clover

        Clover(jax.tree.map(np.asarray, params), head_config(target), tree_size=s.tree_size,
               accuracy=accuracy_table(held_out())).save(out_dir)

    return Objective(init, loss, evaluate, export)
