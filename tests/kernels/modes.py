"""Test modes: each kernel runs on its own backend, or interpreted on CPU.

On CPU, `interpret=True` is HLO interpret mode (outputs start as NaN there, so an element a
kernel never writes fails the comparison) and `pltpu.InterpretParams` is TPU interpret mode
(NaN-initialised memory, out-of-bounds reads raise, optional race detection). On a GPU the GPU
cases run compiled (interpret=False) and the rest skip; likewise on a TPU.
"""

from __future__ import annotations

import jax
import pytest
from jax.experimental.pallas import tpu as pltpu

BACKEND = jax.default_backend()
ON_ACCELERATOR = BACKEND in ("gpu", "tpu")

# mode -> (kernel backend, interpret argument used on CPU)
MODES = {
    "gpu": ("gpu", True),
    "tpu": ("tpu", True),
    "tpu-interpret": ("tpu", pltpu.InterpretParams(detect_races=True)),
}


def interpret_for(mode: str):
    """The `interpret` argument for a test mode here, or skip when it cannot run here."""
    kernel_backend, cpu_interpret = MODES[mode]
    if not ON_ACCELERATOR:
        return cpu_interpret
    if kernel_backend == BACKEND and cpu_interpret is True:
        return False
    pytest.skip(f"{mode} kernel test does not run on {BACKEND}")


def races_found() -> bool | None:
    """Whether TPU interpret mode's race detector fired (None if this jax hides it)."""
    try:
        from jax._src.pallas.mosaic.interpret import interpret_pallas_call
    except ImportError:
        return None
    races = getattr(interpret_pallas_call, "races", None)
    return None if races is None else races.races_found
