"""The sampled law of the shipped SmolLM2 EAGLE-3 head's trees on the real target, with enough
draws that a 3% error in the law fails.

The test suite checks the law with 256 draws (tests/test_smollm2.py), which a lossy rule fails by
far but a small error would pass. Here: the exact law of the first two new tokens (enumerated
with `sj.forward`, T = 1.5, top-k 3, the prompt where the head drafts a repeated sentence the
target is unsure of), the number of draws at which a chi-square test at `--alpha` has 99% power
against a 3% error (3% of the mass moved from the likeliest pair to the second: the smallest
change of that size the test sees least well), then each tree's draws tested twice: against the
exact law (must pass) and against the 3%-wrong one (must fail: the negative control, on the same
draws).

    python benchmarks/eagle_sampled_law.py [--draws N] [--batch 256] [--alpha 1e-3]
"""
import argparse
import sys
import time
from pathlib import Path

import numpy as np
from scipy import stats

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import specjax as sj  # noqa: E402
from specjax.convert.heads import shipped_target  # noqa: E402
from specjax.drafters import Eagle  # noqa: E402
from specjax.sampling import SamplingParams  # noqa: E402
from tests.exactness import chi_square_pvalue, sampled_pairs, top_k_first_two_law  # noqa: E402

ERROR = 0.03
POWER = 0.99


def shifted(p: np.ndarray, eps: float) -> np.ndarray:
    """p with eps of mass moved from its likeliest cell to its second."""
    first, second = np.argsort(p)[::-1][:2]
    q = p.copy()
    q[first] -= eps
    q[second] += eps
    return q


def draws_for_power(p: np.ndarray, q: np.ndarray, alpha: float, power: float) -> int:
    """Draws at which a chi-square test of samples from q against p rejects with `power`."""
    df = int((p > 0).sum()) - 1
    critical = stats.chi2.isf(alpha, df)
    per_draw = float(np.sum((q - p) ** 2 / p))  # noncentrality per draw
    n = 64
    while stats.ncx2.sf(critical, df, n * per_draw) < power:
        n = int(n * 1.1) + 1
    return n


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--draws", type=int, help="default: what 99%% power against a 3%% error needs")
    ap.add_argument("--batch", type=int, default=256)
    ap.add_argument("--alpha", type=float, default=1e-3)
    args = ap.parse_args()

    model, tok = sj.load("smollm2"), sj.load_tokenizer("smollm2")
    prompt = tok.encode("one two three four five, one two three four five, one two three")
    params = SamplingParams(temperature=1.5, top_k=3)
    law = top_k_first_two_law(model, prompt, params)
    cells = sorted(law)
    p = np.array([law[c] for c in cells] + [0.0])
    wrong = shifted(p, ERROR)
    needed = draws_for_power(p[:-1], wrong[:-1], args.alpha, POWER)
    draws = -(-(args.draws or needed) // args.batch) * args.batch
    print(f"law of the first two tokens: {len(cells)} pairs, likeliest {np.sort(p)[::-1][:3].round(3).tolist()}; "
          f"{needed} draws give {POWER:.0%} power against a {ERROR:.0%} error at alpha {args.alpha:g}; "
          f"drawing {draws}\n")
    print("| tree | verifier | draws | p-value vs exact law | p-value vs 3%-wrong law | verdict | seconds |")
    print("|---|---|---|---|---|---|---|")
    for tree in ("topk", "dyspec"):
        drafter = Eagle.load(shipped_target(model.config, "eagle"), target=model, tree=tree)
        start = time.perf_counter()
        counts = sampled_pairs(model, prompt, drafter, params, cells, batch=args.batch, calls=draws // args.batch)
        seconds = time.perf_counter() - start
        exact, control = chi_square_pvalue(counts, p), chi_square_pvalue(counts, wrong)
        verdict = "exact" if exact > args.alpha and control < args.alpha else "FAILED"
        rule = type(drafter.default_verifier(params)).__name__
        print(f"| {tree} | {rule} | {draws} | {exact:.3g} | {control:.2g} | {verdict} | {seconds:.0f} |", flush=True)


if __name__ == "__main__":
    main()
