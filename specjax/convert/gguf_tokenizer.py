"""A GGUF's `tokenizer.ggml.*` metadata -> a `tokenizers.Tokenizer` and its HF tokenizer config.

`gpt2` vocabularies (byte-level BPE with merges) are supported, with the pre-tokenizer split that
`tokenizer.ggml.pre` names; control tokens become special added tokens, user-defined ones plain
added tokens, as llama.cpp matches both whole.
"""

from __future__ import annotations

from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, pre_tokenizers, processors

from specjax.convert.gguf import metadata

CONTROL, USER_DEFINED = 3, 4  # llama.cpp token types

# The splits llama.cpp's pre-tokenizer types apply before byte-level BPE (None: GPT-2's own).
_LLAMA3 = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
           r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
_QWEN2 = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"
          r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
PRE_TOKENIZERS = {"default": None, "gpt-2": None, "smollm": "digits", "llama-bpe": _LLAMA3,
                  "llama3": _LLAMA3, "qwen2": _QWEN2}


def gguf_tokenizer(reader) -> tuple[Tokenizer, dict]:
    """(tokenizer, tokenizer_config) from an open GGUFReader; the config holds `chat_template`,
    `bos_token`, `eos_token` and `add_bos_token` as an HF tokenizer_config.json does."""
    kind = metadata(reader, "tokenizer.ggml.model")
    if kind != "gpt2":
        raise ValueError(f"unsupported GGUF tokenizer model {kind!r}; supported: gpt2 (byte-level BPE)")
    pre = metadata(reader, "tokenizer.ggml.pre", "default")
    if pre not in PRE_TOKENIZERS:
        raise ValueError(f"unsupported GGUF pre-tokenizer {pre!r}; supported: {', '.join(PRE_TOKENIZERS)}")
    tokens = metadata(reader, "tokenizer.ggml.tokens")
    merges = [tuple(m.split(" ", 1)) for m in metadata(reader, "tokenizer.ggml.merges", [])]
    types = metadata(reader, "tokenizer.ggml.token_type") or [1] * len(tokens)
    tok = Tokenizer(models.BPE({t: i for i, t in enumerate(tokens)}, merges, fuse_unk=False))
    byte_level = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=PRE_TOKENIZERS[pre] in (None, "digits"))
    if PRE_TOKENIZERS[pre] == "digits":
        tok.pre_tokenizer = pre_tokenizers.Sequence([pre_tokenizers.Digits(individual_digits=True), byte_level])
    elif PRE_TOKENIZERS[pre] is None:
        tok.pre_tokenizer = byte_level
    else:
        tok.pre_tokenizer = pre_tokenizers.Sequence(
            [pre_tokenizers.Split(Regex(PRE_TOKENIZERS[pre]), behavior="isolated"), byte_level])
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False)
                            for t, k in zip(tokens, types) if k == CONTROL])
    tok.add_tokens([AddedToken(t, special=False, normalized=False)
                    for t, k in zip(tokens, types) if k == USER_DEFINED])

    def token(key):
        i = metadata(reader, f"tokenizer.ggml.{key}_token_id")
        return None if i is None else tokens[i]

    bos, add_bos = token("bos"), bool(metadata(reader, "tokenizer.ggml.add_bos_token", False))
    if add_bos and bos is not None:
        tok.post_processor = processors.TemplateProcessing(
            single=f"{bos} $A", pair=f"{bos} $A {bos} $B",
            special_tokens=[(bos, metadata(reader, "tokenizer.ggml.bos_token_id"))])
    config = {"tokenizer_class": "PreTrainedTokenizerFast", "bos_token": bos, "eos_token": token("eos"),
              "unk_token": token("unknown"), "pad_token": token("padding"), "add_bos_token": add_bos,
              "chat_template": metadata(reader, "tokenizer.chat_template")}
    return tok, {k: v for k, v in config.items() if v is not None}
