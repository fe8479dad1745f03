"""Text <-> token ids for a model, with its chat template.

Stand-in on the `bench` branch for the interface the `gguf` branch defines (HF folders only);
at merge the `gguf` branch's module replaces this file.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from tokenizers import Tokenizer


class TextTokenizer:
    """`encode`/`decode` plain text; `chat` renders messages in the model's chat template."""

    def __init__(self, tokenizer: Tokenizer, chat_template: str | None, special: dict[str, str],
                 eos_token_ids: tuple[int, ...]):
        self.tokenizer, self.chat_template, self.special = tokenizer, chat_template, special
        self.eos_token_ids = eos_token_ids

    def encode(self, text: str) -> list[int]:
        return self.tokenizer.encode(text).ids

    def decode(self, ids) -> str:
        return self.tokenizer.decode(list(ids))

    def chat(self, messages: list[dict], add_generation_prompt: bool = True) -> list[int]:
        """Token ids of `messages` ([{"role", "content"}]) rendered in the chat template."""
        if self.chat_template is None:
            raise ValueError("this tokenizer has no chat template")
        from jinja2.sandbox import ImmutableSandboxedEnvironment
        text = ImmutableSandboxedEnvironment().from_string(self.chat_template).render(
            messages=messages, add_generation_prompt=add_generation_prompt, **self.special)
        return self.tokenizer.encode(text, add_special_tokens=False).ids


def load_tokenizer(path_or_name: str | os.PathLike) -> TextTokenizer:
    """The tokenizer of an HF folder or a shipped model: tokenizer.json, and the chat template
    from chat_template.jinja or tokenizer_config.json."""
    from specjax.convert import resolve
    folder = resolve(path_or_name)
    if not (folder / "tokenizer.json").exists():
        raise FileNotFoundError(f"{folder} has no tokenizer.json")
    tok = Tokenizer.from_file(str(folder / "tokenizer.json"))
    cfg = _read_json(folder / "tokenizer_config.json")
    template = cfg.get("chat_template")
    if (folder / "chat_template.jinja").exists():
        template = (folder / "chat_template.jinja").read_text()
    special = {k: cfg[k] for k in ("bos_token", "eos_token") if isinstance(cfg.get(k), str)}
    eos = _read_json(folder / "generation_config.json").get("eos_token_id")
    if eos is None and "eos_token" in special:
        eos = tok.token_to_id(special["eos_token"])
    eos_ids = () if eos is None else tuple(eos) if isinstance(eos, list) else (eos,)
    return TextTokenizer(tok, template, special, eos_ids)


def _read_json(path: Path) -> dict:
    return json.loads(path.read_text()) if path.exists() else {}
