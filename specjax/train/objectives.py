"""Training objectives. An objective owns what is trained and how it is scored:
`init(key) -> params`, `loss_fn(params, batch) -> (loss, metrics)` (pure, jittable) and
`export(params, out_dir)`. The loop knows nothing else, so draft heads (Medusa, EAGLE, ...)
plug in as further objectives behind the same command."""

from __future__ import annotations

import dataclasses
import functools
from pathlib import Path
from typing import Protocol

import jax
import jax.numpy as jnp

from specjax.models import Model, ModelConfig, forward


class Objective(Protocol):
    def init(self, key: jax.Array) -> dict: ...

    def loss_fn(self, params: dict, batch: jax.Array) -> tuple[jax.Array, dict]: ...

    def export(self, params: dict, out_dir: str | Path) -> None: ...


def next_token_loss(logits: jax.Array, targets: jax.Array) -> tuple[jax.Array, jax.Array]:
    """Mean cross-entropy and accuracy of float logits [B,T,V] against int targets [B,T]."""
    logp = jax.nn.log_softmax(logits.astype(jnp.float32), axis=-1)
    nll = -jnp.take_along_axis(logp, targets[..., None], axis=-1)[..., 0]
    acc = (jnp.argmax(logits, axis=-1) == targets).astype(jnp.float32)
    return nll.mean(), acc.mean()


@dataclasses.dataclass(frozen=True)
class LMObjective:
    """Next-token prediction for a whole model. batch: int32 [B, T+1] token windows."""

    model: ModelConfig

    def init(self, key):
        return Model.init(self.model, key).params

    def loss_fn(self, params, batch):
        out = forward(self.model, params, batch[:, :-1])
        loss, acc = next_token_loss(out.logits, batch[:, 1:])
        return loss, {"loss": loss, "accuracy": acc}

    def export(self, params, out_dir):
        import specjax

        specjax.save(Model(params, self.model), str(out_dir), format="hf")


OBJECTIVES = {"lm": LMObjective}


def make_objective(name: str, model: ModelConfig, config=None) -> Objective:
    """The objective registered under `name`; draft-head objectives (HEAD_OBJECTIVES) also
    read the run's whole `config` (the [heads] and [data] sections)."""
    from specjax.train.head_objectives import HEAD_OBJECTIVES

    if name in HEAD_OBJECTIVES:
        if config is None:
            raise ValueError(f"objective {name!r} needs the run's config")
        return _cached_head_objective(name, config)
    if name not in OBJECTIVES:
        raise ValueError(f"unknown objective {name!r}; known: {', '.join([*OBJECTIVES, *HEAD_OBJECTIVES])}")
    return OBJECTIVES[name](model)


@functools.lru_cache(maxsize=4)
def _cached_head_objective(name, config):
    """One head objective per (name, config): it holds the loaded target, and the loop's
    compiled step is cached per objective."""
    from specjax.train.head_objectives import HEAD_OBJECTIVES

    return HEAD_OBJECTIVES[name](config)
