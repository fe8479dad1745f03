"""Medusa heads (`specjax.heads.medusa`), two objectives:

- medusa1: frozen target, loss sum_k decay^k CE(head k at t, token t+2+k).
- medusa2: joint: LM loss + heads_coefficient * sum_k decay^(k+1) CE_k; the heads' learning rate
  is `lr_multiplier` times the target's (by reparametrisation: the heads are stored divided by
  the multiplier, and Adam's step is scale-free).

medusa1 also trains from a feature cache (`[data] features`: the target's last layer, normed
here, so the target never runs) over the answer positions, and with `draft_vocab_size` over a
reduced draft vocabulary (FR-Spec; labels outside it are left out of the loss and count as
misses in the held-out accuracies). Held-out accuracies are against the text's tokens (as trained)."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

from specjax.convert import save
from specjax.heads import medusa as medusa_head
from specjax.models import Model, float_lm_head, forward
from specjax.models.llama import norm
from specjax.train import draft_vocab
from specjax.train.objectives.base import Objective, last_layer
from specjax.train.objectives.scoring import accuracy_table, hard_ce, masked_mean, rank_metrics, top1_hits


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
    draft_vocab_size: int = 0  # medusa1: the heads' draft vocabulary (0: the target's)
    token_counts: str = ""  # counts.npy whose most frequent ids make that vocabulary


def medusa1(settings: MedusaSettings) -> Objective:
    return _medusa(settings, joint=False)


def medusa2(settings: MedusaSettings) -> Objective:
    return _medusa(settings, joint=True)


def _medusa(s: MedusaSettings, joint: bool) -> Objective:
    if joint and s.draft_vocab_size:
        raise ValueError("draft_vocab_size is for medusa1 (medusa2 tunes the target's own LM head)")
    d2t = draft_vocab.from_settings(s)
    reduced = {} if d2t is None else {"d2t": d2t}  # what the heads draft over (`specjax.heads.vocab`)

    def init(key, target):
        c = target.config
        params = medusa_head.init(key, s.num_heads, c.hidden_size, c.vocab_size,
                                  lm_head=float_lm_head(c, target.params), own_lm_head=s.own_lm_head)
        if joint:
            return {"target": target.params, "heads": jax.tree.map(lambda x: x / s.lr_multiplier, params)}
        return params

    def split(params, target):
        """(target params, head params) as the forward uses them."""
        if joint:
            return params["target"], jax.tree.map(lambda x: x * s.lr_multiplier, params["heads"])
        return target.params, params

    def head_logits(params, batch, target):
        """(target output or None, head logits [B,T,K,Vd]): from the cached last layer when the
        batch carries it, else from the target's forward over tokens[:, :-1]."""
        tp, hp = split(params, target)
        if "features" in batch:
            out, hidden = None, norm(target.config, batch["features"].astype(jnp.float32), tp["norm"])
        else:
            out = forward(target.config, tp, batch["tokens"][:, :-1], compute_logits=joint)
            hidden = out.hidden if joint else jax.lax.stop_gradient(out.hidden)
        return out, medusa_head.apply({**hp, **reduced}, hidden, s.num_layers, float_lm_head(target.config, tp))

    def labelled(logits, batch, target):
        """Per head: (logits, labels in the draft vocabulary (-1: outside it), the positions
        scored: answer positions whose label is in the window; None: all)."""
        tokens, mask = batch["tokens"], batch.get("loss_mask")
        t2d = None if d2t is None else jnp.asarray(draft_vocab.target_to_draft(d2t, target.config.vocab_size))
        out = []
        for k, (lg, lab) in enumerate(per_head(logits, tokens)):
            m = None if mask is None else mask[:, : lab.shape[1]] & mask[:, 1 + k:]  # p+1 and p+2+k < end
            out.append((lg, lab if t2d is None else t2d[lab], m))
        return out

    def loss(params, batch, key, target):
        out, logits = head_logits(params, batch, target)
        metrics, total = {}, 0.0
        for k, (lg, lab, mask) in enumerate(labelled(logits, batch, target)):
            kept = lab >= 0 if mask is None else mask & (lab >= 0)
            ce = hard_ce(lg, jnp.maximum(lab, 0), kept)
            total = total + (s.heads_coefficient * s.decay ** (k + 1) if joint else s.decay ** k) * ce
            metrics[f"head{k}_loss"] = ce
            metrics[f"head{k}_top1"] = masked_mean(top1_hits(lg, lab), mask)
        if joint:
            metrics["lm_loss"] = hard_ce(out.logits, batch["tokens"][:, 1:])
            total = total + metrics["lm_loss"]
        metrics["loss"] = total
        return total, metrics

    def evaluate(params, batch, target):
        heads = labelled(head_logits(params, batch, target)[1], batch, target)
        masks = None if heads[0][2] is None else [m for *_, m in heads]
        return rank_metrics([(lg, lab) for lg, lab, _ in heads], masks)

    def export(params, out_dir, target, held_out):
        """Heads (and, for medusa2, the tuned target under target/) with the per-rank held-out
        accuracies that build the drafter's tree."""
        from specjax.drafters.medusa import Medusa

        tp, hp = split(params, target)
        Medusa(jax.tree.map(np.asarray, {**hp, **reduced}), num_layers=s.num_layers, tree_size=s.tree_size,
               accuracy=accuracy_table(held_out())).save(out_dir, target)
        if joint:
            save(Model(tp, target.config), str(Path(out_dir) / "target"), format="hf")

    return Objective(init, loss, evaluate, export, None if joint else last_layer)


def per_head(logits, tokens):
    """[(logits of head k at the valid t, labels t+2+k)] for each head."""
    t = tokens.shape[1] - 1
    return [(logits[:, : t - 1 - k, k], tokens[:, 2 + k:]) for k in range(logits.shape[2])]
