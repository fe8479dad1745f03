"""Before/after timing of a refactor: AR and named drafters on the shipped tiny model, in
whichever specjax tree is first on PYTHONPATH. Least wall time of R passes over 8 held-out
prompts (one `sj.generate` call each, batch 1, 128 new tokens) after a compiling pass; one JSON
line. Interleave the two trees from the shell, e.g. with a git worktree of the old commit:

    for i in 1 2 3 4; do for t in ../before ../main; do PYTHONPATH=$t python benchmarks/tree_ab.py 5 ar eagle; done; done
"""
import json
import sys
import time

import specjax as sj
from specjax.data.prompts import heldout_prompts
from specjax import methods as registry

repeats, methods = int(sys.argv[1]), sys.argv[2:] or ["ar"]
model, tok = sj.load("tiny"), sj.load_tokenizer("tiny")
prompts = [tok.encode(t) for t in heldout_prompts(8)]
out = {"tree": sj.__file__}
for name in methods:
    drafter = registry.make(name, model)
    run = lambda: [sj.generate(model, [p], max_new_tokens=128, drafter=drafter) for p in prompts]  # noqa: E731
    res, best = run(), float("inf")
    for _ in range(repeats):
        t = time.perf_counter()
        res = run()
        best = min(best, time.perf_counter() - t)
    out[name] = {"s": round(best, 4), "tokens": int(sum(r.num_tokens.sum() for r in res)),
                 "tau": round(sum(r.stats.tau for r in res) / len(res), 4)}
print(json.dumps(out))
