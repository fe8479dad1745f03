"""Drafters by name, with the settings the command line and the benchmark use."""

from __future__ import annotations

from typing import Callable

from specjax.drafters.base import Drafter
from specjax.drafters.draft_model import DraftModel
from specjax.drafters.lookahead import Lookahead
from specjax.drafters.prompt_lookup import PromptLookup
from specjax.drafters.recycling import TokenRecycling
from specjax.models import Model


def _draft(mode: str, **settings) -> Callable[[Model], Drafter]:
    def make(target: Model) -> Drafter:
        from specjax.convert import load  # the shipped draft, loaded only when asked for
        return DraftModel(load("tiny-draft"), mode=mode, **settings)
    return make


NAMED: dict[str, Callable[[Model], Drafter | None]] = {
    "ar": lambda target: None,
    "draft-chain": _draft("chain", k=4),
    "draft-iid": _draft("iid", k=3, depth=3),
    "draft-gumbel": _draft("gumbel", branching=(3, 2, 2, 1)),
    "draft-beam": _draft("beam", width=4, depth=4),
    "draft-topk": _draft("topk", template=(-1, 0, 0, 0, 1, 1, 2, 4, 4, 7, 9)),
    "prompt-lookup": lambda target: PromptLookup(max_ngram=3, num_tokens=8),
    "lookahead": lambda target: Lookahead(decoding_length=32, branch_length=8),
    "recycling": lambda target: TokenRecycling(),
}


def named_drafter(name: str, target: Model) -> Drafter | None:
    """The drafter called `name` (see NAMED) for `target`; None for plain autoregressive."""
    if name not in NAMED:
        raise ValueError(f"unknown drafter {name!r}; choose from: {', '.join(NAMED)}")
    return NAMED[name](target)
