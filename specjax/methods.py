"""Every decoding method by name, registered once, here: its factory, a one-line description,
what it needs besides the target and its exact rule when sampling. The command line
(`--drafter` and `--help`), the benchmarks (`python -m specjax bench`, `specjax.bench.structured`)
and the README's methods table (`methods_table()`) are made from `METHODS`.

The settings are those of a CPU: small trees (4-8 nodes; SAM's 16-node chain only after a long
match, prompt lookup only on a match of two tokens or more), since there a verify over many
tree tokens costs more than it returns. On a GPU larger trees pay: build the drafter yourself
(e.g. `TokenRecycling()` with the paper's 81-node template, `Lookahead()` with its defaults).

A new drafter is one module in `specjax/drafters/` and one `Method` in `METHODS` below (see
docs/guide/write-a-drafter.md).
"""

from __future__ import annotations

import dataclasses
import json
from typing import Any, Callable

from specjax import adaptive
from specjax.convert import heads as ckpt
from specjax.convert import load
from specjax.drafters import (ADED, DEL, PPD, RASD, SAM, Clover, DraftModel, Drafter, Eagle, Forced, HiddenTransfer,
                              Lookahead, Medusa, PromptLookup, QuantizedSelf, SpeculativeJacobi, Swift,
                              TokenRecycling)
from specjax.drafters.dynamic_exit import spread_exits
from specjax.models import Model

RUNNERS = ("drafter", "adaptive", "peer")


@dataclasses.dataclass(frozen=True)
class Method:
    """A decoding method.

    make(target, draft[, argument]): what decodes: a Drafter for `sj.generate` (None: plain AR)
      when runner is "drafter", an `adaptive.Adaptive` when "adaptive", transformers' `generate`
      keywords when "peer" (target and draft are then transformers models; the bench only);
      `draft` is None unless the method needs a draft model (then None means the shipped one);
    needs: what it needs besides the target: "draft model", "shipped head" (found by the
      target's shape), "head folder", "constraint" (a `constraint=` to decode under),
      "transformers";
    verifier: the exact rule it verifies with when sampling (Greedy at temperature 0); "" for
      methods without a draft;
    argument: the placeholder of a method written `name:ARGUMENT` ("" for a plain name);
    max_batch: the largest batch it runs (None: any).
    """

    name: str
    make: Callable[..., Any]
    description: str
    needs: tuple[str, ...] = ()
    verifier: str = "TopK"
    runner: str = "drafter"
    argument: str = ""
    max_batch: int | None = None

    def __post_init__(self):
        if self.runner not in RUNNERS:
            raise ValueError(f"runner must be one of {RUNNERS}, got {self.runner!r}")

    @property
    def usage(self) -> str:
        """How the method is written on the command line."""
        return f"{self.name}:{self.argument}" if self.argument else self.name


def _settings(cls, **settings) -> Callable[[Model, Model | None], Any]:
    return lambda target, draft: cls(**settings)


def _draft(mode: str, **settings) -> Callable[[Model, Model | None], DraftModel]:
    return lambda target, draft: DraftModel(load("tiny-draft") if draft is None else draft, mode=mode, **settings)


def _shipped(cls, kind: str, **tiny_settings) -> Callable[[Model, Model | None], Any]:
    """The `kind` head shipped for the target: tiny's (with `tiny_settings`: 8-node trees for the
    CPU) or SmolLM2's (the tree settings stored with it, chosen against AR on held-out prompts)."""
    def make(target: Model, draft) -> Any:
        try:
            name = ckpt.shipped_target(target.config, kind)
        except ValueError as e:
            raise ValueError(f"{e}; {_shipped_for(target)}") from None
        return cls.load(name, **(tiny_settings if name == "tiny" else {}))
    return make


def _shipped_for(target: Model) -> str:
    """Which heads are shipped for a target of this shape, said for an error message."""
    want = ckpt.target_signature(target.config)
    fits = {}
    for meta_file in sorted(ckpt.ASSETS.glob(f"*/{ckpt.HEAD_JSON}")):
        meta = json.loads(meta_file.read_text())
        if meta.get("target") == want:
            fits.setdefault(meta_file.parent.name.removesuffix(f"-{meta['kind']}"), []).append(meta["kind"])
    if not fits:
        return "train one: docs/guide/training.md"
    return "; ".join(f"heads shipped for {name}, a target of this shape: {', '.join(kinds)}" for name, kinds in fits.items())


