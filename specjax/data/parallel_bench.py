"""ParallelBench's Waiting Line tasks and puzzles, the digit tasks and the dependency fixture of the
dLLM notes (§10.2, §10.3), in a word-level format a tiny masked-diffusion LM is trained on from
scratch: generators (`sample`), ParallelBench's metrics (`check`), the vocabulary and tokenizer.

Definitions follow furiosa-ai/ParallelBench (`dataset/parallel_bench/data/task.py`, `metrics.py`,
`output/test/{waiting_line,puzzle}/task_config.yaml`); the surface format is ours. What they use
and what we chose:

- Names. ParallelBench draws full names "First Last" from 92 first x ~200 last names (each name
  several subword tokens). We use 24 of their first names, one token each: a pool a tiny model
  learns quickly, still large enough that a list of 8 leaves names to insert. Names in a list are
  distinct, as theirs (drawn without replacement).
- Lengths. Their Waiting Line lists hold 3-6 names (25 prompts per length); we draw 3-8 uniformly,
  so answers are long enough to decode >= 4 tokens per forward and match the 8-digit tasks.
- Indices are 0-based, as theirs: insert at 0..n (n appends), remove / replace at 0..n-1. The word
  inserted or replaced in is never already in the list.
- `sort` orders the names alphabetically (their answer is `sorted` of the full-name strings).
- Metrics (`check`): exact match for the deterministic tasks; `shuffle`: same names, order
  different from the input; `insert_random`: removing the first occurrence of the new name gives
  the input; `remove_random`: one name fewer, exactly one name gone, the rest in order;
  `replace_random`: same length, and putting the new name at its first occurrence in the input
  gives the output (so exactly one position changed, to the new name).
- `latin_square`: they give 4 distinct symbols of A-Z0-9 and accept any 4x4 square whose rows and
  columns each hold every symbol; we draw the symbols from the digits and the answer uniformly from
  all 576 squares (theirs come from cyclic shifts, a subset). Output: the 16 cells row by row.
- `sudoku`: 4x4 grid, 2x2 boxes, 12 givens, blanks written 0; their metric is exact match with the
  solution. We draw the solution uniformly from all 288 grids and the 4 blanks so the solution is
  unique, so exact match is the same as "any valid completion".
- Digit tasks (notes §10.2): `digits_reverse` / `digits_copy` / `digits_sort` of 8 digits.
- `pair` (notes §10.3): prompt two different digits, answer them in either order, probability 1/2.

Format: prompt = (task, *arguments, "<sep>", *items) for list tasks, (task, *digits) otherwise;
answer = the output tokens, followed on the canvas by EOS up to `GEN_LENGTH`. `closed_form_accuracy`
gives the accuracy a perfect model has on copy / replace_random / shuffle when it commits k tokens
per step."""

from __future__ import annotations

import collections
import itertools
import math
from dataclasses import dataclass
from functools import cache
from typing import Sequence

import numpy as np

__all__ = ["TASKS", "DETERMINISTIC", "DEPENDENT", "Example", "sample", "check", "VOCAB", "tokenizer",
           "PAD_ID", "EOS_ID", "MASK_ID", "GEN_LENGTH", "encode", "decode", "closed_form_accuracy",
           "schedule_accuracy", "random_order_accuracy"]

NAMES = ("Anthony", "Charles", "Daniel", "David", "Elizabeth", "Emily", "James", "Jennifer", "Jessica",
         "John", "Joseph", "Karen", "Lisa", "Mark", "Mary", "Matthew", "Michael", "Paul", "Richard",
         "Robert", "Sarah", "Susan", "Thomas", "William")
DIGITS = tuple(str(d) for d in range(10))
MIN_NAMES, MAX_NAMES, NUM_DIGITS = 3, 8, 8

DETERMINISTIC = ("copy", "reverse", "sort", "insert_index", "remove_index", "replace_index",
                 "digits_copy", "digits_reverse", "digits_sort")
# Many valid answers (or, for sudoku, cells that constrain each other): where committing several
# tokens at once from per-position marginals breaks the output.
DEPENDENT = ("shuffle", "insert_random", "remove_random", "replace_random", "latin_square", "sudoku",
             "pair")
TASKS = DETERMINISTIC + DEPENDENT
LIST_TASKS = ("copy", "reverse", "sort", "shuffle", "insert_index", "insert_random", "remove_index",
              "remove_random", "replace_index", "replace_random")

