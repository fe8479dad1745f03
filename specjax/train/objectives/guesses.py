"""PPD and Hidden Transfer (`specjax.heads.ppd`, `specjax.heads.hidden_transfer`): frozen target;
every position i of the window gets K guesses inside the target's own forward (as in decoding,
see `specjax.heads.guesses`), and guess j is distilled toward the target's own distribution at
position i + j: loss sum_j decay^(j-1) KL(p_target(i+j) || p_guess(i, j)) / K (PPD's KD loss).
The tokens never see the guesses, so one forward gives the teacher and the student.

- ppd: trained prompt tokens (`ensemble` members per guess) entering with the tokens.
- hidden-transfer: pseudo states made at `transfer_layer` (0: the middle layer).

Held-out accuracies are per guess, against the target's greedy token."""

from __future__ import annotations

import dataclasses
from typing import Callable

import jax
import jax.numpy as jnp
import numpy as np

from specjax.heads import hidden_transfer as ht_head
from specjax.heads import ppd as ppd_head
from specjax.heads.guesses import GuessLayout
from specjax.models import forward
from specjax.train.objectives.base import Objective
from specjax.train.objectives.scoring import accuracy_table, distill, greedy_rank_metrics


@dataclasses.dataclass(frozen=True)
class GuessSettings:
    """[heads] of ppd and hidden-transfer."""

    target: str = "tiny"  # the target: a folder, a shipped name, or "random" (tests)
    num_guesses: int = 3  # PPD prompt tokens / Hidden Transfer offsets
    ensemble: int = 1  # ppd: members (virtual tokens) per prompt token
    transfer_layer: int = 0  # hidden-transfer: the layer pseudo states enter (0: the middle one)
    decay: float = 0.8  # weight decay^(j-1) of guess j
    tree_size: int = 16  # the exported drafter's tree size
    guess_budget: int = 8  # the exported drafter's guess positions per verify pass


def ppd(s: GuessSettings) -> Objective:
    from specjax.drafters.parallel import PPD

    if s.ensemble < 1:
        raise ValueError(f"ensemble must be >= 1, got {s.ensemble}")
    return _guesses(s, s.ensemble, layer=lambda target: 0, make=ppd_head.make,
                    init=lambda key, target: ppd_head.init(key, s.num_guesses, s.ensemble, target.params["embed"]),
                    drafter=lambda params, accuracy, target: PPD(
                        params, tree_size=s.tree_size, guess_budget=s.guess_budget, accuracy=accuracy))


def hidden_transfer(s: GuessSettings) -> Objective:
    from specjax.drafters.parallel import HiddenTransfer

    def layer(target) -> int:
        n = target.config.num_layers
        chosen = s.transfer_layer or n // 2
        if not 1 <= chosen < n:
            raise ValueError(f"transfer_layer must be in [1, {n - 1}], got {chosen}")
        return chosen

    return _guesses(s, 1, layer=layer, make=ht_head.make,
                    init=lambda key, target: ht_head.init(s.num_guesses, target.config.hidden_size),
                    drafter=lambda params, accuracy, target: HiddenTransfer(
                        params, tree_size=s.tree_size, guess_budget=s.guess_budget, accuracy=accuracy,
                        transfer_layer=layer(target)))


def _guesses(s: GuessSettings, members: int, layer: Callable, make: Callable, init: Callable,
             drafter: Callable) -> Objective:
    """The objective of guesses built by `make(params, layout)` entering before decoder layer
    `layer(target)`, `members` positions each; `drafter(params, accuracy, target)` exports."""
    if s.num_guesses < 1:
        raise ValueError(f"num_guesses must be >= 1, got {s.num_guesses}")
    k = s.num_guesses

    def pairs(params, tokens, target):
        """[(guess j's logits at the positions i with i + j in the window, the target's there)]."""
        b, t = tokens.shape
        layout = GuessLayout.build(np.full(t, k), k, members)
        causal = jnp.broadcast_to(jnp.tril(jnp.ones((t, t), bool)), (b, t, t))
        positions = jnp.broadcast_to(jnp.arange(t, dtype=jnp.int32), (b, t))
        inject = layout.injection(layer(target), make(params, layout), causal, positions)
        out = forward(target.config, target.params, tokens, inject=inject)
        guesses = out.logits[:, t:].reshape(b, t, k, members, -1).mean(3)
        teacher = jax.lax.stop_gradient(out.logits[:, :t])
        return [(guesses[:, : t - j, j - 1], teacher[:, j:]) for j in range(1, k + 1)]

    def loss(params, batch, key, target):
        total, metrics = distill(pairs(params, batch["tokens"], target), s.decay, "guess")
        return total / k, {**metrics, "loss": total / k}

    def evaluate(params, batch, target):
        return greedy_rank_metrics(pairs(params, batch["tokens"], target))

    def export(params, out_dir, target, held_out):
        """The weights with the per-rank held-out accuracies that build the drafter's tree."""
        drafter(jax.tree.map(np.asarray, params), accuracy_table(held_out()), target).save(out_dir)

    return Objective(init, loss, evaluate, export)
