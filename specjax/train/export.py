"""Export: the latest checkpoint of a run -> an HF folder (config.json, model.safetensors,
tokenizer.json, tokenizer_config.json) that transformers' Auto classes load."""

from __future__ import annotations

import shutil
from pathlib import Path

import jax

from specjax.train.checkpoint import Checkpointer
from specjax.train.config import Config
from specjax.train.loop import make_optimizer
from specjax.train.objectives import make_objective


def load_trained_params(config: Config) -> tuple[dict, int]:
    """(params, step) of the latest checkpoint in `config.train.out`."""
    objective = make_objective(config.train.objective, config.model, config)
    params = jax.eval_shape(objective.init, jax.random.PRNGKey(0))
    optimizer, _ = make_optimizer(config.optim, config.train.steps)
    opt_state = jax.eval_shape(optimizer.init, params)
    ckpt = Checkpointer(Path(config.train.out) / "checkpoints")
    step = ckpt.latest_step()
    if step is None:
        raise FileNotFoundError(f"no checkpoint to export in {config.train.out}/checkpoints")
    state, _ = ckpt.restore({"params": params, "opt_state": opt_state})
    ckpt.close()
    return state["params"], step


def export(config: Config, out_dir: str | Path) -> int:
    """Write the trained model and its tokenizer to `out_dir`; returns the exported step."""
    params, step = load_trained_params(config)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    objective = make_objective(config.train.objective, config.model, config)
    objective.export(params, out)
    for name in ("tokenizer.json", "tokenizer_config.json") if getattr(objective, "has_tokenizer", True) else ():
        shutil.copy(Path(config.data.tokenizer) / name, out / name)
    return step
