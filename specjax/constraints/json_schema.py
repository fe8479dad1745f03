"""JSON Schema -> regular expression, through outlines-core, with the checks it leaves out.

outlines-core's `build_regex_from_schema` ignores some keywords silently (numeric bounds,
multipleOf, uniqueItems, ...), which would let invalid output through. Here every keyword is
either supported or refused with `UnsupportedSchema`. Numeric bounds are supported by building
their regex here: integers in any range, numbers with integer bounds >= 0.
"""

from __future__ import annotations

import json
import math

from specjax.json_text import json_object

# keywords outlines-core accepts but does not enforce: refused rather than silently dropped
_IGNORED = ("multipleOf", "uniqueItems", "patternProperties", "minProperties", "maxProperties",
            "dependentRequired", "dependentSchemas", "contains", "minContains", "maxContains",
            "propertyNames", "unevaluatedProperties", "unevaluatedItems", "not", "if", "then", "else")
_BOUNDS = ("minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum")
_FRACTION = r"(\.[0-9]+)?"


class UnsupportedSchema(ValueError):
    """A schema (or regex) the constraint compiler cannot enforce; the message names the feature."""


def schema_regex(schema: dict | str, whitespace: str | None = None) -> str:
    """The regular expression of a JSON schema (a dict or JSON text)."""
    from outlines_core.json_schema import build_regex_from_schema

    schema = json_object(schema, "the schema", UnsupportedSchema)
    ranges: dict[str, str] = {}
    rewritten = _rewrite(schema, "", ranges)
    try:
        regex = build_regex_from_schema(json.dumps(rewritten), whitespace)
    except (ValueError, TypeError) as e:
        raise UnsupportedSchema(str(e).splitlines()[0]) from None
    for name, pattern in ranges.items():
        regex = regex.replace(f'"{name}"', f"({pattern})")
    return regex


def _rewrite(node, where: str, ranges: dict[str, str]):
    """The schema with bounded numbers replaced by placeholders (their regex in `ranges`);
    raises on keywords that would be ignored."""
    if isinstance(node, list):
        return [_rewrite(x, f"{where}/{i}", ranges) for i, x in enumerate(node)]
    if not isinstance(node, dict):
        return node
    for key in _IGNORED:
        if key in node:
            raise UnsupportedSchema(f"unsupported JSON Schema feature {key!r} at {where or '/'}")
    if any(k in node for k in _BOUNDS):
        name = f"specjaxbounded{len(ranges)}"
        ranges[name] = _bounded_number(node, where or "/")
        return {"const": name}
    out = {}
    for key, value in node.items():
        nested = key in ("properties", "$defs", "definitions") and isinstance(value, dict)
        out[key] = ({k: _rewrite(v, f"{where}/{key}/{k}", ranges) for k, v in value.items()} if nested
                    else _rewrite(value, f"{where}/{key}", ranges)
                    if key in ("items", "prefixItems", "additionalProperties", "anyOf", "oneOf", "allOf")
                    else value)
    return out


def _bounded_number(node: dict, where: str) -> str:
    kind = node.get("type")
    lo, hi = node.get("minimum"), node.get("maximum")
    if kind == "integer":
        if "exclusiveMinimum" in node:
            lo = max(lo if lo is not None else -math.inf, math.floor(node["exclusiveMinimum"]) + 1)
        if "exclusiveMaximum" in node:
            hi = min(hi if hi is not None else math.inf, math.ceil(node["exclusiveMaximum"]) - 1)
        lo = None if lo is None else math.ceil(lo)
        hi = None if hi is None else math.floor(hi)
        if lo is not None and hi is not None and lo > hi:
            raise UnsupportedSchema(f"empty integer range [{lo}, {hi}] at {where}")
        return int_range(lo, hi)
    if kind == "number":
        exclusive = [k for k in ("exclusiveMinimum", "exclusiveMaximum") if k in node]
        if exclusive or lo is None or lo < 0 or lo != int(lo) or (hi is not None and hi != int(hi)):
            raise UnsupportedSchema(f"unsupported JSON Schema feature: number bounds other than "
                                    f"integer minimum >= 0 and maximum at {where}")
        lo, hi = int(lo), None if hi is None else int(hi)
        if hi is None:
            return f"({int_range(lo, None)}){_FRACTION}"
        if lo > hi:
            raise UnsupportedSchema(f"empty number range [{lo}, {hi}] at {where}")
        top = rf"{hi}(\.0+)?"
        return top if lo == hi else f"({int_range(lo, hi - 1)}){_FRACTION}|{top}"
    raise UnsupportedSchema(f"unsupported JSON Schema feature: bounds on type {kind!r} at {where}")


def int_range(lo: int | None, hi: int | None) -> str:
    """Regex of the decimal integers in [lo, hi] (None: unbounded), JSON style (no leading zeros)."""
    parts = []
    if lo is None or lo < 0:  # -x for x from the smallest magnitude allowed to -lo
        nearest = 1 if hi is None or hi >= 0 else -hi
        parts += ["-" + p for p in _natural(nearest, None if lo is None else -lo)]
    if hi is None or hi >= 0:
        parts += _natural(max(lo if lo is not None else 0, 0), hi)
    return "|".join(parts)


def _natural(a: int, b: int | None) -> list[str]:
    """Regex alternatives for the integers in [a, b], 0 <= a (b None: unbounded)."""
    if b is not None and a > b:
        return []
    top = b if b is not None else 10 ** len(str(a)) - 1
    out = []
    for length in range(len(str(a)), len(str(top)) + 1):
        lo = max(a, 10 ** (length - 1) if length > 1 else 0)
        hi = min(top, 10 ** length - 1)
        if lo <= hi:
            out += _same_length(str(lo), str(hi))
    if b is None:
        out.append(f"[1-9][0-9]{{{len(str(a))},}}")
    return out


def _same_length(x: str, y: str) -> list[str]:
    """Alternatives for the digit strings from x to y (same length, x <= y)."""
    if x == y:
        return [x]
    if len(x) == 1:
        return [f"[{x}-{y}]"]
    if x[0] == y[0]:
        return [x[0] + p for p in _same_length(x[1:], y[1:])]
    rest = len(x) - 1
    out = [x[0] + p for p in _same_length(x[1:], "9" * rest)]
    if int(x[0]) + 1 <= int(y[0]) - 1:
        out.append(f"[{int(x[0]) + 1}-{int(y[0]) - 1}][0-9]{{{rest}}}")
    out += [y[0] + p for p in _same_length("0" * rest, y[1:])]
    return out
