"""What one row of a decode holds in memory, known before anything is allocated, and the check
that refuses a batch the machine cannot hold (`specjax.decoding.prepare` runs it for every
`sj.generate`, `sj.stream` and `sj.Adaptive` call; the bench for each batch size before it
measures).

A row holds its KV cache, its history and output, and its drafter's state (shapes from
`jax.eval_shape` of the drafter's `init`, nothing computed), and while it steps the
temporaries of the verify pass (the tree's logits and probabilities over the vocabulary, the
forward's activations, copies of the drafter's state) or of the prefill (attention scores).
Measured on the CPU (peak RSS against rows, KiB a row, the estimate in brackets): on a vocab-8
model AR 52 (68), Token Recycling 65 (71), Lookahead 80 (88; 248 (262) before its trie was
sized by the text it can hold); on the tiny model (16-token prompts, 1,024-2,048 rows) AR 530
(666), draft-chain 753 (792), and before Lookahead's trie and Token Recycling's table were
sized to what they read, Lookahead 793 (1,025) and Token Recycling 809 (1,229) (estimates
now 854 and 977).
"""

from __future__ import annotations

import dataclasses
import resource
from pathlib import Path

import jax
import jax.numpy as jnp

from specjax.models import KVCache
from specjax.models.target import fill

# The verify pass's [N, V] float32 arrays alive at once (logits, processed probabilities, the
# drafter's q and the verifier's residual), the prefill's scores and MLP activations kept, and
# the drafter state's copies beside the loop's own (the carry out, the update's working copy:
# measured on CPU, a Lookahead row peaks at 3.7x its state's bytes).
_VOCAB_COPIES, _ACTIVATION_COPIES, _DRAFTER_COPIES = 4, 3, 2
# of the available memory, what a batch may take: a fixed part kept for compiling and the
# runtime's own buffers (a 512-row batch under a 256 MiB cap failed without it), and a share of
# the rest for what the estimate leaves out
_RESERVED, _USABLE = 256 << 20, 0.8


class BatchTooLarge(ValueError):
    """A batch that would need more memory than there is (its message says how many rows fit)."""


@dataclasses.dataclass(frozen=True)
class RowBytes:
    """Bytes one row of a decode needs: its state (kv_cache, drafter_state, tokens: history
    and output) and the peak temporaries of a step or of its prefill."""

    kv_cache: int
    drafter_state: int
    tokens: int
    temporaries: int

    @property
    def total(self) -> int:
        return self.kv_cache + self.drafter_state + self.tokens + self.temporaries

    def __str__(self) -> str:
        return (f"{_size(self.total)} a row: KV cache {_size(self.kv_cache)}, drafter state "
                f"{_size(self.drafter_state)}, temporaries {_size(self.temporaries)}")


def row_bytes(model, drafter, *, prompt_len: int, max_new_tokens: int, cache_len: int) -> RowBytes:
    """What one row of a decode of `model` with `drafter` (a Drafter; NoDrafter for AR) needs,
    at these compiled sizes (`specjax.decoding.Plan`'s); cached by what decides it (the
    drafter's structure, which holds its settings, and its arrays' shapes)."""
    leaves = tuple((getattr(x, "shape", None), getattr(x, "dtype", None)) for x in jax.tree.leaves(drafter))
    key = (model.config, jax.tree.structure(drafter), leaves, prompt_len, max_new_tokens, cache_len)
    if key not in _MEASURED:
        _MEASURED[key] = _measure(model, drafter, prompt_len, max_new_tokens, cache_len)
    return _MEASURED[key]


_MEASURED: dict[tuple, RowBytes] = {}


