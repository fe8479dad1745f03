"""Training configs: a TOML file -> frozen dataclasses, with `section.key=value` overrides."""

from __future__ import annotations

import dataclasses
import tomllib
from pathlib import Path
from typing import Any

from specjax.data.corpus import HELD_OUT
from specjax.models import ModelConfig


@dataclasses.dataclass(frozen=True)
class DataConfig:
    """Where the tokens come from and how they are windowed."""

    tokenizer: str  # folder with tokenizer.json (trained on the corpus when it has none)
    cache_dir: str  # where the tokenized corpus (.npy) is cached
    corpus: str = "stdlib"  # "stdlib" or a folder of .py files
    held_out: tuple[str, ...] = HELD_OUT
    seq_len: int = 256
    features: str = ""  # a feature cache (`python -m specjax.train distill`): train eagle3, medusa1 or clover on it


@dataclasses.dataclass(frozen=True)
class OptimConfig:
    """AdamW with linear warmup and cosine decay to `lr * min_lr_ratio`; global-norm clipping."""

    lr: float = 3e-3
    warmup_steps: int = 100
    min_lr_ratio: float = 0.1
    weight_decay: float = 0.1
    b1: float = 0.9
    b2: float = 0.95
    grad_clip: float = 1.0


@dataclasses.dataclass(frozen=True)
class TrainConfig:
    """The loop: length, batch, cadence of logs, evals and checkpoints, and the device mesh:
    `mesh = [data, model]` (data may be -1: the remaining devices) splits the batch over
    'data' and the trained parameters and optimizer state over both axes (FSDP over 'data',
    tensor parallel over 'model'); empty: one device."""

    out: str
    steps: int = 1000
    batch_size: int = 16
    objective: str = "lm"
    seed: int = 0
    log_every: int = 10
    eval_every: int = 200
    eval_batches: int = 8
    save_every: int = 100
    keep_checkpoints: int = 2
    mesh: tuple[int, ...] = ()

    def __post_init__(self):
        if not isinstance(self.steps, int) or isinstance(self.steps, bool) or self.steps < 1:
            raise ValueError(f"train.steps (--steps) must be an integer >= 1, got {self.steps!r}")


@dataclasses.dataclass(frozen=True)
class Config:
    model: ModelConfig
    data: DataConfig
    optim: OptimConfig
    train: TrainConfig
    heads: Any = None  # the objective's [heads] settings (specjax.train.objectives); None for lm


_SECTIONS = {"model": ModelConfig, "data": DataConfig, "optim": OptimConfig, "train": TrainConfig,
             "heads": None}  # [heads]: the settings type of the run's objective


def parse_value(text: str) -> Any:
    """A TOML value (`3`, `1e-3`, `true`, `"x"`, `[1, 2]`); bare words stay strings."""
    try:
        return tomllib.loads(f"v = {text}")["v"]
    except tomllib.TOMLDecodeError:
        return text


def apply_overrides(raw: dict, overrides: dict[str, Any]) -> dict:
    """Set `section.key` entries of a raw config dict (a new dict)."""
    raw = {k: dict(v) for k, v in raw.items()}
    for dotted, value in overrides.items():
        section, _, key = dotted.partition(".")
        if not key or section not in _SECTIONS:
            raise ValueError(f"bad override {dotted!r}: expected section.key with section in "
                             f"{', '.join(_SECTIONS)}")
        raw.setdefault(section, {})[key] = value
    return raw


def from_dict(raw: dict) -> Config:
    """Build a Config, naming unknown sections, unknown keys and missing keys. [heads] holds
    the settings of the draft-head objective [train] names (and only then)."""
    from specjax.train.objectives import settings_type

    unknown = set(raw) - set(_SECTIONS)
    if unknown:
        raise ValueError(f"unknown config section(s): {', '.join(sorted(unknown))}; "
                         f"expected {', '.join(_SECTIONS)}")
    objective = raw.get("train", {}).get("objective", TrainConfig.objective)
    sections = {**_SECTIONS, "heads": settings_type(objective)}
    if sections["heads"] is None:
        if "heads" in raw:
            raise ValueError(f"[heads] is for the draft-head objectives, not {objective!r}")
        del sections["heads"]
    for name, cls in sections.items():
        known = [f.name for f in dataclasses.fields(cls)]
        bad = set(raw.get(name, {})) - set(known)
        if bad:
            raise ValueError(f"unknown key(s) in [{name}]: {', '.join(sorted(bad))}; "
                             f"known: {', '.join(known)}")
    built = {}
    for name, cls in sections.items():
        values = dict(raw.get(name, {}))
        fields = {f.name: f for f in dataclasses.fields(cls)}
        missing = [f for f, spec in fields.items() if f not in values
                   and spec.default is dataclasses.MISSING
                   and spec.default_factory is dataclasses.MISSING]
        if missing:
            raise ValueError(f"missing key(s) in [{name}]: {', '.join(missing)}")
        for key in ("held_out", "target_layers", "mesh"):
            if key in values:
                values[key] = tuple(values[key])
        built[name] = cls(**values)
    return Config(**built)


# Keys that name files; relative paths in a config file are relative to the file's folder.
PATH_KEYS = (("data", "tokenizer"), ("data", "cache_dir"), ("data", "corpus"), ("data", "features"),
             ("train", "out"), ("heads", "token_counts"))


def load_config(path: str | Path, overrides: dict[str, Any] | None = None) -> Config:
    """Read a TOML config file, its relative PATH_KEYS taken from the file's folder (whatever
    the current folder), and apply `section.key` overrides (paths there are as given)."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"config file not found: {path}")
    with path.open("rb") as f:
        try:
            raw = tomllib.load(f)
        except tomllib.TOMLDecodeError as e:
            raise ValueError(f"{path}: invalid TOML ({e})") from None
    for section, key in PATH_KEYS:
        value = raw.get(section, {}).get(key)
        if isinstance(value, str) and value != "stdlib":
            raw[section][key] = str(path.parent / value)  # an absolute value stays as it is
    return from_dict(apply_overrides(raw, overrides or {}))


def to_dict(config: Config) -> dict:
    """A plain (JSON/TOML-able) dict of the config."""
    out = {}
    for name in _SECTIONS:
        if getattr(config, name) is None:
            continue
        d = dataclasses.asdict(getattr(config, name))
        out[name] = {k: (list(v) if isinstance(v, tuple) else v) for k, v in d.items() if v is not None}
    return out
