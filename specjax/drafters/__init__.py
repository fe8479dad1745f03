"""Drafters: one class per method, each a pytree with pure init/propose/update."""

from specjax.drafters.base import Context, Drafter, NoDrafter
from specjax.drafters.draft_model import DraftModel
from specjax.drafters.prompt_lookup import PromptLookup

__all__ = ["Context", "Drafter", "NoDrafter", "DraftModel", "PromptLookup"]