PAD, EOS, MASK, SEP = "<pad>", "<eos>", "<mask>", "<sep>"
VOCAB = (PAD, EOS, MASK, SEP) + TASKS + DIGITS + NAMES
PAD_ID, EOS_ID, MASK_ID = 0, 1, 2
_IDS = {token: i for i, token in enumerate(VOCAB)}
# The longest answer is a 4x4 grid (16 cells; lists reach MAX_NAMES + 1); 24 leaves room for an EOS
# and divides into blocks of 4, 6, 8 and 12.
GEN_LENGTH = 24


@dataclass(frozen=True)
class Example:
    """One prompt and one correct answer (for a dependent task, one of several)."""

    task: str
    prompt: tuple[str, ...]
    answer: tuple[str, ...]


def sample(task: str, rng: np.random.Generator) -> Example:
    """A random example of `task`; the same generator state gives the same example."""
    if task in LIST_TASKS:
        return _sample_list(task, rng)
    if task.startswith("digits_"):
        digits = tuple(DIGITS[d] for d in rng.integers(0, 10, NUM_DIGITS))
        answer = {"digits_copy": digits, "digits_reverse": digits[::-1], "digits_sort": tuple(sorted(digits))}
        return Example(task, (task,) + digits, answer[task])
    if task == "pair":
        pair = tuple(DIGITS[d] for d in rng.choice(10, 2, replace=False))
        return Example(task, (task,) + pair, pair if rng.random() < 0.5 else pair[::-1])
    if task == "latin_square":
        symbols = tuple(DIGITS[d] for d in rng.choice(10, 4, replace=False))
        square = _latin_squares()[rng.integers(len(_latin_squares()))]
        return Example(task, (task,) + symbols, tuple(symbols[c] for c in square))
    if task == "sudoku":
        return _sample_sudoku(rng)
    raise ValueError(f"unknown task {task!r}; one of {TASKS}")


def _sample_list(task, rng):
    n = int(rng.integers(MIN_NAMES, MAX_NAMES + 1))
    order = rng.permutation(len(NAMES))
    names, spare = [NAMES[i] for i in order[:n]], NAMES[order[n]]
    op = task.split("_")[0]
    if op in ("copy", "reverse", "sort"):
        answer = {"copy": names, "reverse": names[::-1], "sort": sorted(names)}[op]
        return Example(task, (task, SEP, *names), tuple(answer))
    if op == "shuffle":
        answer = names
        while answer == names:   # as ParallelBench: the shuffled line differs from the input
            answer = [names[i] for i in rng.permutation(n)]
        return Example(task, (task, SEP, *names), tuple(answer))
    index = int(rng.integers(0, n + 1 if op == "insert" else n))
    answer = list(names)
    if op == "insert":
        answer.insert(index, spare)
    elif op == "remove":
        answer.pop(index)
    else:
        answer[index] = spare
    word = () if op == "remove" else (spare,)
    arguments = word + ((DIGITS[index],) if task.endswith("_index") else ())
    return Example(task, (task, *arguments, SEP, *names), tuple(answer))


def _sample_sudoku(rng):
    grids = _sudoku_grids()
    while True:
        solution = grids[rng.integers(len(grids))]
        blanks = rng.choice(16, 4, replace=False)
        givens = np.ones(16, bool)
        givens[blanks] = False
        if np.sum(np.all(grids[:, givens] == solution[givens], axis=1)) == 1:
            puzzle = np.where(givens, solution, 0)
            return Example("sudoku", ("sudoku",) + tuple(DIGITS[d] for d in puzzle),
                           tuple(DIGITS[d] for d in solution))


@cache
def _latin_squares() -> np.ndarray:
    """int[576, 16]: every 4x4 Latin square over 0..3, row by row."""
    squares = [()]
    for _ in range(4):
        squares = [s + (row,) for s in squares for row in itertools.permutations(range(4))
                   if all(row[c] != above[c] for above in s for c in range(4))]
    return np.array(squares, np.int64).reshape(-1, 16)


@cache
def _sudoku_grids() -> np.ndarray:
    """int[288, 16]: every solved 4x4 sudoku over 1..4 (Latin squares whose 2x2 boxes hold 1..4)."""
    grids = _latin_squares().reshape(-1, 4, 4)
    boxes = grids.reshape(-1, 2, 2, 2, 2).transpose(0, 1, 3, 2, 4).reshape(-1, 4, 4)
    whole = np.all(np.sort(boxes, axis=-1) == np.arange(4), axis=(1, 2))
    return grids[whole].reshape(-1, 16) + 1


