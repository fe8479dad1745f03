"""Training objectives, optax-style: one factory per objective, from its settings to an
`Objective(init, loss, evaluate, export)` of plain functions (see `base.Objective`). Shared
pieces are plain functions (`scoring`); an objective loads nothing: the loop loads the frozen
target once and passes it in.

| objective | factory | [heads] settings |
|---|---|---|
| lm | `lm.lm(model, tokenizer)` | none: [model] is what is trained |
| medusa1, medusa2 | `medusa.medusa1`, `medusa.medusa2` | `medusa.MedusaSettings` |
| eagle, eagle3 | `eagle.eagle`, `eagle.eagle3` | `eagle.EagleSettings` |
| clover | `clover.clover` | `clover.CloverSettings` |
| ppd, hidden-transfer | `guesses.ppd`, `guesses.hidden_transfer` | `guesses.GuessSettings` |
"""

from __future__ import annotations

from specjax.train.objectives import clover, eagle, guesses, lm, medusa
from specjax.train.objectives.base import Objective

HEAD_OBJECTIVES = {"medusa1": (medusa.medusa1, medusa.MedusaSettings),
                   "medusa2": (medusa.medusa2, medusa.MedusaSettings),
                   "eagle": (eagle.eagle, eagle.EagleSettings), "eagle3": (eagle.eagle3, eagle.EagleSettings),
                   "clover": (clover.clover, clover.CloverSettings),
                   "ppd": (guesses.ppd, guesses.GuessSettings),
                   "hidden-transfer": (guesses.hidden_transfer, guesses.GuessSettings)}
"""Draft-head objectives: name -> (factory, the type of its [heads] settings)."""

NAMES = ("lm", *HEAD_OBJECTIVES)


def settings_type(name: str) -> type | None:
    """The [heads] settings type of objective `name` (None for `lm`)."""
    if name not in NAMES:
        raise ValueError(f"unknown objective {name!r}; known: {', '.join(NAMES)}")
    return HEAD_OBJECTIVES[name][1] if name in HEAD_OBJECTIVES else None


def make_objective(config) -> Objective:
    """The objective a run's Config names ([train] objective), built from its settings."""
    name = config.train.objective
    if settings_type(name) is None:
        return lm.lm(config.model, config.data.tokenizer)
    return HEAD_OBJECTIVES[name][0](config.heads)


__all__ = ["Objective", "HEAD_OBJECTIVES", "NAMES", "make_objective", "settings_type"]
