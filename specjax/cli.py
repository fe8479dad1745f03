"""What every command line shares (`python -m specjax`, `python -m specjax.train`, the benches):
the user-input error, a parser whose errors are that error, option types checked at parse time,
and the boundary that turns them into one line on stderr.

The split is by exception type: `UsageError` (bad input, raised by the parser and by the
commands' own input checks) and `OSError` (a path the system refuses: too long, not a folder,
no permission, a full disk; its message names the path) are one line and exit status 2;
Ctrl-C is one line and 130; any other exception is a bug and keeps its traceback.
"""

from __future__ import annotations

import argparse
import math
import sys
from typing import Callable

USAGE_STATUS, INTERRUPTED_STATUS = 2, 130
SEED_RANGE = (0, 2**63 - 1)  # what jax.random.key takes


class UsageError(Exception):
    """Bad input (an option, a file, a config value): one line on stderr, exit status 2."""


class _Formatter(argparse.ArgumentDefaultsHelpFormatter):
    """Shows each option's default, except None and False (the help text says what they mean)."""

    def _get_help_string(self, action):
        if action.default is None or action.default is False:
            return action.help
        return super()._get_help_string(action)


class ArgumentParser(argparse.ArgumentParser):
    """argparse's parser with defaults in --help and errors raised as UsageError (one line, not
    argparse's usage block and exit)."""

    def __init__(self, *args, **kwargs):
        kwargs.setdefault("formatter_class", _Formatter)
        super().__init__(*args, **kwargs)

    def error(self, message):
        raise UsageError(f"{message} (see {self.prog} --help)")


def integer(low: int | None = None, high: int | None = None) -> Callable[[str], int]:
    """An option type: an integer in [low, high] (None: unbounded); `.bounds` is (low, high)."""
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected an integer{_range(low, high)}, got {text!r}") from None
        if (low is not None and value < low) or (high is not None and value > high):
            raise argparse.ArgumentTypeError(f"must be an integer{_range(low, high)}, got {text}")
        return value
    parse.__name__, parse.bounds = "integer", (low, high)
    return parse


def number(low: float | None = None, high: float | None = None, *, low_open: bool = False) -> Callable[[str], float]:
    """An option type: a finite number in [low, high] ((low, high] with low_open); `.bounds` is
    (low, high)."""
    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected a number{_range(low, high, low_open)}, got {text!r}") from None
        if not math.isfinite(value) or (low is not None and (value <= low if low_open else value < low)) \
                or (high is not None and value > high):
            raise argparse.ArgumentTypeError(f"must be a finite number{_range(low, high, low_open)}, got {text}")
        return value
    parse.__name__, parse.bounds = "number", (low, high)
    return parse


def _range(low, high, low_open: bool = False) -> str:
    if low is not None and high is not None:
        return f" in {'(' if low_open else '['}{low}, {high}]"
    if low is not None:
        return f" {'>' if low_open else '>='} {low}"
    return "" if high is None else f" <= {high}"


def text(*, empty: bool = False) -> Callable[[str], str]:
    """An option type: UTF-8 text (argv bytes that are not UTF-8 arrive as surrogate escapes),
    non-empty unless `empty`."""
    def parse(value: str) -> str:
        try:
            value.encode("utf-8")
        except UnicodeEncodeError as e:
            raise argparse.ArgumentTypeError(f"not valid UTF-8 (byte 0x{ord(e.object[e.start]) & 0xFF:02x} "
                                             f"at character {e.start})") from None
        if not empty and not value:
            raise argparse.ArgumentTypeError("empty; give it some text")
        return value
    parse.__name__ = "text"
    return parse


def int8_activations(model, name: str):
    """`model` (loaded from `name`) with --int8-activations applied: its quantized matmuls take
    int8 activations (`sj.quantize_activations`); a float model is a UsageError."""
    from specjax.quantize import is_quantized, quantize_activations

    if not is_quantized(model):
        raise UsageError(f"--int8-activations: {name} has float matmul weights (it is for quantized models: "
                         f"a Q8_0 / Q4_0 GGUF or a checkpoint saved from sj.quantize)")
    return quantize_activations(model)


def run(command: Callable[..., int | None], *args) -> int:
    """Run a command's handler inside the error boundary: its exit status (None: 0); a
    UsageError or OSError -> 'error: ...' on stderr and 2; Ctrl-C -> 'interrupted' and 130 (a handler
    that has more to say about what it had done catches KeyboardInterrupt itself)."""
    try:
        return command(*args) or 0
    except (UsageError, OSError) as e:
        print(f"error: {_one_line(e)}", file=sys.stderr)
        return USAGE_STATUS
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return INTERRUPTED_STATUS


def _one_line(e: Exception) -> str:
    return " ".join(str(e).split()) or type(e).__name__
