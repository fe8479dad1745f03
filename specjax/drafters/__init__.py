"""Drafters: the protocol (`base`: Drafter, Context, AR) and one module per method, each a pytree
with pure init/propose/update and a NamedTuple state of its own. Pieces several drafters share
are in `blocks` (feature cache, suffix automaton, layer-skip drafting); tree shapes, pruning and
growth in `specjax.tree`; head checkpoints in `specjax.convert.heads`; the methods by name in
`specjax.methods`."""

from specjax.drafters.aded import ADED
from specjax.drafters.base import Context, Drafter, EmptyState, NoDrafter
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
from specjax.drafters.quantized_self import QuantizedSelf
from specjax.drafters.rasd import RASD
from specjax.drafters.recycling import TokenRecycling
from specjax.drafters.sam import SAM
from specjax.drafters.swift import Swift

__all__ = ["Context", "Drafter", "EmptyState", "NoDrafter", "ADED", "DraftModel", "Clover", "DEL", "Eagle",
           "Forced", "Medusa", "Lookahead", "PPD", "HiddenTransfer", "PromptLookup", "QuantizedSelf", "RASD", "SAM",
           "SpeculativeJacobi", "Swift", "TokenRecycling"]
