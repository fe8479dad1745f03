"""Structured output: a JSON schema, a regex or a Lark grammar compiled once, on the host, into
a `Grammar` constraint that `sj.generate(..., constraint=c)` runs inside the jitted loop.

    c = sj.constraints.json_schema({"type": "object", ...}, tokenizer)
    out = sj.generate(model, prompts, constraint=c, drafter=sj.drafters.Forced(...))

The grammar engine is llguidance (`pip install specjax[constraints]`): it covers JSON Schema
as real schemas use it (recursion, `patternProperties`, `uniqueItems` is refused with its name),
compiles in milliseconds under limits on time and size, and computes a row's allowed tokens per
step on the host (one callback a step gives every node of every row's draft tree). Small
languages (enums, short regexes: `automaton.fits_on_device`) run instead as a `TokenAutomaton`
on the device, built through outlines-core, with the same language. JSON is written in
`json.dumps` spacing (", " and ": ", no other whitespace), the text a model most often writes,
so the text between free choices is forced and `sj.drafters.Forced` drafts it.
`Constraint` is the protocol the decode loop runs (`base`); `Unconstrained` its no-op default.
"""

from __future__ import annotations

import json
from collections.abc import Sequence

from specjax.constraints import matchers
from specjax.constraints.automaton import TokenAutomaton, fits_on_device
from specjax.constraints.base import Constraint, Unconstrained
from specjax.constraints.forced_text import forced_first_tokens
from specjax.constraints.grammar import Grammar, host_grammar
from specjax.constraints.json_schema import UnsupportedSchema, schema_regex
from specjax.constraints.vocabulary import outlines_vocabulary, token_bytes
from specjax.json_text import json_object

__all__ = ["Constraint", "Grammar", "TokenAutomaton", "Unconstrained", "UnsupportedSchema", "grammar",
           "json_schema", "per_row", "regex"]