def _adaptive(base: str, ks: tuple[int, ...]) -> Callable[[Model, Model | None], adaptive.Adaptive]:
    return lambda target, draft: adaptive.Adaptive(make(base, target, draft), ks=ks)


_RECYCLING_8 = (-1, 0, 0, 0, 1, 1, 2, 4)
_SAM_LENGTHS = ((2, 3), (4, 7), (8, 15))
DRAFT, HEAD = ("draft model",), ("shipped head",)



def _registry(*methods: Method) -> dict[str, Method]:
    """The methods by `usage`, each once."""
    table = {}
    for m in methods:
        if m.usage in table:
            raise ValueError(f"method {m.usage!r} is registered twice")
        table[m.usage] = m
    return table


METHODS: dict[str, Method] = _registry(
    Method("ar", lambda target, draft: None, "plain autoregressive decoding, one token per step", verifier=""),
    Method("draft-chain", _draft("chain", k=3), "a draft model drafts a chain of 3 tokens", DRAFT,
           "SpeculativeSampling"),
    Method("draft-iid", _draft("iid", k=2, depth=3), "a draft model drafts 2 independent sequences of 3 (SpecTr)",
           DRAFT, "SpecTr"),
    Method("draft-gumbel", _draft("gumbel", branching=(2, 1, 1)),
           "a draft model's tree, children drawn without replacement (RSD-C), branching (2, 1, 1)", DRAFT, "RSD"),
    Method("draft-beam", _draft("beam", width=2, depth=3),
           "a draft model's stochastic beam search (RSD-S), width 2, depth 3", DRAFT, "RSD"),
    Method("draft-topk", _draft("topk", template=(-1, 0, 0, 1, 1, 2, 3, 5)),
           "a draft model's top tokens in a static 8-node tree", DRAFT),
    Method("draft-dyspec", _draft("dyspec", width=2, depth=3),
           "a draft model grows DySpec's dynamic tree, 2 nodes a round for 3 rounds", DRAFT, "RSD"),
    Method("prompt-lookup", _settings(PromptLookup, max_ngram=3, num_tokens=6, min_ngram=2),
           "prompt lookup: the continuation of an earlier match of the last 2-3 tokens"),
    Method("lookahead", _settings(Lookahead, decoding_length=7, branch_length=4, max_nodes=2048),
           "Lookahead decoding: n-grams collected from Jacobi iterations, a 7-node tree"),
    Method("recycling", _settings(TokenRecycling, template=_RECYCLING_8),
           "Token Recycling: the target's own recent top-k successors, an 8-node tree"),
    Method("sjd", _settings(SpeculativeJacobi, window=3),
           "Speculative Jacobi Decoding: the target's previous iteration drafts a window of 3",
           verifier="SpeculativeSampling"),
    Method("sam", _settings(SAM, draft_lengths=_SAM_LENGTHS),
           "SAM: suffix-automaton retrieval from the prompt and the output so far"),
    Method("sam-recycling", lambda target, draft: SAM(draft_lengths=_SAM_LENGTHS,
                                                      fallback=TokenRecycling(template=(-1, 0, 0, 1))),
           "SAM, with Token Recycling's tree where nothing matches"),
    Method("rasd", lambda target, draft: RASD(TokenRecycling(template=_RECYCLING_8), SAM(), budget=8),
           "RASD: SAM's chain fused into Token Recycling's tree, pruned to 8 nodes"),
    Method("aded", _settings(ADED, tree_nodes=8, depth=5),
           "ADED: a trigram table of the decode so far grows an 8-node tree"),
    Method("medusa", _shipped(Medusa, "medusa", tree_size=8),
           "Medusa heads on the target's last hidden state draft a sparse tree", HEAD),
    Method("eagle", _shipped(Eagle, "eagle", top_k=4, depth=4, total_tokens=8),
           "an EAGLE head (EAGLE-3 on SmolLM2) grows EAGLE-2's dynamic tree from the target's features", HEAD),
    Method("clover", _shipped(Clover, "clover", tree_size=8),
           "a Clover head (an RNN over the drafted path) drafts a sparse tree", HEAD),
    Method("ppd", _shipped(PPD, "ppd", tree_size=8, guess_budget=8),
           "Parallel Prompt Decoding: trained prompt tokens guess ahead inside the verify pass", HEAD),
    Method("hidden-transfer", _shipped(HiddenTransfer, "hidden-transfer", tree_size=8, guess_budget=8),
           "Hidden Transfer: pseudo hidden states guess ahead inside the verify pass", HEAD),
    Method("swift", _settings(Swift, depth=6),
           "SWIFT: the target with layers skipped (a set searched while decoding) drafts a chain",
           verifier="SpeculativeSampling"),
    Method("del", lambda target, draft: DEL(exits=spread_exits(target.config.num_layers), depth=6),
           "DEL: the target's early exits draft a chain, the exit chosen by its acceptance",
           verifier="SpeculativeSampling"),
    Method("quantized-self", lambda target, draft: QuantizedSelf.of(target, "int8", depth=6, threshold=0.3),
           "the target's own int8 copy drafts a chain of up to 6 on the target's KV cache (QSpec, ML-SpecQD)",
           verifier="SpeculativeSampling"),
    Method("eagle", lambda target, draft, folder: Eagle.load(folder, target=target),
           "a trained EAGLE head saved in FOLDER, with its stored tree settings", ("head folder",),
           argument="FOLDER"),
    Method("forced+prompt-lookup", lambda target, draft: Forced(PromptLookup()),
           "the constraint's forced text, then prompt lookup's chain", ("constraint",)),
    Method("forced", lambda target, draft: Forced(),
           "the constraint's forced text: its certain and predicted tokens as a chain", ("constraint",)),
    Method("adaptive-draft-chain", _adaptive("draft-chain", (0, 1, 2, 4)),
           "draft-chain with its length (0-4) chosen as it decodes, by goodput (SmartSpec)", DRAFT,
           "SpeculativeSampling", runner="adaptive"),
    Method("adaptive-prompt-lookup", _adaptive("prompt-lookup", (0, 1, 2, 4, 8)),
           "prompt lookup with its length (0-8) chosen as it decodes, by goodput (SmartSpec)",
           runner="adaptive"),
    Method("hf-ar", lambda target, draft: {}, "transformers' greedy generate on the same weights",
           ("transformers",), verifier="", runner="peer"),
    Method("hf-assisted", lambda target, draft: {"assistant_model": draft},
           "transformers' assisted generation with the draft model (its defaults: 20 tokens, "
           "constant schedule, confidence threshold 0.4)", ("transformers", "draft model"), verifier="",
           runner="peer", max_batch=1),
    Method("hf-prompt-lookup", lambda target, draft: {"prompt_lookup_num_tokens": 8, "max_matching_ngram_size": 3},
           "transformers' prompt lookup, prompt_lookup_num_tokens=8, max_matching_ngram_size=3",
           ("transformers",), verifier="", runner="peer", max_batch=1),
)


