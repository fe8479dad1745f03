"""Training: `python -m specjax.train --config FILE`. Config, data, objectives, loop,
checkpoints and export, one module each."""

from specjax.train.config import Config, load_config
from specjax.train.export import export
from specjax.train.loop import train
from specjax.train.objectives import LMObjective, Objective

__all__ = ["Config", "LMObjective", "Objective", "export", "load_config", "train"]
