"""Export: the latest checkpoint of a run -> what its objective writes: an HF folder
(config.json, model.safetensors, tokenizer files) that transformers' Auto classes load for
`lm`, a head folder for the draft-head objectives."""

from __future__ import annotations

from pathlib import Path

import jax

from specjax.train.loop import data_source, held_out, make_optimizer, score_function
from specjax.train.objectives import make_objective
from specjax.train.run_config import Config
from specjax.train.run_state import Checkpointer
from specjax.train.target import load_target


def load_trained_params(config: Config, target=None) -> tuple[dict, int]:
    """(params, step) of the latest checkpoint in `config.train.out`; `target` is the run's
    frozen target (`load_target`), which shapes a head's parameters."""
    objective = make_objective(config)
    params = jax.eval_shape(objective.init, jax.random.PRNGKey(0), target)
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
    """Write the trained model or head to `out_dir`; returns the exported step. Heads built
    from measured accuracies measure them on 8 batches of held-out windows."""
    target = load_target(config)
    params, step = load_trained_params(config, target)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    objective = make_objective(config)

    def measured() -> dict:
        _, val = data_source(config, objective)
        return held_out(score_function(objective, config.train.seed), params, val, config.train.batch_size, target)

    objective.export(params, out, target, measured)
    return step
