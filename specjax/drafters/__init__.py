"""Drafters: one class per method, each a pytree with pure init/propose/update."""

from specjax.drafters.base import Context, Drafter, NoDrafter

__all__ = ["Context", "Drafter", "NoDrafter"]
