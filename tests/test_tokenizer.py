"""The code tokenizer: training, exact round-trip, transformers loading, the shipped one."""

from pathlib import Path

import pytest

from specjax.data.corpus import list_files, read_text, stdlib_root
from specjax.train.bpe import (
    EOT,
    PAD,
    load_bpe,
    save_tokenizer,
    train_tokenizer,
)

ASSETS = Path(__file__).resolve().parents[1] / "specjax" / "assets" / "tiny"
TEXT = ["def add(a, b):\n    return a + b\n", "class Foo:\n\tx = 'é'  # naïve\n\n\n", "  x=1\r\n"] * 20


def test_trained_tokenizer_roundtrips_and_loads_in_transformers(tmp_path):
    tok = train_tokenizer(TEXT, vocab_size=300)
    assert tok.token_to_id(EOT) == 0 and tok.token_to_id(PAD) == 1
    assert 258 < tok.get_vocab_size() <= 300
    unseen = "def   π(x):\n\t return  x ** 2  # 漢字 \U0001f600\n\n  \r\n"
    assert tok.decode(tok.encode(unseen).ids) == unseen
    save_tokenizer(tok, tmp_path)
    from transformers import AutoTokenizer

    hf = AutoTokenizer.from_pretrained(tmp_path)
    assert hf.eos_token_id == hf.bos_token_id == 0
    assert hf.encode(unseen) == tok.encode(unseen).ids
    assert hf.decode(hf.encode(unseen)) == unseen


def test_missing_tokenizer_is_a_clear_error(tmp_path):
    with pytest.raises(FileNotFoundError, match="tokenizer not found"):
        load_bpe(tmp_path)


@pytest.mark.skipif(not (ASSETS / "tokenizer.json").is_file(),
                    reason="shipped tokenizer absent (build it with recipes/make_tiny.sh)")
def test_shipped_tokenizer_roundtrips_held_out_code():
    tok = load_bpe(ASSETS)
    assert tok.get_vocab_size() == 4096 and tok.token_to_id(EOT) == 0
    _, held_out = list_files(stdlib_root())
    for path in held_out:
        text = read_text(path)
        assert tok.decode(tok.encode(text).ids) == text, path
