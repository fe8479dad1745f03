"""Drafters: one class per method, each a pytree with pure init/propose/update."""

from specjax.drafters.base import Context, Drafter, NoDrafter
from specjax.drafters.clover import Clover
from specjax.drafters.draft_model import DraftModel
from specjax.drafters.heads import Eagle, Medusa
from specjax.drafters.lookahead import Lookahead
from specjax.drafters.parallel import PPD, HiddenTransfer
from specjax.drafters.prompt_lookup import PromptLookup
from specjax.drafters.recycling import TokenRecycling

__all__ = ["Context", "Drafter", "NoDrafter", "DraftModel", "Clover", "Eagle", "Medusa", "Lookahead", "PPD", "HiddenTransfer", "PromptLookup", "TokenRecycling"]
