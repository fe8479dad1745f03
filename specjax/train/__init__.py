"""Training: `python -m specjax.train COMMAND` (`run`, the default, `export`, `distill`,
`features`, `evaluate`, `tokenizer`, `trajectories`). Config (`run_config`), token
windows, task canvases (`canvas_batches`, for the masked-diffusion objectives), objectives, the
frozen target, loop, run state (checkpoints) and export, one module each (objectives: one per
family); the corpus, prompt sets and tasks it reads are `specjax.data`."""

from specjax.train.export import export
from specjax.train.loop import train
from specjax.train.objectives import Objective, make_objective
from specjax.train.objectives.lm import lm
from specjax.train.run_config import Config, load_config

__all__ = ["Config", "Objective", "export", "lm", "load_config", "make_objective", "train"]
