"""Drafters by name, with the settings the command line and the benchmark use."""

from __future__ import annotations

from typing import Callable

from specjax.drafters.base import Drafter
from specjax.drafters.draft_model import DraftModel
from specjax.drafters.heads import Eagle, Medusa
from specjax.drafters.lookahead import Lookahead
from specjax.drafters.prompt_lookup import PromptLookup
from specjax.drafters.recycling import TokenRecycling
from specjax.models import Model


def _draft(mode: str, **settings) -> Callable[[Model], Drafter]:
    def make(target: Model, draft: Model | str = "tiny-draft") -> Drafter:
        from specjax.convert import load  # the shipped draft, loaded only when asked for
        return DraftModel(load(draft) if not isinstance(draft, Model) else draft, mode=mode, **settings)
    make.uses_draft = True
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
    "medusa": lambda target: Medusa.load("tiny"),
    "eagle": lambda target: Eagle.load("tiny", target=target),
}


def named_drafter(name: str, target: Model, draft: Model | str | None = None) -> Drafter | None:
    """The drafter called `name` (see NAMED) for `target`; None for plain autoregressive.
    `draft`: the draft model (or its path) for the draft-* methods; default the shipped one."""
    if name not in NAMED:
        raise ValueError(f"unknown drafter {name!r}; choose from: {', '.join(NAMED)}")
    if draft is not None and getattr(NAMED[name], "uses_draft", False):
        return NAMED[name](target, draft)
    return NAMED[name](target)
