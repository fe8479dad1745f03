"""Drafters by name, with the settings the command line and the benchmark use.

The trees are sized for the CPU, where a verify step over N tree tokens costs about as much as
N / 4 single-token steps once N passes ~8 (the target's matmuls turn compute-bound): every
named tree has 4-8 nodes, but for SAM's 16-node chain, drafted only after an 8-token match. Prompt lookup drafts only on a match of 2 or more tokens: on
SmolLM2's answers a 1-token match almost always exists and rarely holds, and its 7-node verify
then costs more than it returns (benchmarks/prompt_lookup_policy.py). On a GPU larger trees pay; build the drafter yourself there (e.g.
`TokenRecycling()` with the paper's 81-node template, `Lookahead()` with its defaults).
"""

from __future__ import annotations

from typing import Callable

import jax

from specjax.convert import heads as ckpt
from specjax.drafters.aded import ADED
from specjax.drafters.base import Drafter
from specjax.drafters.clover import Clover
from specjax.drafters.draft_model import DraftModel
from specjax.drafters.dynamic_exit import DEL, spread_exits
from specjax.drafters.eagle import Eagle
from specjax.drafters.jacobi import SpeculativeJacobi
from specjax.drafters.lookahead import Lookahead
from specjax.drafters.medusa import Medusa
from specjax.drafters.parallel import PPD, HiddenTransfer
from specjax.drafters.prompt_lookup import PromptLookup
from specjax.drafters.rasd import RASD
from specjax.drafters.recycling import TokenRecycling
from specjax.drafters.sam import SAM
from specjax.drafters.swift import Swift
from specjax.models import Model


def _draft(mode: str, **settings) -> Callable[[Model], Drafter]:
    def make(target: Model, draft: Model | str = "tiny-draft") -> Drafter:
        from specjax.convert import load  # the shipped draft, loaded only when asked for
        return DraftModel(load(draft) if not isinstance(draft, Model) else draft, mode=mode, **settings)
    make.uses_draft = True
    return make


def _shipped(cls, kind: str, **tiny_settings) -> Callable[[Model], Drafter]:
    """The `kind` head shipped for the target: tiny's (with `tiny_settings`: 8-node trees for the
    CPU) or SmolLM2's (the tree settings stored with it, chosen against AR on held-out prompts)."""
    def make(target: Model) -> Drafter:
        name = ckpt.shipped_target(target.config, kind)
        drafter = cls.load(name, **(tiny_settings if name == "tiny" else {}))
        drafter.check(target)
        return drafter
    return make


NAMED: dict[str, Callable[[Model], Drafter | None]] = {
    "ar": lambda target: None,
    "draft-chain": _draft("chain", k=3),
    "draft-iid": _draft("iid", k=2, depth=3),
    "draft-gumbel": _draft("gumbel", branching=(2, 1, 1)),
    "draft-beam": _draft("beam", width=2, depth=3),
    "draft-topk": _draft("topk", template=(-1, 0, 0, 1, 1, 2, 3, 5)),
    "draft-dyspec": _draft("dyspec", width=2, depth=3),
    "prompt-lookup": lambda target: PromptLookup(max_ngram=3, num_tokens=6, min_ngram=2),
    "lookahead": lambda target: Lookahead(decoding_length=7, branch_length=4, max_nodes=2048),
    "recycling": lambda target: TokenRecycling(template=(-1, 0, 0, 0, 1, 1, 2, 4)),
    "sjd": lambda target: SpeculativeJacobi(window=3),
    "sam": lambda target: SAM(draft_lengths=((2, 3), (4, 7), (8, 15))),
    "sam-recycling": lambda target: SAM(draft_lengths=((2, 3), (4, 7), (8, 15)),
                                        fallback=TokenRecycling(template=(-1, 0, 0, 1))),
    "rasd": lambda target: RASD(TokenRecycling(template=(-1, 0, 0, 0, 1, 1, 2, 4)), SAM(), budget=8),
    "aded": lambda target: ADED(tree_nodes=8, depth=5),
    "medusa": _shipped(Medusa, "medusa", tree_size=8),
    "eagle": _shipped(Eagle, "eagle", top_k=4, depth=4, total_tokens=8),
    "clover": _shipped(Clover, "clover", tree_size=8),
    "ppd": lambda target: PPD.load("tiny", tree_size=8, guess_budget=8),
    "hidden-transfer": lambda target: HiddenTransfer.load("tiny", tree_size=8, guess_budget=8),
    "swift": lambda target: Swift(depth=6),
    "del": lambda target: DEL(exits=spread_exits(target.config.num_layers), depth=6),
}


def named_drafter(name: str, target: Model, draft: Model | str | None = None) -> Drafter | None:
    """The drafter called `name` (see NAMED) for `target`; None for plain autoregressive.
    `draft`: the draft model (or its path) for the draft-* methods; default the shipped one."""
    if name not in NAMED:
        raise ValueError(f"unknown drafter {name!r}; choose from: {', '.join(NAMED)}")
    if draft is not None and getattr(NAMED[name], "uses_draft", False):
        return NAMED[name](target, draft)
    return NAMED[name](target)


# Weights past any CPU cache: a batch-1 step reads them all from memory, the regime where a step
# over a few tokens costs little more than over one (SmolLM2-135M in float32: 540 MB).
MEMORY_BOUND_BYTES = 256 << 20


def default_drafter(target: Model, temperature: float) -> str:
    """The named drafter the command line uses when none is given: the fastest measured for this
    kind of target and temperature (benchmarks/README.md), never one measured slower than AR.
    Prompt lookup at temperature 0; when sampling, prompt lookup for a target whose weights are
    memory-bound (SmolLM2 at T = 0.7: 1.12x AR on the chat set, 1.26x on HumanEval) and AR for
    one that fits in cache (the shipped tiny model, where prompt lookup ran 2.5x slower)."""
    if temperature == 0:
        return "prompt-lookup"
    weights = sum(leaf.nbytes for leaf in jax.tree.leaves(target.params))
    return "prompt-lookup" if weights >= MEMORY_BOUND_BYTES else "ar"
