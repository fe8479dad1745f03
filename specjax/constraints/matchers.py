"""The host side of a grammar constraint: llguidance matchers, one per row, and the two things
the decode loop asks of them each step (through a host callback, `grammar.Grammar`):

- `tree_masks`: the allowed-token bitmask after every node of each row's draft tree (the tree
  walked depth-first with the matcher's rollback; a node whose token its parent forbids is
  dead, and so is everything below it);
- `forced`: the tokens the grammar fixes from each row's place (llguidance's fast-forward).

Both are pure functions of their inputs: a row's place is given as the tokens it has consumed
since the start, and each row's matcher is only a memo of it (advanced when the tokens extend
what it has seen, rebuilt when they do not), so a replayed or re-run step gives the same answer.
Grammars are compiled once here (`compile_grammar`), under llguidance's limits on time and size:
a grammar that would exceed them is refused with its message, never run.
"""

from __future__ import annotations

import itertools
import threading
import weakref

import numpy as np

from specjax.constraints.json_schema import UnsupportedSchema

_HANDLES = itertools.count(1)
_LIVE: weakref.WeakValueDictionary[int, "Matchers"] = weakref.WeakValueDictionary()
_TOKENIZERS: dict[tuple, object] = {}


def ll_tokenizer(tokenizer, eos: tuple[int, ...], vocab_size: int):
    """llguidance's tokenizer for a `tokenizers.Tokenizer` with a vocabulary of `vocab_size`
    (the model's: ids past the tokenizer's are never allowed), cached (building one takes ~1 s)."""
    import llguidance

    text = tokenizer.to_str()
    key = (hash(text), eos, vocab_size)
    if key not in _TOKENIZERS:
        _TOKENIZERS[key] = llguidance.LLTokenizer(text, n_vocab=vocab_size, eos_token=list(eos))
    return _TOKENIZERS[key]


def compile_grammar(grammar: str, tokenizer, what: str):
    """A matcher at the start of `grammar` (llguidance's JSON grammar format), or
    UnsupportedSchema naming what in `what` (e.g. "the JSON schema") cannot be enforced or which
    limit it exceeds."""
    import llguidance

    matcher = llguidance.LLMatcher(tokenizer, grammar, log_level=0)
    if matcher.is_error():
        raise UnsupportedSchema(f"cannot compile {what}: {_one_line(matcher.get_error())}")
    return matcher


