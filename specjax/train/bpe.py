"""A byte-level BPE tokenizer for code, trained with HF `tokenizers`, saved so that
`transformers.AutoTokenizer.from_pretrained(folder)` loads it.

`python -m specjax.train tokenizer --out DIR [--vocab-size 4096] [--corpus stdlib]`
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from pathlib import Path

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

from specjax.data.corpus import HELD_OUT, list_files, read_text, resolve_root

EOT = "<|endoftext|>"  # BOS, EOS and document separator; id 0
PAD = "<|pad|>"  # id 1
SPECIAL_TOKENS = (EOT, PAD)


def train_tokenizer(texts: Iterable[str], vocab_size: int = 4096) -> Tokenizer:
    """Byte-level BPE (no prefix space, so decode(encode(x)) == x for any text)."""
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size, special_tokens=list(SPECIAL_TOKENS), show_progress=False,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(texts, trainer=trainer)
    return tok


def save_tokenizer(tok: Tokenizer, out_dir: str | Path) -> None:
    """Write tokenizer.json and tokenizer_config.json (PreTrainedTokenizerFast)."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    tok.save(str(out / "tokenizer.json"))
    config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": EOT, "eos_token": EOT, "unk_token": EOT, "pad_token": PAD,
        "add_bos_token": False, "add_eos_token": False, "clean_up_tokenization_spaces": False,
        "model_max_length": 2048,
    }
    (out / "tokenizer_config.json").write_text(json.dumps(config, indent=2) + "\n")


def load_bpe(folder: str | Path) -> Tokenizer:
    """The tokenizer saved in `folder` (a clear error when it is missing)."""
    path = Path(folder) / "tokenizer.json"
    if not path.is_file():
        raise FileNotFoundError(
            f"tokenizer not found: {path} (build it with `python -m specjax.train tokenizer --out {folder}`)")
    return Tokenizer.from_file(str(path))


def build_tokenizer(out_dir: str | Path, corpus: str = "stdlib", held_out=None,
                    vocab_size: int = 4096) -> Tokenizer:
    """Train on the corpus's training files (held-out modules left out) and save to `out_dir`."""
    train_files, _ = list_files(resolve_root(corpus), HELD_OUT if held_out is None else held_out)
    tok = train_tokenizer((read_text(f) for f in train_files), vocab_size)
    save_tokenizer(tok, out_dir)
    return tok
