"""ParallelBench tasks: every generated answer passes its task's check and a corrupted one fails;
the dependent tasks accept other valid answers and reject invalid ones; ids round-trip; and the
closed-form accuracy curves agree with a Monte-Carlo simulation of factorized k-per-step decoding."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from tokenizers import Tokenizer

from specjax.data import parallel_bench as pb


def _examples(task, count=40, seed=0):
    rng = np.random.default_rng(seed)
    return [pb.sample(task, rng) for _ in range(count)]


def _corrupt(ex):
    """The answer with its first token changed to another of the same kind, one the example does
    not use where there is one (so no other valid answer of a random task comes out)."""
    pool = pb.DIGITS if ex.answer[0] in pb.DIGITS else pb.NAMES
    unused = [t for t in pool if t not in ex.prompt + ex.answer]
    return (unused[0] if unused else pool[(pool.index(ex.answer[0]) + 1) % len(pool)],) + ex.answer[1:]


@pytest.mark.parametrize("task", pb.TASKS)
def test_check_accepts_the_answer_and_rejects_corruptions(task):
    for ex in _examples(task):
        assert set(ex.prompt) | set(ex.answer) <= set(pb.VOCAB)
        assert len(ex.answer) < pb.GEN_LENGTH
        assert pb.check(ex, ex.answer), ex
        assert not pb.check(ex, ex.answer[:-1]), ex
        assert not pb.check(ex, ex.answer + (ex.answer[0],)), ex
        assert not pb.check(ex, _corrupt(ex)), ex


def test_list_tasks_follow_parallelbench():
    for ex in _examples("insert_index", 200):
        word, index, names = ex.prompt[1], int(ex.prompt[2]), list(ex.prompt[4:])
        assert 0 <= index <= len(names) and word not in names and pb.MIN_NAMES <= len(names) <= pb.MAX_NAMES
        assert list(ex.answer) == names[:index] + [word] + names[index:]
    assert {int(ex.prompt[2]) for ex in _examples("insert_index", 300)} == set(range(pb.MAX_NAMES + 1))
    for ex in _examples("remove_index", 100):
        index, names = int(ex.prompt[1]), list(ex.prompt[3:])
        assert index < len(names) and list(ex.answer) == names[:index] + names[index + 1:]
    for ex in _examples("replace_index", 100):
        word, index, names = ex.prompt[1], int(ex.prompt[2]), list(ex.prompt[4:])
        assert word not in names and list(ex.answer) == names[:index] + [word] + names[index + 1:]
    for ex in _examples("sort", 50):
        assert list(ex.answer) == sorted(ex.prompt[2:])
    assert all(ex.answer != ex.prompt[2:] for ex in _examples("shuffle", 200))


def test_random_tasks_accept_every_valid_answer_and_reject_invalid_ones():
    ex = pb.Example("shuffle", ("shuffle", pb.SEP, "Mary", "John", "Lisa"), ("John", "Mary", "Lisa"))
    valid = [p for p in itertools.permutations(ex.prompt[2:]) if p != ex.prompt[2:]]
    assert all(pb.check(ex, p) for p in valid)
    for bad in [ex.prompt[2:], ("Mary", "Mary", "Lisa"), ("John", "Mary"), ("John", "Mary", "Lisa", "Paul")]:
        assert not pb.check(ex, bad)

    names = ("Mary", "John", "Lisa")
    ex = pb.Example("insert_random", ("insert_random", "Paul", pb.SEP) + names, ("Paul",) + names)
    for i in range(4):
        assert pb.check(ex, names[:i] + ("Paul",) + names[i:])
    for bad in [names, ("Paul", "Paul") + names, ("John", "Paul", "Mary", "Lisa"), ("Mark",) + names]:
        assert not pb.check(ex, bad)

    ex = pb.Example("remove_random", ("remove_random", pb.SEP) + names, names[1:])
    for i in range(3):
        assert pb.check(ex, names[:i] + names[i + 1:])
    for bad in [names, ("John", "Mary"), ("Mary",), ("Mary", "Mary"), ("Mary", "Paul")]:
        assert not pb.check(ex, bad)

    ex = pb.Example("replace_random", ("replace_random", "Paul", pb.SEP) + names, ("Paul",) + names[1:])
    for i in range(3):
        assert pb.check(ex, names[:i] + ("Paul",) + names[i + 1:])
    for bad in [names, ("Paul", "Paul", "Lisa"), ("Paul", "Lisa", "John"), ("Mark", "John", "Lisa")]:
        assert not pb.check(ex, bad)

    ex = pb.Example("pair", ("pair", "3", "7"), ("7", "3"))
    assert pb.check(ex, ("3", "7")) and pb.check(ex, ("7", "3"))
    assert not pb.check(ex, ("3", "3")) and not pb.check(ex, ("7", "7"))


def test_puzzles():
    ex = pb.sample("latin_square", np.random.default_rng(1))
    symbols = ex.prompt[1:]
    relabel = dict(zip(symbols, symbols[1:] + symbols[:1]))
    assert pb.check(ex, tuple(relabel[c] for c in ex.answer))    # another Latin square
    assert pb.check(ex, ex.answer[4:] + ex.answer[:4])             # rows rotated
    assert not pb.check(ex, (ex.answer[1], ex.answer[0]) + ex.answer[2:])
    assert not pb.check(ex, ex.answer[:4] * 4)
    assert len(pb._latin_squares()) == 576 and len(pb._sudoku_grids()) == 288
    for ex in _examples("sudoku", 30):
        puzzle = np.array([int(c) for c in ex.prompt[1:]])
        solution = np.array([int(c) for c in ex.answer])
        assert (puzzle == 0).sum() == 4 and np.all((puzzle == 0) | (puzzle == solution))
        fits = np.all((pb._sudoku_grids() == puzzle) | (puzzle == 0), axis=1)
        assert fits.sum() == 1                                       # the solution is unique


def test_determinism_by_seed():
    for task in pb.TASKS:
        assert _examples(task, 10, seed=3) == _examples(task, 10, seed=3)
    assert _examples("shuffle", 10, seed=3) != _examples("shuffle", 10, seed=4)


def test_encode_decode_round_trip():
    tok = pb.tokenizer()
    assert tok.token_to_id("<pad>") == pb.PAD_ID and tok.token_to_id("<eos>") == pb.EOS_ID
    assert tok.token_to_id("<mask>") == pb.MASK_ID and tok.get_vocab_size() == len(pb.VOCAB)
    tok = Tokenizer.from_str(tok.to_str())   # as saved beside a model in tokenizer.json
    for task in pb.TASKS:
        for ex in _examples(task, 5):
            prompt_ids, answer_ids = pb.encode(ex)
            assert tok.encode(" ".join(ex.prompt)).ids == prompt_ids
            assert tok.decode(answer_ids) == " ".join(ex.answer)
            padded = answer_ids + [pb.EOS_ID] * (pb.GEN_LENGTH - len(answer_ids))
            assert pb.decode(padded) == ex.answer
            assert pb.decode(answer_ids + [pb.EOS_ID, answer_ids[0]]) == ex.answer


def _simulate(valid, symbols, n, k, trials, rng, slots=None, block=None):
    """Fraction of `trials` factorized decodes that `valid` accepts. The answers are every length-n
    string over `symbols` that `valid` accepts; each step commits k random open positions, each drawn
    independently from its marginal over the answers consistent with what is committed. With
    `slots`: a canvas of that many slots, the answer in the first n, the rest padding (committed
    at no risk), filled block by block (`block` slots each), k random open slots of the block per
    step: RandomK on a ParallelBench canvas."""
    answers = np.array([c for c in itertools.product(range(len(symbols)), repeat=n)
                        if valid(tuple(symbols[i] for i in c))])
    slots = slots or n
    block = block or slots
    passed = 0
    for _ in range(trials):
        out = np.full(n, -1)
        for start in range(0, slots, block):
            open_ = list(range(start, min(start + block, slots)))
            while open_:
                fits = answers[np.all((answers == out) | (out < 0), axis=1)]
                if len(fits) == 0:
                    break
                take = rng.choice(open_, min(k, len(open_)), replace=False)
                for pos in take[take < n]:
                    out[pos] = rng.choice(fits[:, pos])
                open_ = [p for p in open_ if p not in take]
        passed += valid(tuple(symbols[i] if i >= 0 else "<mask>" for i in out))
    return passed / trials


# 12000 trials: 4 standard errors (< 0.018) separate the two shuffle variants at (3, 2) and (4, 2).
@pytest.mark.parametrize("task,n,k", [("shuffle", 3, 2), ("shuffle", 4, 2), ("shuffle", 4, 3),
                                      ("shuffle", 4, 4), ("any_order", 3, 2), ("any_order", 4, 2),
                                      ("replace_random", 4, 2), ("replace_random", 4, 3),
                                      ("replace_random", 5, 5)])
def test_closed_form_matches_monte_carlo(task, n, k):
    names = pb.NAMES[:n]
    word = ("Paul",) if task == "replace_random" else ()
    if task == "any_order":   # the paper's idealised shuffle: the input order counts as valid too
        valid, expected = (lambda out: sorted(out) == sorted(names)), pb.closed_form_accuracy(
            "shuffle", n, k, distinct_from_input=False)
    else:
        example = pb.Example(task, (task, *word, pb.SEP, *names), ())
        valid, expected = (lambda out: pb.check(example, out)), pb.closed_form_accuracy(task, n, k)
    trials = 12000
    measured = _simulate(valid, names + word, n, k, trials, np.random.default_rng(n * 10 + k))
    assert abs(measured - expected) < 4 * np.sqrt(expected * (1 - expected) / trials), (measured, expected)


@pytest.mark.parametrize("task,n,k,slots,block", [("shuffle", 4, 2, 8, 8), ("shuffle", 4, 4, 12, 12),
                                                   ("shuffle", 5, 3, 12, 6), ("replace_random", 5, 4, 16, 8),
                                                   ("replace_random", 4, 2, 12, 6)])
def test_random_order_closed_form_matches_monte_carlo(task, n, k, slots, block):
    """RandomK(k) on a canvas of `slots` with padding after the answer: the exact expectation
    within 4 standard errors of a simulation, which the closed form at k answer positions per step
    (the negative control) is not."""
    names = pb.NAMES[:n]
    word = ("Paul",) if task == "replace_random" else ()
    example = pb.Example(task, (task, *word, pb.SEP, *names), ())
    expected = pb.random_order_accuracy(task, n, k, block=block, slots=slots)
    trials = 12000
    measured = _simulate(lambda out: pb.check(example, out), names + word, n, k, trials,
                         np.random.default_rng(n * 100 + k * 10 + block), slots=slots, block=block)
    tolerance = 4 * np.sqrt(expected * (1 - expected) / trials)
    assert abs(measured - expected) < tolerance, (measured, expected)
    assert abs(measured - pb.closed_form_accuracy(task, n, k)) > tolerance


def test_random_order_closed_form_limits():
    for task in ("copy", "replace_random", "shuffle"):
        for n in range(2, 9):
            for k in (1, 2, 3, 8):
                # no padding and one block: every step takes k answer positions
                assert pb.random_order_accuracy(task, n, k, block=n, slots=n) == pytest.approx(
                    pb.closed_form_accuracy(task, n, k))
            assert pb.random_order_accuracy(task, n, 1) == pytest.approx(pb.closed_form_accuracy(task, n, 1))
    # padding spreads the answer over the steps: less parallel than k answer positions a step
    assert pb.random_order_accuracy("shuffle", 5, 4) > pb.closed_form_accuracy("shuffle", 5, 4) + 0.3
    with pytest.raises(ValueError, match="1 <= n <= slots"):
        pb.random_order_accuracy("shuffle", 30, 2)


def test_closed_form_limits():
    for n in range(1, 9):
        assert pb.closed_form_accuracy("copy", n, n) == 1.0
        for task in ("replace_random", "shuffle"):
            assert pb.closed_form_accuracy(task, n, 1) == pytest.approx(1.0 if n > 1 or task != "shuffle" else 0.0)
        # one step for everything: the product of the marginals' chances
        assert pb.closed_form_accuracy("shuffle", n, n, distinct_from_input=False) == pytest.approx(
            np.prod(np.arange(1, n + 1) / n))
        assert pb.closed_form_accuracy("replace_random", n, n) == pytest.approx((1 - 1 / n) ** (n - 1))
    # dropping the input order from the valid set matters most for short lists
    assert pb.closed_form_accuracy("shuffle", 3, 2) != pytest.approx(
        pb.closed_form_accuracy("shuffle", 3, 2, distinct_from_input=False))