class Matchers:
    """Every row's grammar (a list; None or a row past its end: unconstrained) and each row's
    matcher memo. Registered under `handle`, the integer the device side carries."""

    def __init__(self, grammars: list, vocab_size: int, eos: tuple[int, ...], every_row: bool = False):
        self.grammars = grammars  # per row: a matcher at the grammar's start (copied), or None
        self.every_row = every_row  # grammars[0] serves every row
        self.vocab_size = vocab_size
        self.eos = frozenset(eos)
        self.words = -(-vocab_size // 32)
        self.handle = next(_HANDLES)
        self._memo: dict[int, tuple[object, list[int]]] = {}
        self._lock = threading.Lock()
        _LIVE[self.handle] = self

    def _grammar(self, row: int) -> int | None:
        """The index in `grammars` of row `row`'s grammar (None: a row past the list)."""
        return 0 if self.every_row else row if row < len(self.grammars) else None

    def matcher(self, row: int, consumed: np.ndarray):
        """Row `row`'s matcher after `consumed` (None: the row is unconstrained or has ended). An
        EOS token ends the row: it is checked (the grammar must be complete there), not consumed."""
        index = self._grammar(row)
        start = None if index is None else self.grammars[index]
        if start is None:
            return None
        tokens = consumed.tolist()
        matcher, seen = self._memo.get(row, (None, None))
        if seen is None or len(seen) > len(tokens) or tokens[: len(seen)] != seen:
            matcher, seen = start.deep_copy(), []
        new = tokens[len(seen):]
        end = next((j for j, t in enumerate(new) if t in self.eos), len(new))
        if new[:end] and not matcher.consume_tokens(new[:end]) or end < len(new) and not matcher.is_accepting():
            raise RuntimeError(f"row {row} committed a token its grammar forbids: "
                               f"{_one_line(matcher.get_error() or 'an early end')}")
        seen = tokens if end == len(new) else seen + new[: end + 1]  # nothing counts past an EOS
        self._memo[row] = (matcher, seen)
        return None if seen and seen[-1] in self.eos else matcher

    def tree_masks(self, consumed, count, tokens, paths, depth, valid):
        """(uint32[B, N, W] masks, bool[B, N] alive) after each node's path; see the module."""
        b, n = tokens.shape
        masks = np.full((b, n, self.words), 0xFFFFFFFF, np.uint32)
        alive = np.ones((b, n), bool)
        places = [consumed[r, : count[r]] for r in range(b)]
        with self._lock:  # rows with the same grammar, place and tree share one walk
            for r, first in enumerate(self._first_alike(places, tokens, paths, valid)):
                if first < r:
                    masks[r], alive[r] = masks[first], alive[first]
                    continue
                matcher = self.matcher(r, places[r])
                if matcher is not None:
                    self._walk(matcher, tokens[r], paths[r], depth[r], valid[r], masks[r], alive[r])
        return masks, alive

    def _first_alike(self, *per_row) -> list[int]:
        """For each row, the first row with the same grammar and the same `per_row` arrays (the
        row itself if none before it): rows that must get the same answer."""
        first: dict[bytes, int] = {}
        keys = (b"|".join([str(self._grammar(r)).encode()] + [np.ascontiguousarray(a[r]).tobytes() for a in per_row])
                for r in range(len(per_row[0])))
        return [first.setdefault(key, r) for r, key in enumerate(keys)]

    def _walk(self, matcher, tokens, paths, depth, valid, masks, alive):
        """Fill one row's masks and alive flags, visiting its nodes in depth-first order; the
        matcher is back at the root's place at the end. An EOS node is alive where the grammar
        may end and keeps its parent's mask; the nodes below it are dead (the row ends there)."""
        on_path: list[int] = []  # the nodes below the root along the matcher's path
        ended = False  # whether on_path ends with an EOS node (not consumed)
        for i in sorted(np.flatnonzero(valid), key=lambda i: paths[i, 1: depth[i] + 1].tolist()):
            path = paths[i, 1: depth[i] + 1].tolist()
            common = next((j for j, (a, c) in enumerate(zip(on_path, path)) if a != c), min(len(on_path), len(path)))
            if len(on_path) > common:
                drop = len(on_path) - common - ended
                ended = False
                if drop:
                    matcher.rollback(drop)
                del on_path[common:]
            for node in path[common:]:
                token = int(tokens[node])
                if ended or not alive[node]:
                    alive[node] = False
                    break
                if token in self.eos:
                    if not matcher.is_accepting():
                        alive[node] = False
                        break
                    ended = True
                elif matcher.try_consume_tokens([token]) != 1:
                    alive[node] = False
                    break
                on_path.append(node)
            if len(on_path) == len(path) and alive[i]:
                matcher.unsafe_compute_mask_ptr(masks[i].ctypes.data, masks[i].nbytes)
            else:
                alive[i] = False
        if len(on_path) - ended:
            matcher.rollback(len(on_path) - ended)

    def forced(self, consumed, count, n: int):
        """(int32[B, n] tokens, int32[B] count): up to n tokens the grammar fixes from each row's
        place, stopped before an EOS token."""
        b = consumed.shape[0]
        out, k = np.zeros((b, n), np.int32), np.zeros((b,), np.int32)
        places = [consumed[r, : count[r]] for r in range(b)]
        with self._lock:
            for r, first in enumerate(self._first_alike(places)):
                if first < r:
                    out[r], k[r] = out[first], k[first]
                    continue
                matcher = self.matcher(r, places[r])
                if matcher is None or matcher.is_stopped():
                    continue
                fixed = list(itertools.takewhile(lambda t: t not in self.eos, matcher.compute_ff_tokens()))[:n]
                out[r, : len(fixed)], k[r] = fixed, len(fixed)
        return out, k


def lookup(handle: int) -> Matchers:
    """The live Matchers registered under `handle`."""
    try:
        return _LIVE[int(handle)]
    except KeyError:
        raise RuntimeError("a grammar constraint ran after its Python object was freed; keep the "
                           "object returned by sj.constraints.* alive while decoding") from None


def _one_line(message: str, limit: int = 300) -> str:
    """llguidance's (multi-line) error as one line: its lines joined, cut at `limit` characters."""
    text = " ".join(line.strip() for line in message.strip().splitlines() if line.strip())
    return (text if len(text) <= limit else text[: limit - 3] + "...") or "unknown error"
