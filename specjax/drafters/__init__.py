"""Drafters: one class per method, each a pytree with pure init/propose/update; one module per
family (base: the protocol and AR; sparse_tree: Medusa's static tree, shared by the head
drafters; self_draft: the layer-skipped chain Swift and DEL draft; checkpoints of heads live in
`specjax.convert.heads`)."""

from specjax.drafters.aded import ADED
from specjax.drafters.base import Context, Drafter, NoDrafter
from specjax.drafters.clover import Clover
from specjax.drafters.draft_model import DraftModel
from specjax.drafters.dynamic_exit import DEL
from specjax.drafters.eagle import Eagle
from specjax.drafters.forced import Forced
from specjax.drafters.jacobi import SpeculativeJacobi
from specjax.drafters.lookahead import Lookahead
from specjax.drafters.medusa import Medusa
from specjax.drafters.parallel import PPD, HiddenTransfer
from specjax.drafters.prompt_lookup import PromptLookup
from specjax.drafters.rasd import RASD
from specjax.drafters.recycling import TokenRecycling
from specjax.drafters.sam import SAM
from specjax.drafters.swift import Swift

__all__ = ["Context", "Drafter", "NoDrafter", "ADED", "DraftModel", "Clover", "DEL", "Eagle", "Forced", "Medusa",
           "Lookahead", "PPD", "HiddenTransfer", "PromptLookup", "RASD", "SAM", "SpeculativeJacobi", "Swift",
           "TokenRecycling"]