ENGINES = ("auto", "automaton", "llguidance")  # auto: the automaton where it fits, else llguidance
MAX_AUTOMATON_SCHEMA = 512  # characters of schema text tried as an automaton
JSON_STYLE = {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "}


def regex(pattern: str, tokenizer, *, vocab_size: int | None = None, engine: str = "auto") -> Grammar:
    """The token sequences whose text fully matches `pattern`, then EOS.
    tokenizer: `sj.load_tokenizer(...)`'s, a `tokenizers.Tokenizer` or a transformers one;
    vocab_size: the model's (default the tokenizer's; a larger model vocabulary forbids the rest);
    engine: one of ENGINES."""
    import llguidance

    _check_engine(engine)
    device = engine == "automaton" or (engine == "auto" and fits_on_device(pattern))
    return _build(llguidance.LLMatcher.grammar_from_regex(pattern), f"the regex {pattern!r}", tokenizer,
                  vocab_size, pattern if device else None)


def json_schema(schema: dict | str, tokenizer, *, whitespace: str | None = None,
                vocab_size: int | None = None, engine: str = "auto") -> Grammar:
    """The JSON documents valid under `schema` (a dict or JSON text), in json.dumps spacing
    (whitespace: a regex allowed between JSON tokens instead). Raises UnsupportedSchema naming
    a feature the engine cannot enforce or a limit the schema exceeds. engine: one of ENGINES."""
    import llguidance

    _check_engine(engine)
    schema = json_object(schema, "the schema", UnsupportedSchema, kinds=(dict, bool))
    if engine == "automaton":
        return regex(schema_regex(schema, whitespace), tokenizer, vocab_size=vocab_size, engine="automaton")
    if engine == "auto" and _small_schema(schema):  # the automaton where no whitespace is written
        try:
            pattern = schema_regex(schema, "")
        except UnsupportedSchema:
            pattern = None
        if pattern is not None and pattern == schema_regex(schema, " ") and fits_on_device(pattern):
            return regex(pattern, tokenizer, vocab_size=vocab_size, engine="automaton")
    style = JSON_STYLE if whitespace is None else {"whitespace_flexible": True, "whitespace_pattern": whitespace}
    try:
        source = llguidance.LLMatcher.grammar_from_json_schema(schema, overrides=style)
    except ValueError as e:
        raise UnsupportedSchema(f"the schema is not a JSON object: {e}") from None
    return _build(source, "the JSON schema", tokenizer, vocab_size, None)


def grammar(lark: str, tokenizer, *, vocab_size: int | None = None) -> Grammar:
    """The texts of a Lark grammar (llguidance's dialect: `start: ...`, regex terminals, `%json`
    for an embedded JSON schema), then EOS."""
    import llguidance

    return _build(llguidance.LLMatcher.grammar_from_lark(lark), "the grammar", tokenizer, vocab_size, None)


def per_row(constraints: Sequence[Grammar | None]) -> Grammar:
    """One constraint a row: row i follows constraints[i] (None, or a row past the list: no
    constraint). Every grammar must come from the same tokenizer and vocabulary."""
    given = [c for c in constraints if c is not None]
    if not given:
        raise ValueError("per_row needs at least one constraint (pass constraint=None for none)")
    for c in given:
        if not isinstance(c, Grammar) or not hasattr(c, "_matchers"):
            raise TypeError(f"per_row takes constraints from sj.constraints (or None), got {type(c).__name__}")
    first = given[0]
    if any((c.vocab_size, c.eos_token_ids) != (first.vocab_size, first.eos_token_ids) for c in given):
        raise ValueError("per_row's constraints were built for different vocabularies or EOS tokens")
    starts = [None if c is None else c._matchers.grammars[0] for c in constraints]
    return host_grammar(matchers.Matchers(starts, first.vocab_size, first.eos_token_ids), first.vocab_size,
                        first.eos_token_ids)


def _build(source: str, what: str, tokenizer, vocab_size: int | None, device_pattern: str | None) -> Grammar:
    """The Grammar of llguidance grammar `source`, with a device automaton of `device_pattern`
    (a regex of the same language) when given."""
    tok, eos = _tokenizer(tokenizer)
    v = max(vocab_size or 0, tok.get_vocab_size())
    start = matchers.compile_grammar(source, matchers.ll_tokenizer(tok, eos, v), what)
    automaton = None if device_pattern is None else _automaton(device_pattern, tok, eos, v)
    return host_grammar(matchers.Matchers([start], v, eos, every_row=True), v, eos, automaton)


def _automaton(pattern: str, tok, eos: tuple[int, ...], vocab_size: int) -> TokenAutomaton:
    """The device automaton of `pattern`, through outlines-core's index."""
    from outlines_core import Index

    raw = token_bytes(tok)
    try:
        index = Index(pattern, outlines_vocabulary(raw, eos[0]))
    except ValueError as e:
        raise UnsupportedSchema(f"cannot compile the regex {pattern!r}: {e}") from None
    transitions = index.get_transitions()
    for state in index.get_final_states():  # every EOS id ends the output, not just the first
        transitions.setdefault(state, {}).update({e: state for e in eos})
    return TokenAutomaton.from_transitions(transitions, index.get_initial_state(), vocab_size, eos,
                                           forced_first_tokens(transitions, raw, tok, eos))


def _small_schema(schema) -> bool:
    """Whether a schema is small enough to try as a device automaton: a short text without
    references (the regex of a large or recursive schema can grow exponentially)."""
    text = json.dumps(schema)
    return isinstance(schema, dict) and len(text) <= MAX_AUTOMATON_SCHEMA and '"$ref"' not in text


def _check_engine(engine: str) -> None:
    if engine not in ENGINES:
        raise ValueError(f"engine must be one of {ENGINES}, got {engine!r}")


def _tokenizer(tokenizer):
    """(tokenizers.Tokenizer, EOS ids) from a specjax TextTokenizer, a transformers tokenizer or
    a tokenizers.Tokenizer (EOS: its <|endoftext|>, </s> or <|im_end|> token)."""
    from tokenizers import Tokenizer

    from specjax.tokenizer import TextTokenizer

    if isinstance(tokenizer, TextTokenizer):
        tok, eos = tokenizer.tokenizer, list(tokenizer.eos_token_ids)
    elif isinstance(tokenizer, Tokenizer):
        tok = tokenizer
        eos = [i for i in (tok.token_to_id(t) for t in ("<|endoftext|>", "</s>", "<|im_end|>")) if i is not None][:1]
    elif hasattr(tokenizer, "backend_tokenizer"):  # transformers' fast tokenizers
        tok, eos = tokenizer.backend_tokenizer, [tokenizer.eos_token_id]
    else:
        raise TypeError(f"expected a specjax, tokenizers or transformers tokenizer, got {type(tokenizer).__name__}")
    eos = [e for e in eos if e is not None]
    if not eos:
        raise ValueError("the tokenizer names no EOS token; a constraint needs one to end the output")
    return tok, tuple(eos)