def check(example: Example, output: Sequence[str]) -> bool:
    """ParallelBench's metric for `example`'s task on a decoded `output` (see the module docstring)."""
    output, task, prompt = tuple(output), example.task, example.prompt
    if task in DETERMINISTIC or task == "sudoku":
        return output == example.answer
    if task == "pair":
        return output in (prompt[1:], prompt[:0:-1])
    if task == "latin_square":
        symbols = set(prompt[1:])
        if len(output) != 16:
            return False
        rows = [output[4 * r:4 * r + 4] for r in range(4)]
        return all(set(line) == symbols for line in rows + list(zip(*rows)))
    names = list(prompt[prompt.index(SEP) + 1:])
    if task == "shuffle":
        return sorted(output) == sorted(names) and list(output) != names
    if task == "insert_random":
        word, rest = prompt[1], list(output)
        if word not in rest:
            return False
        rest.remove(word)
        return rest == names
    if task == "remove_random":
        gone = set(names) - set(output)
        if len(output) != len(names) - 1 or len(gone) != 1:
            return False
        names.remove(gone.pop())
        return list(output) == names
    if task == "replace_random":
        word = prompt[1]
        if len(output) != len(names) or word not in output:
            return False
        names[output.index(word)] = word
        return list(output) == names
    raise ValueError(f"unknown task {task!r}")


def tokenizer():
    """The word-level `tokenizers.Tokenizer` over `VOCAB` (whitespace-split), to save as tokenizer.json."""
    from tokenizers import Tokenizer, pre_tokenizers
    from tokenizers.models import WordLevel

    tok = Tokenizer(WordLevel(dict(_IDS), unk_token=None))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.add_special_tokens([PAD, EOS, MASK])
    return tok


def encode(example: Example) -> tuple[list[int], list[int]]:
    """(prompt ids, answer ids); the answer without its EOS."""
    return [_IDS[t] for t in example.prompt], [_IDS[t] for t in example.answer]


def decode(ids: Sequence[int]) -> tuple[str, ...]:
    """Generated ids -> tokens, up to (without) the first EOS."""
    tokens = []
    for i in ids:
        if int(i) == EOS_ID:
            break
        tokens.append(VOCAB[int(i)])
    return tuple(tokens)


def accuracy(examples: Sequence[Example], outputs) -> float:
    """The share of `examples` whose generated ids (one row of `outputs` each) pass `check`."""
    return float(sum(check(e, decode(ids)) for e, ids in zip(examples, outputs)) / len(examples))


def closed_form_accuracy(task: str, n: int, k: int, *, distinct_from_input: bool = True) -> float:
    """Accuracy of a perfect model on `task` over a list of `n` distinct names when it commits `k`
    of the list's positions per step, each sampled independently from its exact conditional marginal
    given what is committed (no remasking). Which positions a step takes does not matter: the valid
    answers are symmetric in the positions.

    ParallelBench (arXiv 2510.04767) states such curves in its case studies for Copy, Replace (random) and Shuffle;
    the formulas could not be read here, so these are derived (and checked against a Monte-Carlo
    simulation in tests/test_parallel_bench.py). With m positions still open and k' = min(k, m)
    taken in a step:

    - copy: every marginal is one name, so 1 for every k.
    - replace_random: the replaced position is uniform over the m open ones. The step succeeds
      outright when exactly one of its k' draws is the new name (the rest is then determined),
      goes on when none is, fails when several are:
      A(m) = k'/m (1 - 1/m)^(k'-1) + (1 - 1/m)^k' A(m - k'),  A(0) = 0.
    - shuffle, any permutation valid (`distinct_from_input=False`, the paper's idealisation): each
      draw is uniform over the m names left, the step must draw k' different ones:
      B(m) = m!/((m - k')! m^k') B(m - k'),  B(0) = 1.
    - shuffle as ParallelBench scores it (the input order is invalid, the default): while every
      committed name sits at its input place the answers left are the m! - 1 non-identity orders,
      so a draw is its own name with a = ((m-1)! - 1)/(m! - 1) and each other name with
      b = (m-1)!/(m! - 1). A step of k' draws, all different, s of them at their own place, has
      probability C(k', s) D(k' - s, m - s) a^s b^(k'-s), D(r, M) = sum_j (-1)^j C(r, j) (M-j)!/(M-r)!
      the injections of r places into M names without a fixed point; one moved name leaves the
      uniform case: S(m) = a^k' S(m - k') + sum_{s<k'} P(s) B(m - k'),  S(0) = S(1) = 0.
    """
    if n < 1 or k < 1:
        raise ValueError("need n >= 1 and k >= 1")
    sizes, m = [], n
    while m > 0:
        sizes.append(min(k, m))
        m -= sizes[-1]
    return schedule_accuracy(task, tuple(sizes), distinct_from_input=distinct_from_input)


