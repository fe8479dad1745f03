"""The `lm` objective: next-token prediction for a whole model (the shipped target and draft)."""

from __future__ import annotations

import shutil
from pathlib import Path

from specjax.convert import save
from specjax.models import Model, ModelConfig, forward
from specjax.train.objectives.base import Objective, no_metrics
from specjax.train.objectives.scoring import next_token_loss


def lm(model: ModelConfig, tokenizer: str | Path) -> Objective:
    """Train `model` from scratch on the windows; export an HF folder with `tokenizer`'s files."""

    def init(key, target=None):
        return Model.init(model, key).params

    def loss(params, batch, key, target=None):
        out = forward(model, params, batch["tokens"][:, :-1])
        value, acc = next_token_loss(out.logits, batch["tokens"][:, 1:])
        return value, {"loss": value, "accuracy": acc}

    def export(params, out_dir, target=None, held_out=None):
        save(Model(params, model), str(out_dir), format="hf")
        for name in ("tokenizer.json", "tokenizer_config.json"):
            shutil.copy(Path(tokenizer) / name, Path(out_dir) / name)

    return Objective(init, loss, no_metrics, export)
