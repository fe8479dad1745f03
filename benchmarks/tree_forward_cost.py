"""Cost of one target forward over N new tokens after 200 cached ones, next to a 1-token step
(N = 1 is an AR step; a verify pass over N tree nodes costs about a forward over N tokens): the
curve that sets which tree sizes can pay on a model and machine. Each timing is a compiled loop
of forwards (as the decode loop runs them, with no per-call dispatch in the figure); the least
of --reps timings, since interference on a shared machine only adds time. Prints a markdown table.

python benchmarks/tree_forward_cost.py [--model tiny] [--n 1 4 9 16] [--batch 1 8]
python benchmarks/tree_forward_cost.py --model smollm2 --n 1 2 4 6 8 12 16 24 32 --loop 10 --reps 5
(a real model's forward is ~100x the tiny one's: fewer forwards per timing keep the run short)
python benchmarks/tree_forward_cost.py --model PATH/gemma-3-270m-q4_k_m.gguf --n 1 2 4 8 16 32 --loop 10 \
    --reps 5 --head-rows 0 16384 32768
(--head-rows: a second table, the same forwards with no LM head (0) and with a head over the
first k vocabulary rows, as a reduced draft vocabulary would cost: the LM head's share of a forward)"""
import argparse

import specjax as sj
from specjax.bench.forward_cost import forward_seconds

ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
ap.add_argument("--model", default="tiny", help="any model sj.load reads")
ap.add_argument("--n", type=int, nargs="+", default=[1, 4, 9, 16], help="new tokens per forward")
ap.add_argument("--batch", type=int, nargs="+", default=[1, 8])
ap.add_argument("--cached", type=int, default=200)
ap.add_argument("--cache-len", type=int, default=512, help="cache slots (a decode loop's prompt + new tokens + tree)")
ap.add_argument("--loop", type=int, default=50, help="forwards per timed loop")
ap.add_argument("--reps", type=int, default=15)
ap.add_argument("--head-rows", type=int, nargs="*", default=[],
                help="also time the forward with no LM head (0) or one over the first k vocabulary rows")
args = ap.parse_args()

target = sj.load(args.model)
ns = sorted(set([1, *args.n]))
if args.cached + ns[-1] > args.cache_len:
    ap.error(f"--cached {args.cached} + N {ns[-1]} exceeds --cache-len {args.cache_len}")
if any(not 0 <= k <= target.config.vocab_size for k in args.head_rows):
    ap.error(f"--head-rows must be in [0, {target.config.vocab_size}]")
ms = {(b, n): 1e3 * forward_seconds(target, b, n, cached=args.cached, cache_len=args.cache_len, loop=args.loop,
                                    reps=args.reps)
      for b in args.batch for n in ns}
print(f"Forward over N new tokens after {args.cached} cached ({args.cache_len} slots), {args.model}: "
      f"ms (x a 1-token step), least of {args.reps} loops of {args.loop}\n")
print("| N | " + " | ".join(f"batch {b}" for b in args.batch) + " |")
print("|---|" + "---|" * len(args.batch))
for n in ns:
    print(f"| {n} | " + " | ".join(f"{ms[b, n]:.2f} ({ms[b, n] / ms[b, 1]:.2f}x)" for b in args.batch) + " |")

if args.head_rows:
    rows = {(b, n, k): 1e3 * forward_seconds(target, b, n, cached=args.cached, cache_len=args.cache_len,
                                             loop=args.loop, reps=args.reps, head_rows=k)
            for b in args.batch for n in ns for k in args.head_rows}
    print(f"\nThe same forwards with the LM head cut to k of {target.config.vocab_size} rows (0: none): "
          f"ms (share of the full forward)\n")
    cols = [(b, k) for b in args.batch for k in args.head_rows]
    print("| N | " + " | ".join(f"batch {b}, k={k}" for b, k in cols) + " |")
    print("|---|" + "---|" * len(cols))
    for n in ns:
        print(f"| {n} | " + " | ".join(f"{rows[b, n, k]:.2f} ({rows[b, n, k] / ms[b, n]:.2f})" for b, k in cols) + " |")