def _measure(model, drafter, prompt_len: int, max_new_tokens: int, cache_len: int) -> RowBytes:
    config = model.config

    def init(model, drafter, prompts, lengths):  # as engine.prefill starts the drafter
        pre = None
        if prompt_len > 1:
            pre = fill(model, prompts[:, :-1], KVCache.init(config, 1, cache_len), compute_logits=False,
                       return_layers=drafter.target_layers)
        return drafter.init(model, prompts, lengths, cache_len, pre)

    state = jax.eval_shape(init, model, drafter, jax.ShapeDtypeStruct((1, prompt_len), jnp.int32),
                           jax.ShapeDtypeStruct((1,), jnp.int32))
    cache = jax.eval_shape(lambda: KVCache.init(config, 1, cache_len))
    n, v = drafter.num_nodes, config.vocab_size
    width = config.hidden_size * 4 + config.intermediate_size * 2
    step = 4 * (_VOCAB_COPIES * n * v + n * (width + config.num_heads * cache_len))
    prefill = 4 * _ACTIVATION_COPIES * prompt_len * (width + config.num_heads * prompt_len)
    drafter_state = _nbytes(state)
    return RowBytes(_nbytes(cache), drafter_state, 4 * (cache_len + max_new_tokens),
                    max(step, prefill) + _DRAFTER_COPIES * drafter_state)


def _nbytes(tree) -> int:
    return sum(x.size * x.dtype.itemsize for x in jax.tree.leaves(tree)
               if hasattr(x, "dtype") and not jax.dtypes.issubdtype(x.dtype, jax.dtypes.prng_key))


def available_bytes(device=None) -> int | None:
    """Bytes a decode may still allocate: the device's free memory (an accelerator), or on the
    CPU the least of the host's available memory, this process's address-space limit
    (RLIMIT_AS) and its cgroup's limit, less what is in use. None when nothing says."""
    device = device or jax.devices()[0]
    stats = device.memory_stats() if device.platform != "cpu" else None
    if stats and "bytes_limit" in stats:
        return int(stats["bytes_limit"]) - int(stats.get("bytes_in_use", 0))
    limits = [_meminfo("MemAvailable"), _address_space_left(), _cgroup_left()]
    known = [x for x in limits if x is not None]
    return min(known) if known else None


def check(model, plan, rows: int, *, compiled_rows: int, devices: int = 1) -> None:
    """Raise BatchTooLarge (a ValueError), before anything is allocated, when a batch of `rows` rows decoded by
    `plan` (a `specjax.decoding.Plan`: the drafter and the compiled sizes), compiled as
    `compiled_rows` (its bucket, a power of two: `specjax.decoding.bucket`) split over
    `devices` (a mesh's 'data' axis), needs more memory a device than `available_bytes`; it
    says how many rows fit (a power of two, so that their bucket fits too)."""
    free = available_bytes()
    if free is None:
        return
    need = row_bytes(model, plan.drafter, prompt_len=plan.prompt_len, max_new_tokens=plan.settings.max_new_tokens,
                     cache_len=plan.cache_len)
    free = max(int((free - _RESERVED) * _USABLE), 0)
    per_device = -(-compiled_rows // devices)
    if per_device * need.total <= free:
        return
    fit = free // need.total * devices
    fit = 1 << (fit.bit_length() - 1) if fit else 0
    where = f" on each of {devices} devices" if devices > 1 else ""
    advice = f"at most {fit} rows fit; split the batch" if fit else "not one row fits"
    raise BatchTooLarge(f"a batch of {rows} rows needs about {_size(per_device * need.total)}{where} ({need}), "
                        f"more than the {_size(free)} available: {advice}")


def _size(n: int) -> str:
    for unit, scale in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if n >= scale:
            return f"{n / scale:.1f} {unit}"
    return f"{n} B"


def _meminfo(field: str) -> int | None:
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith(field + ":"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


def _address_space_left() -> int | None:
    soft, _ = resource.getrlimit(resource.RLIMIT_AS)
    if soft == resource.RLIM_INFINITY:
        return None
    try:
        with open("/proc/self/status") as f:
            used = next(int(line.split()[1]) * 1024 for line in f if line.startswith("VmSize:"))
    except (OSError, StopIteration):
        return None
    return soft - used


def _cgroup_left() -> int | None:
    try:
        limit = Path("/sys/fs/cgroup/memory.max").read_text().strip()
        used = int(Path("/sys/fs/cgroup/memory.current").read_text())
    except (OSError, ValueError):
        return None
    return None if limit == "max" else int(limit) - used


__all__ = ["BatchTooLarge", "RowBytes", "row_bytes", "available_bytes", "check"]
