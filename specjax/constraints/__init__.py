"""Structured output: a JSON schema or a regex compiled once, on the host, into a token-level
automaton over the model's vocabulary (`TokenAutomaton`, compact device arrays), which
`sj.generate(..., constraint=c)` runs inside the jitted loop.

    c = sj.constraints.json_schema({"type": "object", ...}, tokenizer)
    out = sj.generate(model, prompts, constraint=c, drafter=sj.drafters.Forced(...))

The regex -> token DFA compilation is outlines-core's (`pip install specjax[constraints]`):
its index maps straight onto static arrays (a state's allowed tokens and next states), and it
covers the JSON Schema features of JSONSchemaBench's common kinds (objects, arrays, enums,
string formats, optional fields); what it does not enforce is refused (`UnsupportedSchema`).
`Constraint` is the protocol the decode loop runs (`base`); `Unconstrained` its no-op default."""

from __future__ import annotations

from specjax.constraints.automaton import TokenAutomaton
from specjax.constraints.base import Constraint, Unconstrained
from specjax.constraints.json_schema import UnsupportedSchema, schema_regex
from specjax.constraints.forced_text import forced_first_tokens
from specjax.constraints.vocabulary import outlines_vocabulary, token_bytes

__all__ = ["Constraint", "TokenAutomaton", "Unconstrained", "UnsupportedSchema", "json_schema", "regex"]


def regex(pattern: str, tokenizer, *, vocab_size: int | None = None) -> TokenAutomaton:
    """The automaton of the token sequences whose text fully matches `pattern`, then EOS.
    tokenizer: `sj.load_tokenizer(...)`'s, a `tokenizers.Tokenizer` or a transformers one;
    vocab_size: the model's (default the tokenizer's; a larger model vocabulary forbids the rest)."""
    from outlines_core import Index

    tok, eos = _tokenizer(tokenizer)
    raw = token_bytes(tok)
    try:
        index = Index(pattern, outlines_vocabulary(raw, eos[0]))
    except ValueError as e:
        raise UnsupportedSchema(f"cannot compile the regex {pattern!r}: {e}") from None
    transitions = index.get_transitions()
    for state in index.get_final_states():  # every EOS id ends the output, not just the first
        transitions.setdefault(state, {}).update({e: state for e in eos})
    return TokenAutomaton.from_transitions(transitions, index.get_initial_state(),
                                           max(vocab_size or 0, tok.get_vocab_size()), eos,
                                           forced_first_tokens(transitions, raw, tok, eos))


def json_schema(schema: dict | str, tokenizer, *, whitespace: str | None = None,
                vocab_size: int | None = None) -> TokenAutomaton:
    """The automaton of the JSON documents valid under `schema` (a dict or JSON text).
    whitespace: the regex allowed between JSON tokens (outlines-core's default: at most one
    space). Raises UnsupportedSchema naming a feature the compiler cannot enforce."""
    return regex(schema_regex(schema, whitespace), tokenizer, vocab_size=vocab_size)


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
