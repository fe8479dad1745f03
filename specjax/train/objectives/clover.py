"""The clover objective (Clover-2, `specjax.heads.clover`), as its `main_clover2.py`: head i at
position t reads h_t and e(x_{t+1..t+1+i}) (the text's tokens: teacher forcing) and is trained
toward the target at t+1+i with EAGLE-1's loss shape, weighted decay^i: feature_weight
SmoothL1(o_i, f_{t+1+i}) + ce_weight CE(p_target(t+1+i), head i) (Clover-2's weights 10 and 1
and decay 0.7 in configs/clover.toml), without feature noise. Clover-2's "correctness mask"
(drop positions whose earlier tokens fall outside the target's top-p set) is not applied.
Held-out accuracies are per head, against the target's greedy token.

Like eagle3, clover also trains from a feature cache (`[data] features`: the target's last layer,
normed here for the feature targets; the cached top-k distribution for the CE, over the answer
positions) and with `draft_vocab_size` over a reduced draft vocabulary (d2t, saved with the
head; the target distribution restricted to it and renormalised, as eagle3's)."""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np

from specjax.heads import clover as clover_head
from specjax.heads import vocab
from specjax.models import Model, float_lm_head, forward
from specjax.models.llama import norm
from specjax.train import draft_vocab
from specjax.train.objectives.base import Objective, last_layer
from specjax.train.objectives.eagle import shifted, step_loss, step_metrics, step_targets
from specjax.train.objectives.scoring import accuracy_table


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
    draft_vocab_size: int = 0  # the head's draft vocabulary (0: the target's)
    token_counts: str = ""  # counts.npy whose most frequent ids make that vocabulary


def clover(s: CloverSettings) -> Objective:
    d2t = draft_vocab.from_settings(s)
    reduced = {} if d2t is None else {"d2t": d2t}  # what the head drafts over (`specjax.heads.vocab`)

    def head_config(target: Model):
        return clover_head.CloverConfig.for_target(target.config, s.block_layers, s.num_heads)

    def init(key, target):
        return clover_head.init(head_config(target), key, target.params)

    def run(params, batch, target):
        """(head outputs, head logits, targets (`eagle.step_targets`), target features), each a
        list over heads of [B, T', ...]."""
        cfg, n, tc, tp, tokens = head_config(target), s.num_heads, target.config, target.params, batch["tokens"]
        if "features" in batch:  # the cached last layer
            last = batch["features"].astype(jnp.float32)
            seen = {**batch, "hidden": norm(tc, last, tp["norm"])}
        else:
            out = jax.lax.stop_gradient(forward(tc, tp, tokens[:, :-1], return_layers=(tc.num_layers - 1,)))
            last, seen = out.layer_hidden[0], {"hidden": out.hidden, "target_logits": out.logits}
        b, t = tokens.shape[0], tokens.shape[1] - 1 - n  # positions 0..t-1 have targets for every head
        emb = tp["embed"][tokens[:, 1: t + n]].astype(jnp.float32)  # emb[:, j] = e(x_{j+1})
        pos = jnp.broadcast_to(jnp.arange(t, dtype=jnp.int32), (b, t))
        causal = jnp.broadcast_to(jnp.tril(jnp.ones((t, t), bool)), (b, t, t))
        h, _, _ = clover_head.block(cfg, params, last[:, :t], emb[:, :t], pos, causal)
        outs = clover_head.unroll(cfg, params, h, emb, n)
        head_w = vocab.lm_head(reduced, float_lm_head(tc, tp))
        return (outs, [clover_head.logits(o, head_w) for o in outs], step_targets(seen, d2t, n, t, tc.vocab_size),
                shifted(seen["hidden"], n, t))

    def loss(params, batch, key, target):
        outs, draft, want, feats = run(params, batch, target)
        total, metrics = step_loss(draft, want, s.decay, features=list(zip(outs, feats)),
                                   feature_weight=s.feature_weight, ce_weight=s.ce_weight)
        return total, {**metrics, "loss": total}

    def evaluate(params, batch, target):
        _, draft, want, _ = run(params, batch, target)
        return step_metrics(draft, want)

    def export(params, out_dir, target, held_out):
        """The head with the per-rank held-out accuracies that build the drafter's tree."""
        from specjax.drafters.clover import Clover

        Clover(jax.tree.map(np.asarray, {**params, **reduced}), head_config(target), tree_size=s.tree_size,
               accuracy=accuracy_table(held_out())).save(out_dir, target)

    return Objective(init, loss, evaluate, export, last_layer)