@cache
def schedule_accuracy(task: str, sizes: tuple[int, ...], *, distinct_from_input: bool = True) -> float:
    """`closed_form_accuracy` when step i commits sizes[i] of the list's positions (each >= 1;
    n = their sum): the recursions above, with k' the step's own size."""
    if not sizes or min(sizes) < 1:
        raise ValueError("need steps of at least one position")
    if task == "copy":
        return 1.0
    steps, m = [], sum(sizes)   # (m, k') for each step: m positions open before it
    for size in sizes:
        steps.append((m, size))
        m -= size

    def all_distinct(first):
        return math.prod(math.perm(mm, kk) / mm ** kk for mm, kk in steps[first:])

    if task == "replace_random":
        accuracy, reach = 0.0, 1.0
        for m, kk in steps:
            accuracy += reach * kk / m * (1 - 1 / m) ** (kk - 1)
            reach *= (1 - 1 / m) ** kk
        return accuracy
    if task == "shuffle":
        if not distinct_from_input:
            return all_distinct(0)
        accuracy, reach = 0.0, 1.0   # reach: probability every name so far sits at its own place
        for i, (m, kk) in enumerate(steps):
            if m < 2:
                break
            total = math.factorial(m) - 1
            a, b = (math.factorial(m - 1) - 1) / total, math.factorial(m - 1) / total
            moved = sum(math.comb(kk, s) * _derangements(kk - s, m - s) * a ** s * b ** (kk - s)
                        for s in range(kk))
            accuracy += reach * moved * all_distinct(i + 1)
            reach *= a ** kk
        return accuracy
    raise ValueError(f"closed form only for copy, replace_random, shuffle; not {task!r}")


def random_order_accuracy(task: str, n: int, k: int, *, block: int = GEN_LENGTH, slots: int = GEN_LENGTH,
                          distinct_from_input: bool = True) -> float:
    """`closed_form_accuracy` when each step commits k of the open slots of its block drawn at
    random (LLaDA's random remasking, `RandomK(k)`), the answer being the first n of the canvas's
    `slots` (EOS after it, which a perfect model commits at no risk) in blocks of `block`. Such a
    step takes fewer than k of the answer's positions; the expectation over which ones (within a
    block, how many answer slots each step's k draws hold is multivariate hypergeometric) of
    `schedule_accuracy`, exact."""
    if not 1 <= n <= slots or k < 1 or block < 1:
        raise ValueError("need 1 <= n <= slots, k >= 1 and block >= 1")
    schedules = {(): 1.0}   # answer positions per step (steps taking none left out) -> probability
    for start in range(0, slots, block):
        size = min(block, slots - start)
        answer = min(max(n - start, 0), size)
        ways = {(): 1}   # answer slots per step so far -> ways to choose them among the block's
        for step in range(0, size, k):
            g, grown = min(k, size - step), collections.Counter()
            for seq, w in ways.items():
                for c in range(min(g, answer - sum(seq)) + 1):
                    grown[seq + ((c,) if c else ())] += w * math.comb(g, c)
            ways = grown
        joined = collections.Counter()
        for old, p in schedules.items():
            for seq, w in ways.items():
                if sum(seq) == answer:
                    joined[old + seq] += p * w / math.comb(size, answer)
        schedules = joined
    return sum(p * schedule_accuracy(task, seq, distinct_from_input=distinct_from_input)
               for seq, p in schedules.items())


def _derangements(r: int, m: int) -> int:
    """Injections of r places into m >= r names (the r places' own names among them), none to its own."""
    return sum((-1) ** j * math.comb(r, j) * math.perm(m - j, r - j) for j in range(r + 1))
