"""rms_norm: the CPU kernel for the decode and verify rows, XLA elsewhere."""

from __future__ import annotations

from pallas_kernels.backend import pick_impl
from pallas_kernels.rms_norm import cpu, reference


def rms_norm(x, w, *, eps: float, offset: float = 0.0, impl: str | None = None):
    """x [..., D] normed over D and scaled by (offset + w [D]), in x's dtype (contract:
    reference.rms_norm). On CPU (see backend.pick_impl) the kernel runs for the few rows of a
    decode or verify step (up to cpu.MAX_ELEMENTS elements), each summed by the same code
    whatever the row count, so a decode step and a verify pass give a row the same bits;
    XLA's fusion runs otherwise."""
    rows = x.reshape(-1, x.shape[-1])
    if pick_impl(impl, False) == "cpu" and cpu.supports(*rows.shape):
        return cpu.rms_norm(rows, w, eps, offset).astype(x.dtype).reshape(x.shape)
    return reference.rms_norm(x, w, eps=eps, offset=offset)
