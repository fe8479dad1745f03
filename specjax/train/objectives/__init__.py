"""Training objectives, optax-style: one factory per objective, from its settings to an
`Objective(init, loss, evaluate, export)` of plain functions (see `base.Objective`). Shared
pieces are plain functions (`scoring`); an objective loads nothing: the loop loads the frozen
target once and passes it in.

| objective | factory | [heads] settings |
|---|---|---|
| lm | `lm.lm(model, tokenizer)` | none: [model] is what is trained |
| mdm | `mdm.mdm(model, tokenizer)` | none: [model] (a masked-diffusion LM) is what is trained |
| medusa1, medusa2 | `medusa.medusa1`, `medusa.medusa2` | `medusa.MedusaSettings` |
| eagle, eagle3 | `eagle.eagle`, `eagle.eagle3` | `eagle.EagleSettings` |
| clover | `clover.clover` | `clover.CloverSettings` |
| ppd, hidden-transfer | `guesses.ppd`, `guesses.hidden_transfer` | `guesses.GuessSettings` |
| dparallel | `dparallel.dparallel(model, settings)` | `dparallel.DParallelSettings` |
"""

from __future__ import annotations

from specjax.train.objectives import clover, dparallel, eagle, guesses, lm, mdm, medusa
from specjax.train.objectives.base import Objective

HEAD_OBJECTIVES = {"medusa1": (medusa.medusa1, medusa.MedusaSettings),
                   "medusa2": (medusa.medusa2, medusa.MedusaSettings),
                   "eagle": (eagle.eagle, eagle.EagleSettings), "eagle3": (eagle.eagle3, eagle.EagleSettings),
                   "clover": (clover.clover, clover.CloverSettings),
                   "ppd": (guesses.ppd, guesses.GuessSettings),
                   "hidden-transfer": (guesses.hidden_transfer, guesses.GuessSettings)}
"""Draft-head objectives: name -> (factory, the type of its [heads] settings)."""

MODEL_OBJECTIVES = {"lm": lm.lm, "mdm": mdm.mdm}
"""Whole-model objectives, trained from scratch: name -> factory(model config, tokenizer folder)."""

DISTILL_OBJECTIVES = {"dparallel": (dparallel.dparallel, dparallel.DParallelSettings)}
"""Objectives that fine-tune the whole [heads] target ([model] describes it): name -> (factory(model
config, settings), the type of its [heads] settings)."""

NAMES = (*MODEL_OBJECTIVES, *HEAD_OBJECTIVES, *DISTILL_OBJECTIVES)


def settings_type(name: str) -> type | None:
    """The [heads] settings type of objective `name` (None for the whole-model objectives)."""
    if name not in NAMES:
        raise ValueError(f"unknown objective {name!r}; known: {', '.join(NAMES)}")
    return {**HEAD_OBJECTIVES, **DISTILL_OBJECTIVES}.get(name, (None, None))[1]


def make_objective(config) -> Objective:
    """The objective a run's Config names ([train] objective), built from its settings."""
    name = config.train.objective
    if settings_type(name) is None:
        return MODEL_OBJECTIVES[name](config.model, config.data.tokenizer)
    if name in DISTILL_OBJECTIVES:
        return DISTILL_OBJECTIVES[name][0](config.model, config.heads)
    return HEAD_OBJECTIVES[name][0](config.heads)


__all__ = ["Objective", "DISTILL_OBJECTIVES", "HEAD_OBJECTIVES", "MODEL_OBJECTIVES", "NAMES", "make_objective",
           "settings_type"]
