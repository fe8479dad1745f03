"""Chat rendering: a prompt row (`specjax.data.prompts`) as messages, as raw text, or as token ids
through the model's tokenizer, so that benchmark and training prompts reach the model alike."""

from __future__ import annotations


def chat_messages(row: dict) -> list[dict]:
    """The row's user turns with its fixed replies between them, as chat messages."""
    msgs = []
    for i, turn in enumerate(row["turns"]):
        if i:
            msgs.append({"role": "assistant", "content": row["replies"][i - 1]})
        msgs.append({"role": "user", "content": turn})
    return msgs


def raw_text(row: dict) -> str:
    """The row as plain text, for a model with no chat template: `prompt`, else the turns and
    replies joined by blank lines."""
    if row.get("prompt"):
        return row["prompt"]
    return "\n\n".join(m["content"] for m in chat_messages(row))


def prompt_ids(tokenizer, row: dict) -> list[int]:
    """A row's token ids: its turns through the chat template when the tokenizer has one, the
    raw text otherwise."""
    if tokenizer.chat_template is not None and row["turns"]:
        return list(tokenizer.chat(chat_messages(row)))
    return list(tokenizer.encode(raw_text(row)))
