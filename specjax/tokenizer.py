"""TextTokenizer: text <-> ids for a model, and `chat`, the small helper that turns messages into
ids with the model's chat template. `sj.generate` stays token-level; this sits in front of it."""

from __future__ import annotations

import dataclasses
import json
import os
from datetime import datetime
from pathlib import Path

from tokenizers import Tokenizer


@dataclasses.dataclass(frozen=True)
class TextTokenizer:
    """A `tokenizers.Tokenizer` with the model's chat template and special ids."""

    tokenizer: Tokenizer
    chat_template: str | None = None
    bos_token_id: int | None = None
    eos_token_ids: tuple[int, ...] = ()

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        """Text -> ids (with the tokenizer's BOS when it adds one, as transformers' `encode`)."""
        return self.tokenizer.encode(text, add_special_tokens=add_special_tokens).ids

    def decode(self, ids, skip_special_tokens: bool = False) -> str:
        return self.tokenizer.decode([int(i) for i in ids], skip_special_tokens=skip_special_tokens)

    def render(self, messages: list[dict], add_generation_prompt: bool = True, **kwargs) -> str:
        """The chat template rendered as transformers' `apply_chat_template(tokenize=False)` does."""
        if self.chat_template is None:
            raise ValueError("this tokenizer has no chat template")
        from jinja2.ext import loopcontrols
        from jinja2.sandbox import ImmutableSandboxedEnvironment

        def raise_exception(message):
            raise ValueError(f"chat template: {message}")

        env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[loopcontrols])
        env.filters["tojson"] = lambda x, indent=None, ensure_ascii=False: json.dumps(
            x, indent=indent, ensure_ascii=ensure_ascii)
        env.globals.update(raise_exception=raise_exception,
                           strftime_now=lambda fmt: datetime.now().strftime(fmt))
        special = {"bos_token": self._token(self.bos_token_id),
                   "eos_token": self._token(self.eos_token_ids[0] if self.eos_token_ids else None)}
        return env.from_string(self.chat_template).render(
            messages=messages, add_generation_prompt=add_generation_prompt, **special, **kwargs)

    def chat(self, messages: list[dict], add_generation_prompt: bool = True, **kwargs) -> list[int]:
        """Messages ([{"role", "content"}, ...]) -> prompt ids, through the chat template."""
        return self.encode(self.render(messages, add_generation_prompt, **kwargs), add_special_tokens=False)

    def _token(self, i):
        return None if i is None else self.tokenizer.id_to_token(i)


def load_tokenizer(path: str | os.PathLike) -> TextTokenizer:
    """The tokenizer of an HF folder (tokenizer.json, tokenizer_config.json, generation_config),
    a .gguf file, a folder holding one, or a named model ('tiny', 'smollm2')."""
    from specjax.convert import resolve
    from specjax.convert.gguf_cache import gguf_tokenizer_folder

    found = resolve(path)
    return from_folder(gguf_tokenizer_folder(found) if found.suffix == ".gguf" else found)


def from_folder(folder: Path) -> TextTokenizer:
    """Read an HF tokenizer folder; EOS ids from generation_config.json when it lists them."""
    if not (folder / "tokenizer.json").is_file():
        raise FileNotFoundError(f"{folder}: no tokenizer.json")
    tok = Tokenizer.from_file(str(folder / "tokenizer.json"))
    config = _json(folder / "tokenizer_config.json")
    template = config.get("chat_template")
    if (folder / "chat_template.jinja").is_file():
        template = (folder / "chat_template.jinja").read_text()
    if isinstance(template, list):  # named templates: transformers uses "default"
        template = {t["name"]: t["template"] for t in template}.get("default")

    def token_id(key):
        value = config.get(key)
        value = value.get("content") if isinstance(value, dict) else value
        return None if value is None else tok.token_to_id(value)

    eos = _json(folder / "generation_config.json").get("eos_token_id", token_id("eos_token"))
    eos = [eos] if isinstance(eos, int) else list(eos or [])
    return TextTokenizer(tok, template, token_id("bos_token"), tuple(eos))


def _json(path: Path) -> dict:
    return json.loads(path.read_text()) if path.is_file() else {}
