"""The objective type: what `python -m specjax.train` trains, as four plain functions."""

from __future__ import annotations

from typing import Any, Callable, NamedTuple


class Objective(NamedTuple):
    """An objective, optax-style: a factory's closures over its settings, nothing else.

    init(key, target) -> params: the trained parameters (from the frozen target where a head
      starts from it).
    loss(params, batch, key, target) -> (loss, metrics): pure and jittable; `batch` is a dict
      holding at least "tokens" int32 [B, T+1] (see each objective for what else it reads);
      `key` drives any training-time randomness (EAGLE-1's feature noise).
    evaluate(params, batch, target) -> dict: held-out metrics of one batch (per-head accuracies),
      averaged over the held-out windows by the loop.
    export(params, out_dir, target, held_out): write what was trained; `held_out()` gives the
      held-out metrics (for the heads whose sparse tree is built from measured accuracies).
    feature_layers(target_config) -> layer indices: the target layers the objective reads from a
      feature cache (`[data] features`; their outputs come as batch["features"]); None for an
      objective that only trains on token windows.

    `target` is the frozen target Model (None for `lm`): an argument, not a closure, so the loop
    loads it once, lays it out over the mesh, and jit never embeds its weights as constants.
    """

    init: Callable[..., Any]
    loss: Callable[..., tuple]
    evaluate: Callable[..., dict]
    export: Callable[..., None]
    feature_layers: Callable[..., tuple[int, ...]] | None = None


def last_layer(target_config) -> tuple[int, ...]:
    """`feature_layers` of the heads on the target's last hidden state (Medusa, Clover)."""
    return (target_config.num_layers - 1,)


def no_metrics(params, batch, target=None) -> dict:
    """`evaluate` of an objective with no held-out metrics beyond its loss."""
    return {}
