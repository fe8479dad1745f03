"""Cost of one tiny-target forward over N = 1, 4, 9, 16 new tokens after 200 cached ones, at
batch 1 and 8: the cost of a verify pass next to an AR step. Each timing is a compiled loop of
50 forwards (as the decode loop runs them, with no per-call dispatch in the figure); the least
of 15 timings, since interference on a shared machine only adds time.
python benchmarks/tree_forward_cost.py"""
import specjax as sj
from specjax.bench.forward_cost import forward_seconds

target = sj.load("tiny")
for b in (1, 8):
    res = {n: forward_seconds(target, b, n, cached=200, cache_len=512, loop=50, reps=15) for n in (1, 4, 9, 16)}
    print("batch", b, {n: f"{1e3 * v:.2f} ms ({v / res[1]:.2f}x)" for n, v in res.items()}, flush=True)
