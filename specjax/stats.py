"""What a decode measured: `Stats`, and the `Clock` that times decoding apart from compiling."""

from __future__ import annotations

import dataclasses
import time

import jax
import numpy as np


@dataclasses.dataclass(frozen=True)
class Stats:
    """One decode call, summed over its rows.

    tau: committed tokens per target forward (bonus included, output cut-offs excluded);
    steps: loop steps over all rows; acceptance_per_depth[d-1]: P(depth d accepted | depth
    d - 1 accepted); wall_time_s: the decoding alone, compile_s: the tracing and compiling the
    call paid; verifier: the rule's class name ("none (greedy)" / "none (sampling)" for AR)."""

    method: str
    verifier: str
    tau: float
    steps: int
    committed_tokens: int
    target_calls: int
    acceptance_per_depth: tuple[float, ...]
    new_tokens: int
    wall_time_s: float
    compile_s: float
    tokens_per_s: float

    @classmethod
    def count(cls, method: str, verifier: str, num_tokens: np.ndarray, target_calls: np.ndarray,
              accepted_hist: np.ndarray, wall: float, compile_s: float) -> Stats:
        """From the loop's counters: num_tokens and target_calls int[B], accepted_hist
        int[B, D+1] (steps that accepted exactly d drafts)."""
        hist = accepted_hist.sum(0)
        steps = int(hist.sum())
        reach = hist[::-1].cumsum()[::-1]  # reach[d] = steps that accepted >= d drafts
        committed = float((hist * np.arange(len(hist))).sum() + hist.sum())
        new = int(num_tokens.sum())
        return cls(method, verifier, committed / max(steps, 1), steps, int(committed), int(target_calls.max()),
                   tuple(float(reach[d] / reach[d - 1]) if reach[d - 1] else 0.0 for d in range(1, len(hist))),
                   new, wall, compile_s, float(new / wall) if wall > 0 else float("inf"))

    def to_dict(self) -> dict:
        """The fields as plain JSON-ready values."""
        return dataclasses.asdict(self)


class Clock:
    """Started when made; `read()` gives (seconds since, without the compiling in them;
    seconds of tracing, lowering and compiling since), from JAX's monitoring events."""

    def __init__(self):
        self._compiled, self._start = _compiled[0], time.perf_counter()

    def read(self) -> tuple[float, float]:
        compile_s = _compiled[0] - self._compiled
        return time.perf_counter() - self._start - compile_s, compile_s


_COMPILE_EVENTS = ("/jax/core/compile/jaxpr_trace_duration",
                   "/jax/core/compile/jaxpr_to_mlir_module_duration",
                   "/jax/core/compile/backend_compile_duration")
_compiled = [0.0]  # seconds this process has spent compiling


def _on_event(event: str, duration: float, **_):
    if event in _COMPILE_EVENTS:
        _compiled[0] += duration


jax.monitoring.register_event_duration_secs_listener(_on_event)
