"""Token id -> the bytes it stands for, and the outlines-core Vocabulary built from them.

A constraint is a regular language over bytes; the automaton over tokens needs each token's
bytes. Byte-level BPE (GPT-2, SmolLM2, Llama 3, Qwen) writes byte b as the printable character
`bytes_to_unicode()[b]`; SentencePiece-style vocabularies write a space as "▁" and raw bytes as
"<0xNN>". Special tokens (chat markers, EOS) stand for no text and are left out.
"""

from __future__ import annotations

import functools
import json

from tokenizers import Tokenizer


@functools.cache
def _byte_decoder() -> dict[str, int]:
    """The inverse of GPT-2's bytes_to_unicode: printable stand-in character -> byte."""
    printable = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) \
        + list(range(ord("®"), ord("ÿ") + 1))
    chars, extra = {}, 0
    for b in range(256):
        if b in printable:
            chars[chr(b)] = b
        else:
            chars[chr(256 + extra)] = b
            extra += 1
    return chars


def _byte_level(token: str) -> bytes | None:
    decoder = _byte_decoder()
    if any(c not in decoder for c in token):
        return None
    return bytes(decoder[c] for c in token)


def _sentencepiece(token: str) -> bytes:
    if len(token) == 6 and token.startswith("<0x") and token.endswith(">"):
        return bytes([int(token[3:5], 16)])
    return token.replace("▁", " ").encode()


def token_bytes(tokenizer: Tokenizer) -> dict[int, bytes]:
    """{id: bytes} for every non-special token of a `tokenizers.Tokenizer`."""
    spec = json.loads(tokenizer.to_str())
    special = {t["id"] for t in spec.get("added_tokens", []) if t.get("special")}
    byte_level = "ByteLevel" in json.dumps(spec.get("decoder"))
    out = {}
    for token, i in tokenizer.get_vocab(with_added_tokens=True).items():
        if i in special:
            continue
        raw = _byte_level(token) if byte_level else _sentencepiece(token)
        if raw:  # a byte-level token outside the byte alphabet (an added word) is its text
            out[i] = raw
        elif raw is None:
            out[i] = token.encode()
    return out


def outlines_vocabulary(raw: dict[int, bytes], eos_token_id: int):
    """The outlines-core Vocabulary of a tokenizer's {id: bytes} (`token_bytes`): bytes -> ids,
    EOS apart."""
    from outlines_core import Vocabulary

    grouped: dict[bytes, list[int]] = {}
    for i, text in raw.items():
        if i != eos_token_id:
            grouped.setdefault(text, []).append(i)
    return Vocabulary(eos_token_id, grouped)
