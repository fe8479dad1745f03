"""The data pipeline: tokenize the corpus once into cached uint16 .npy streams, then draw
random fixed-length windows with a seeded numpy RNG whose state is checkpointable."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import numpy as np

from specjax.data.corpus import list_files, read_text, resolve_root
from specjax.train.bpe import EOT, load_bpe
from specjax.train.run_config import DataConfig


def _tokenize(tok, files: list[Path]) -> np.ndarray:
    """Every file's ids, each document preceded by <|endoftext|>, as one uint16 stream."""
    eot = tok.token_to_id(EOT)
    encodings = tok.encode_batch([read_text(f) for f in files])
    parts = [np.array([eot] + e.ids, np.uint16) for e in encodings]
    return np.concatenate(parts)


def load_streams(cfg: DataConfig) -> tuple[np.ndarray, np.ndarray]:
    """(train, val) token streams, built and cached under `cfg.cache_dir` on first use; the
    cache is rebuilt when the tokenizer or the file lists change."""
    tok = load_bpe(cfg.tokenizer)
    if tok.get_vocab_size() > np.iinfo(np.uint16).max + 1:
        raise ValueError(f"vocab {tok.get_vocab_size()} does not fit uint16")
    root = resolve_root(cfg.corpus)
    train_files, val_files = list_files(root, cfg.held_out)
    key = hashlib.sha256()
    key.update((Path(cfg.tokenizer) / "tokenizer.json").read_bytes())
    for f in train_files + [None] + val_files:
        key.update(str(f).encode())
    key = key.hexdigest()[:16]
    cache = Path(cfg.cache_dir)
    meta_path = cache / "meta.json"
    if meta_path.is_file() and json.loads(meta_path.read_text()).get("key") == key:
        return np.load(cache / "train.npy"), np.load(cache / "val.npy")
    cache.mkdir(parents=True, exist_ok=True)
    meta_path.unlink(missing_ok=True)  # written last: a write killed midway is rebuilt, never read
    train, val = _tokenize(tok, train_files), _tokenize(tok, val_files)
    np.save(cache / "train.npy", train)
    np.save(cache / "val.npy", val)
    meta_path.write_text(json.dumps({"key": key, "train_files": len(train_files),
                                     "val_files": len(val_files), "train_tokens": len(train),
                                     "val_tokens": len(val)}, indent=2))
    return train, val


class WindowSampler:
    """Random windows of `length` tokens from a stream; `state`/`set_state` checkpoint it."""

    def __init__(self, stream: np.ndarray, length: int, seed: int):
        if len(stream) < length:
            raise ValueError(f"token stream ({len(stream)}) shorter than one window ({length})")
        self.stream, self.length = stream, length
        self.rng = np.random.Generator(np.random.PCG64(seed))

    def next(self, batch_size: int) -> np.ndarray:
        """int32 [batch_size, length]."""
        starts = self.rng.integers(0, len(self.stream) - self.length + 1, size=batch_size)
        return self.stream[starts[:, None] + np.arange(self.length)].astype(np.int32)

    def state(self) -> dict:
        return self.rng.bit_generator.state

    def set_state(self, state: dict) -> None:
        self.rng.bit_generator.state = state


def eval_windows(stream: np.ndarray, length: int, count: int | None = None) -> np.ndarray:
    """int32 [n, length]: `count` windows spread evenly over the stream (all disjoint windows
    when `count` is None), so a capped eval still samples every held-out module."""
    n_all = len(stream) // length
    if n_all == 0:
        raise ValueError(f"eval stream ({len(stream)}) shorter than one window ({length})")
    idx = np.arange(n_all) if count is None or count >= n_all else np.linspace(0, n_all - 1, count).astype(int)
    return stream[idx[:, None] * length + np.arange(length)].astype(np.int32)
