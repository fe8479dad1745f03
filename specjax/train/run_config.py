"""Training configs: a TOML file -> frozen dataclasses, with `section.key=value` overrides."""

from __future__ import annotations

import dataclasses
import math
import tomllib
import types
import typing
from pathlib import Path
from typing import Any

from specjax.data.corpus import HELD_OUT
from specjax.models import ModelConfig

TASKS = "parallel_bench"  # [data] corpus: the ParallelBench-style tasks (specjax.data.parallel_bench)


@dataclasses.dataclass(frozen=True)
class DataConfig:
    """Where the tokens come from and how they are windowed."""

    tokenizer: str  # folder with tokenizer.json (trained on the corpus when it has none)
    cache_dir: str  # where the tokenized corpus (.npy) is cached
    # "stdlib", a folder of .py files, TASKS (canvases of fresh task examples, for the
    # masked-diffusion objectives) or an .npz of canvases (`specjax.train.canvas_batches`)
    corpus: str = "stdlib"
    held_out: tuple[str, ...] = HELD_OUT
    seq_len: int = 256  # a canvas's whole length (prompt + answer slots) for TASKS and .npz
    tasks: tuple[str, ...] = ()  # the TASKS corpus's tasks (empty: all of them)
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


@dataclasses.dataclass(frozen=True)
class Config:
    model: ModelConfig
    data: DataConfig
    optim: OptimConfig
    train: TrainConfig
    heads: Any = None  # the objective's [heads] settings (specjax.train.objectives); None for lm


_SECTIONS = {"model": ModelConfig, "data": DataConfig, "optim": OptimConfig, "train": TrainConfig,
             "heads": None}  # [heads]: the settings type of the run's objective


@dataclasses.dataclass(frozen=True)
class Interval:
    """The numbers from low to high (None: unbounded), each end closed unless said open."""

    low: float | None = None
    high: float | None = None
    low_open: bool = False
    high_open: bool = False

    def __contains__(self, x) -> bool:
        return ((self.low is None or (x > self.low if self.low_open else x >= self.low))
                and (self.high is None or (x < self.high if self.high_open else x <= self.high)))

    def __str__(self) -> str:
        if self.high is None:
            return f"{'>' if self.low_open else '>='} {self.low}"
        return f"in {'(' if self.low_open else '['}{self.low}, {self.high}{')' if self.high_open else ']'}"


_COUNT, _POSITIVE, _FRACTION = Interval(1), Interval(0, low_open=True), Interval(0, 1, high_open=True)
# The values a numeric key takes beyond its type (a key not here: any value of its type).
RANGES = {
    **{("model", k): _COUNT for k in ("vocab_size", "hidden_size", "intermediate_size", "num_layers",
                                       "num_heads", "num_kv_heads", "head_dim", "max_position_embeddings")},
    ("data", "seq_len"): _COUNT,
    ("optim", "lr"): _POSITIVE, ("optim", "warmup_steps"): Interval(0), ("optim", "min_lr_ratio"): Interval(0, 1),
    ("optim", "weight_decay"): Interval(0), ("optim", "b1"): _FRACTION, ("optim", "b2"): _FRACTION,
    ("optim", "grad_clip"): _POSITIVE,
    **{("train", k): _COUNT for k in ("steps", "batch_size", "log_every", "eval_every", "eval_batches",
                                       "save_every", "keep_checkpoints")},
    ("train", "seed"): Interval(0, 2**63 - 1),
}


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
    the settings of the objective [train] names where it has any (the draft heads, dparallel)."""
    from specjax.train.objectives import settings_type

    unknown = set(raw) - set(_SECTIONS)
    if unknown:
        raise ValueError(f"unknown config section(s): {', '.join(sorted(unknown))}; "
                         f"expected {', '.join(_SECTIONS)}")
    objective = raw.get("train", {}).get("objective", TrainConfig.objective)
    sections = {**_SECTIONS, "heads": settings_type(objective)}
    if sections["heads"] is None:
        if "heads" in raw:
            raise ValueError(f"[heads] is for the objectives with settings, not {objective!r}")
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
        hints = typing.get_type_hints(cls)
        values = {key: _checked(name, key, value, hints[key]) for key, value in values.items()}
        built[name] = cls(**values)
    model = built["model"]
    for key in ("bos_token_id", "eos_token_id", "mask_token_id"):
        if getattr(model, key) is not None and not 0 <= getattr(model, key) < model.vocab_size:
            raise ValueError(f"[model] {key} must be a token id in [0, vocab_size = {model.vocab_size}), "
                             f"got {getattr(model, key)}")
    return Config(**built)


def _checked(section: str, key: str, value: Any, hint) -> Any:
    """`value` of `[section] key` checked against its type `hint` and `RANGES` (a list made a
    tuple, an integer a float where a float is wanted); a ValueError names the key."""
    given = value

    def bad(what: str):
        return ValueError(f"[{section}] {key} must be {what}, got {given!r}")

    if typing.get_origin(hint) in (typing.Union, types.UnionType):  # `X | None`: X (TOML has no null)
        if value is None and type(None) in typing.get_args(hint):  # from Python (a dataclass's dict)
            return None
        rest = [h for h in typing.get_args(hint) if h is not type(None)]
        hint = rest[0] if len(rest) == 1 else Any
    if typing.get_origin(hint) is tuple:  # tuple[X, ...]
        item = typing.get_args(hint)[0]
        if item in _NAMES and (not isinstance(value, (list, tuple)) or not all(_is(v, item) for v in value)):
            raise bad(f"a list of {_NAMES[item]}s")
        return tuple(float(v) if item is float else v for v in value) if isinstance(value, (list, tuple)) else value
    if hint in _NAMES:
        if not _is(value, hint):
            raise bad(f"{'an' if hint is int else 'a'} {_NAMES[hint]}")
        value = float(value) if hint is float else value
        if (section, key) in RANGES and value not in RANGES[section, key]:
            raise bad(f"{'an' if hint is int else 'a'} {_NAMES[hint]} {RANGES[section, key]}")
    return value


_NAMES = {int: "integer", float: "number", str: "string", bool: "boolean (true or false)"}


def _is(value: Any, hint: type) -> bool:
    if hint is float:
        return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
    return isinstance(value, hint) and (hint is bool or not isinstance(value, bool))


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
        if isinstance(value, str) and value not in ("stdlib", TASKS):
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
