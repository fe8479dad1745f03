"""A GGUF's `tokenizer.ggml.*` metadata -> a `tokenizers.Tokenizer` and its HF tokenizer config,
built as transformers' GGUF loader builds it, so the ids match
`AutoTokenizer.from_pretrained(folder, gguf_file=...)`.

Two vocabularies are supported:
- `gpt2`: byte-level BPE with merges, split first as `tokenizer.ggml.pre` names;
- `llama` in Gemma files: SentencePiece BPE with byte fallback (`<0xXX>` tokens) and ▁ for
  spaces. The file lists no merges: they are rebuilt from the vocabulary (`implied_merges`).
Control tokens become special added tokens, user-defined ones plain added tokens, as llama.cpp
matches both whole.
"""

from __future__ import annotations

from tokenizers import (AddedToken, Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers,
                        processors)

from specjax.convert.gguf import metadata

CONTROL, USER_DEFINED = 3, 4  # llama.cpp token types
SENTENCEPIECE_ARCHITECTURES = ("gemma", "gemma2", "gemma3")

# The splits llama.cpp's pre-tokenizer types apply before byte-level BPE (None: GPT-2's own).
_LLAMA3 = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
           r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
_QWEN2 = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"
          r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
PRE_TOKENIZERS = {"default": None, "gpt-2": None, "smollm": "digits", "llama-bpe": _LLAMA3,
                  "llama3": _LLAMA3, "qwen2": _QWEN2}


def gguf_tokenizer(reader) -> tuple[Tokenizer, dict]:
    """(tokenizer, tokenizer_config) from a GGUF file (`read_gguf`); the config holds `chat_template`,
    `bos_token`, `eos_token` and `add_bos_token` as an HF tokenizer_config.json does."""
    kind, arch = metadata(reader, "tokenizer.ggml.model"), metadata(reader, "general.architecture")
    tokens = metadata(reader, "tokenizer.ggml.tokens")

    def token(key):
        i = metadata(reader, f"tokenizer.ggml.{key}_token_id")
        return None if i is None else tokens[i]

    if kind == "gpt2":
        tok, spelled = byte_level_bpe(tokens, metadata(reader, "tokenizer.ggml.merges", []),
                                      metadata(reader, "tokenizer.ggml.pre", "default")), tokens
    elif kind == "llama" and arch in SENTENCEPIECE_ARCHITECTURES:
        spelled = gemma_spelling(tokens)
        tok = sentencepiece_bpe(spelled, token("unknown"))
    else:
        raise ValueError(f"unsupported GGUF tokenizer model {kind!r} (architecture {arch!r}); supported: "
                         f"gpt2 (byte-level BPE), llama (SentencePiece) in {', '.join(SENTENCEPIECE_ARCHITECTURES)}")
    types = metadata(reader, "tokenizer.ggml.token_type") or [1] * len(tokens)
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False)
                            for t, k in zip(tokens, types) if k == CONTROL])
    vocab = set(spelled)  # Gemma's whitespace runs, respelled, are left to the BPE
    tok.add_tokens([AddedToken(t, special=False, normalized=False)
                    for t, k in zip(tokens, types) if k == USER_DEFINED and t in vocab])
    # llama.cpp adds BOS to a SentencePiece vocabulary unless the file says otherwise
    bos, add_bos = token("bos"), bool(metadata(reader, "tokenizer.ggml.add_bos_token", kind == "llama"))
    if add_bos and bos is not None:
        tok.post_processor = processors.TemplateProcessing(
            single=f"{bos} $A", pair=f"{bos} $A {bos} $B",
            special_tokens=[(bos, metadata(reader, "tokenizer.ggml.bos_token_id"))])
    config = {"tokenizer_class": "PreTrainedTokenizerFast", "bos_token": bos, "eos_token": token("eos"),
              "unk_token": token("unknown"), "pad_token": token("padding"), "add_bos_token": add_bos,
              "chat_template": metadata(reader, "tokenizer.chat_template")}
    return tok, {k: v for k, v in config.items() if v is not None}


def byte_level_bpe(tokens: list[str], merges: list[str], pre: str) -> Tokenizer:
    """GPT-2-style byte-level BPE over the file's vocabulary and merges ("a b" strings)."""
    if pre not in PRE_TOKENIZERS:
        raise ValueError(f"unsupported GGUF pre-tokenizer {pre!r}; supported: {', '.join(PRE_TOKENIZERS)}")
    tok = Tokenizer(models.BPE({t: i for i, t in enumerate(tokens)}, [tuple(m.split(" ", 1)) for m in merges],
                               fuse_unk=False))
    byte_level = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=PRE_TOKENIZERS[pre] in (None, "digits"))
    if PRE_TOKENIZERS[pre] == "digits":
        tok.pre_tokenizer = pre_tokenizers.Sequence([pre_tokenizers.Digits(individual_digits=True), byte_level])
    elif PRE_TOKENIZERS[pre] is None:
        tok.pre_tokenizer = byte_level
    else:
        tok.pre_tokenizer = pre_tokenizers.Sequence(
            [pre_tokenizers.Split(Regex(PRE_TOKENIZERS[pre]), behavior="isolated"), byte_level])
    tok.decoder = decoders.ByteLevel()
    return tok


def gemma_spelling(tokens: list[str]) -> list[str]:
    """Gemma files store runs of spaces as real spaces ("  "); the BPE sees them as "▁▁"."""
    return ["▁" * len(t) if " " in t and not t.strip() else t for t in tokens]


def sentencepiece_bpe(tokens: list[str], unk: str | None) -> Tokenizer:
    """SentencePiece BPE: spaces as ▁ (no prefix space), byte fallback to `<0xXX>` tokens."""
    vocab = {t: i for i, t in enumerate(tokens)}
    tok = Tokenizer(models.BPE(vocab, implied_merges(vocab), unk_token=unk, fuse_unk=True, byte_fallback=True))
    tok.normalizer = normalizers.Replace(" ", "▁")
    tok.decoder = decoders.Sequence([decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse()])
    return tok


def implied_merges(vocab: dict[str, int]) -> list[tuple[str, str]]:
    """The merges a vocabulary without them implies: every split of a token into two tokens,
    ranked by the token's id (Gemma's ids follow its merge order; its scores do not), then longer
    left part first, as transformers' GGUF loader ranks them."""
    return [(t[:i], t[i:]) for t in sorted(vocab, key=vocab.get)
            for i in range(len(t) - 1, 0, -1) if t[:i] in vocab and t[i:] in vocab]
