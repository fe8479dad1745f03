"""JSON that a user hands in (a schema, a row of a prompt file) read as one object, or one line
that says where and what is wrong."""

from __future__ import annotations

import json


def json_object(value, where: str, error: type[ValueError] = ValueError, kinds: tuple[type, ...] = (dict,)):
    """`value` (parsed first when it is JSON text) if it is one of `kinds` (a JSON object);
    otherwise `error`, its message starting with `where`."""
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except json.JSONDecodeError as e:
            at = f"column {e.colno}" if e.lineno == 1 else f"line {e.lineno} column {e.colno}"
            raise error(f"{where}: not JSON ({e.msg} at {at})") from None
    if not isinstance(value, kinds):
        raise error(f"{where}: a JSON object is needed, got {type(value).__name__}")
    return value
