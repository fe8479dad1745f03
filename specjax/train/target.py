"""The frozen target of a draft-head run, loaded once by the loop (and by export)."""

from __future__ import annotations

import jax

from specjax.models import Model, init_params
from specjax.train.run_config import Config


def load_target(config: Config) -> Model | None:
    """The target `[heads] target` names: a folder, a shipped name such as "tiny", or "random"
    (a random target with peaked distributions, std 0.1, from [model] and the seed; for tests).
    None for the `lm` objective, which trains a model rather than a head on one."""
    if config.heads is None:
        return None
    name = config.heads.target
    if name == "random":
        return Model(init_params(config.model, jax.random.key(config.train.seed + 12345), std=0.1), config.model)
    from specjax.convert import load

    target = load(name)
    t, m = target.config, config.model
    if (t.hidden_size, t.vocab_size, t.num_layers) != (m.hidden_size, m.vocab_size, m.num_layers):
        raise ValueError(f"[model] in the config does not describe the target {name!r}: {m} vs {t}")
    return target
