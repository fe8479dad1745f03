"""Forced text: what a constraint fixes from a state up to its next free choice, and the token
that drafts it.

A state that allows exactly one token is rare: after `{` a schema with the key "name" allows
`{"`, `"`, `"n`, `"name`, ... and, with optional whitespace, ` "name`, so no token is forced
although the text is. The text is followed on the byte automaton (the token automaton's
single-byte edges: a byte-level or byte-fallback vocabulary has a token for every byte): the
one allowed byte, and at an optional space the convention `json.dumps` writes (a space after
`,` and `:`, none elsewhere); it stops at any other choice of bytes, or where the output may
end. The tokenizer then splits the text as the model would write it,
and its first token is the state's draft: a prediction, settled by verification like any.
"""

from __future__ import annotations

from tokenizers import Tokenizer

SPACE = 0x20
SPACE_AFTER = b",:"  # json.dumps' separators are ", " and ": "


def forced_first_tokens(transitions: dict[int, dict[int, int]], raw: dict[int, bytes],
                        tokenizer: Tokenizer, eos_token_ids=(), max_bytes: int = 48) -> dict[int, int]:
    """{state: the first token of the text forced from it}, for the states that force some
    text that the tokenizer splits into allowed tokens. transitions: {state: {token: next}};
    raw: {token: bytes} (`vocabulary.token_bytes`); EOS edges mark the states that may end."""
    byte_token = {b[0]: i for i, b in raw.items() if len(b) == 1}
    bytes_out = {s: {b: d[i] for b, i in byte_token.items() if i in d} for s, d in transitions.items()}
    into: dict[int, set[int]] = {}
    for edges in bytes_out.values():
        for b, nxt in edges.items():
            into.setdefault(nxt, set()).add(b)
    final = {s for s, d in transitions.items() if any(e in d for e in eos_token_ids)}
    texts = {}
    for state in transitions:
        prev = into.get(state, ())
        text = _forced_bytes(state, bytes_out, final, next(iter(prev)) if len(prev) == 1 else None, max_bytes)
        text = _whole_characters(text)
        if text:
            texts[state] = text
    states = list(texts)
    encoded = tokenizer.encode_batch([texts[s] for s in states], add_special_tokens=False)
    return {s: e.ids[0] for s, e in zip(states, encoded) if e.ids and e.ids[0] in transitions[s]}


def _forced_bytes(state: int, bytes_out, final: set[int], prev: int | None, max_bytes: int) -> bytes:
    out = bytearray()
    while len(out) < max_bytes and state not in final:
        options = bytes_out.get(state, {})
        if len(options) == 1:
            (b,) = options
        elif SPACE in options and prev is not None and prev in SPACE_AFTER:
            b = SPACE
        elif len(options) == 2 and SPACE in options:
            b = next(b for b in options if b != SPACE)
        else:
            break
        out.append(b)
        prev, state = b, options[b]
    return bytes(out)


def _whole_characters(text: bytes) -> str:
    """The text cut before an unfinished UTF-8 character ('' where it starts inside one)."""
    for cut in range(len(text), max(len(text) - 4, -1), -1):
        try:
            return text[:cut].decode("utf-8")
        except UnicodeDecodeError:
            continue
    return ""
