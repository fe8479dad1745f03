"""Medusa heads (`specjax.heads.medusa`), two objectives:

- medusa1: frozen target, loss sum_k decay^k CE(head k at t, token t+2+k).
- medusa2: joint: LM loss + heads_coefficient * sum_k decay^(k+1) CE_k; the heads' learning rate
  is `lr_multiplier` times the target's (by reparametrisation: the heads are stored divided by
  the multiplier, and Adam's step is scale-free).

Held-out accuracies are against the text's tokens (as trained)."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import jax
import numpy as np

from specjax.heads import medusa as medusa_head
from specjax.models import Model, forward, lm_head_weight
from specjax.train.objectives.base import Objective
from specjax.train.objectives.scoring import accuracy_table, hard_ce, rank_metrics, top1


@dataclasses.dataclass(frozen=True)
class MedusaSettings:
    """[heads] of medusa1 and medusa2."""

    target: str = "tiny"  # the target: a folder, a shipped name, or "random" (tests)
    num_heads: int = 4
    num_layers: int = 1  # ResBlocks per head
    own_lm_head: bool = False  # a W2 per head (True) or the target's LM head (False)
    decay: float = 0.8  # weight decay^k of head k
    heads_coefficient: float = 0.2  # medusa2: weight of the head losses next to the LM loss
    lr_multiplier: float = 4.0  # medusa2: the heads' learning-rate multiplier
    tree_size: int = 16  # the exported drafter's tree size


def medusa1(settings: MedusaSettings) -> Objective:
    return _medusa(settings, joint=False)


def medusa2(settings: MedusaSettings) -> Objective:
    return _medusa(settings, joint=True)


def _medusa(s: MedusaSettings, joint: bool) -> Objective:
    def init(key, target):
        c = target.config
        params = medusa_head.init(key, s.num_heads, c.hidden_size, c.vocab_size,
                                  lm_head=lm_head_weight(c, target.params), own_lm_head=s.own_lm_head)
        if joint:
            return {"target": target.params, "heads": jax.tree.map(lambda x: x / s.lr_multiplier, params)}
        return params

    def split(params, target):
        """(target params, head params) as the forward uses them."""
        if joint:
            return params["target"], jax.tree.map(lambda x: x * s.lr_multiplier, params["heads"])
        return target.params, params

    def head_logits(params, tokens, target):
        tp, hp = split(params, target)
        out = forward(target.config, tp, tokens[:, :-1], compute_logits=joint)
        hidden = out.hidden if joint else jax.lax.stop_gradient(out.hidden)
        return out, medusa_head.apply(hp, hidden, s.num_layers, lm_head_weight(target.config, tp))  # [B,T,K,V]

    def loss(params, batch, key, target):
        tokens = batch["tokens"]
        out, logits = head_logits(params, tokens, target)
        metrics, total = {}, 0.0
        for k, (lg, lab) in enumerate(per_head(logits, tokens)):
            ce = hard_ce(lg, lab)
            total = total + (s.heads_coefficient * s.decay ** (k + 1) if joint else s.decay ** k) * ce
            metrics[f"head{k}_loss"] = ce
            metrics[f"head{k}_top1"] = top1(lg, lab)
        if joint:
            metrics["lm_loss"] = hard_ce(out.logits, tokens[:, 1:])
            total = total + metrics["lm_loss"]
        metrics["loss"] = total
        return total, metrics

    def evaluate(params, batch, target):
        return rank_metrics(per_head(head_logits(params, batch["tokens"], target)[1], batch["tokens"]))

    def export(params, out_dir, target, held_out):
        """Heads (and, for medusa2, the tuned target under target/) with the per-rank held-out
        accuracies that build the drafter's tree."""
        from specjax.drafters.medusa import Medusa

        tp, hp = split(params, target)
        Medusa(jax.tree.map(np.asarray, hp), num_layers=s.num_layers, tree_size=s.tree_size,
               accuracy=accuracy_table(held_out())).save(out_dir)
        if joint:
            import specjax

            specjax.save(Model(tp, target.config), str(Path(out_dir) / "target"), format="hf")

    return Objective(init, loss, evaluate, export)


def per_head(logits, tokens):
    """[(logits of head k at the valid t, labels t+2+k)] for each head."""
    t = tokens.shape[1] - 1
    return [(logits[:, : t - 1 - k, k], tokens[:, 2 + k:]) for k in range(logits.shape[2])]
