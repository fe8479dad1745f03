"""Training: `python -m specjax.train --config FILE`. Config, data, objectives, the frozen
target, loop, checkpoints and export, one module each (objectives: one per family)."""

from specjax.train.config import Config, load_config
from specjax.train.export import export
from specjax.train.loop import train
from specjax.train.objectives import Objective, make_objective
from specjax.train.objectives.lm import lm

__all__ = ["Config", "Objective", "export", "lm", "load_config", "make_objective", "train"]