def find(name: str) -> tuple[Method, str | None]:
    """The method written `name` and its argument ("eagle:runs/head" -> the eagle:FOLDER method
    and "runs/head"; None for a plain name)."""
    m = METHODS.get(name)
    if m is not None and not m.argument:
        return m, None
    prefix, sep, arg = name.partition(":")
    m = next((m for m in METHODS.values() if m.argument and m.name == prefix), None)
    if m is None or not sep or not arg:
        raise ValueError(f"unknown method {name!r}; choose from: {', '.join(METHODS)}")
    return m, arg


def make(name: str, target: Model, draft: Model | str | None = None) -> Any:
    """What the method written `name` decodes `target` with (a Drafter, None for AR, or an
    `adaptive.Adaptive`; see `Method.make`), checked against `target` before anything runs: a
    ValueError says what fits. `draft`: the draft model (or its path) of methods that need one;
    default the shipped one."""
    m, arg = find(name)
    if m.runner == "peer":
        raise ValueError(f"{name} is transformers' own decoding, run by the benchmark only")
    if "draft model" in m.needs:
        draft = load("tiny-draft" if draft is None else draft) if not isinstance(draft, Model) else draft
        if draft.config.vocab_size != target.config.vocab_size:
            raise ValueError(f"{name} needs a draft model with the target's vocabulary of "
                             f"{target.config.vocab_size} tokens (the draft model has "
                             f"{draft.config.vocab_size}): pass one (--draft PATH)")
    else:
        draft = None
    made = m.make(target, draft) if arg is None else m.make(target, draft, arg)
    if isinstance(made, Drafter):
        try:
            made.check(target)
        except ValueError as e:
            raise ValueError(f"{name} does not fit this target: {e}") from None
    return made


def methods_table() -> str:
    """The methods as a markdown table (the README's)."""
    lines = ["| method | what it does | needs | verifier when sampling |", "|---|---|---|---|"]
    for m in METHODS.values():
        lines.append(f"| `{m.usage}` | {m.description} | {', '.join(m.needs) or '-'} | {m.verifier or '-'} |")
    return "\n".join(lines)
