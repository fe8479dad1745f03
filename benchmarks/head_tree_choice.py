"""Choose a head's CPU tree by measurement (EAGLE: top_k, depth, total_tokens, min_prob,
verify_sizes; Medusa and Clover: the sparse tree's size): tau and wall time of each candidate against AR on prompts the head never trained
on and the benchmark does not use (`train.prompts.build_prompts` with another seed, minus every training prompt), one
`sj.generate` call per prompt at batch 1, greedy, candidates interleaved in a fresh random order
each repeat, least wall time of the repeats. Prints a table; the fastest goes into the head.

    python benchmarks/head_tree_choice.py HEAD_DIR [--kind eagle|medusa|clover] [--model smollm2]
        [--prompts 8] [--repeats 3] [--trained-on runs/smollm2-distill/prompts.jsonl]
"""
import argparse
import json
import random
import time
from pathlib import Path

import specjax as sj
from specjax.data.chat import prompt_ids
from specjax.data.distill_prompts import build_prompts
from specjax.drafters import Clover, Eagle, Medusa

# (top_k, depth, total_tokens, min_prob, verify_sizes): the verify's cost per node count is the forward-cost
# curve (benchmarks/cpu-smollm2/forward-cost.md; the CPU kernels made wide verifies cheaper since); with min_prob the tree
# keeps the nodes the head is sure of and the target verifies the smallest size that holds them (1: an AR step).
EAGLE_TREES = [(2, 3, 4, 0.0, ()), (2, 3, 4, 0.1, (1, 2)), (2, 3, 4, 0.2, (1, 2)), (2, 3, 4, 0.3, (1, 2)),
               (2, 3, 4, 0.2, (1,)), (4, 3, 8, 0.0, ()), (4, 5, 8, 0.0, ()), (4, 5, 8, 0.1, (1, 4)),
               (4, 3, 8, 0.2, (1, 2, 4)), (6, 5, 12, 0.1, (1, 4, 8)), (6, 6, 16, 0.05, (4, 8, 12))]
SPARSE_TREE_SIZES = (3, 4, 6, 8, 12)  # Medusa's and Clover's trees, built from the held-out accuracies

p = argparse.ArgumentParser()
p.add_argument("head")
p.add_argument("--kind", choices=("eagle", "medusa", "clover"), default="eagle")
p.add_argument("--model", default="smollm2")
p.add_argument("--prompts", type=int, default=8)
p.add_argument("--repeats", type=int, default=3)
p.add_argument("--max-new-tokens", type=int, default=96)
p.add_argument("--trained-on", help="the distill run's prompts.jsonl, whose rows are left out")
args = p.parse_args()

model, tok = sj.load(args.model), sj.load_tokenizer(args.model)
seen = set()
if args.trained_on:
    seen = {json.dumps(json.loads(line)["turns"]) for line in Path(args.trained_on).read_text().splitlines()}
rows = [r for r in build_prompts(4 * args.prompts, seed=20261124) if json.dumps(r["turns"]) not in seen]
prompts = [prompt_ids(tok, r) for r in rows[: args.prompts]]
if args.kind == "eagle":
    candidates = {f"eagle {k}/{d}/{n} p>={p} {sizes}": Eagle.load(
        args.head, target=model, top_k=k, depth=d, total_tokens=n, min_prob=p, verify_sizes=sizes)
        for k, d, n, p, sizes in EAGLE_TREES}
else:
    cls = {"medusa": Medusa, "clover": Clover}[args.kind]
    candidates = {f"{args.kind} {n} nodes": cls.load(args.head, tree_size=n) for n in SPARSE_TREE_SIZES}
    for drafter in candidates.values():
        drafter.check(model)
methods = {"ar": None, **candidates}
run = {name: (lambda d: lambda: [sj.generate(model, [q], max_new_tokens=args.max_new_tokens, drafter=d)
                                 for q in prompts])(d) for name, d in methods.items()}
results = {name: f() for name, f in run.items()}  # compile
best = dict.fromkeys(run, float("inf"))
for _ in range(args.repeats):
    for name in random.sample(list(run), len(run)):
        t = time.perf_counter()
        results[name] = run[name]()
        best[name] = min(best[name], time.perf_counter() - t)
ref = [r.tokens.tolist() for r in results["ar"]]
print(f"{len(prompts)} prompts x {args.max_new_tokens} tokens, batch 1, greedy, least of {args.repeats}\n")
print("| method | tau | s | speedup | = ar |\n|---|---|---|---|---|")
for name, res in results.items():
    tau = sum(r.stats.new_tokens for r in res) / sum(r.stats.target_calls for r in res)
    same = [r.tokens.tolist() for r in res] == ref
    print(f"| {name} | {tau:.2f} | {best[name]:.2f} | {best['ar'] / best[name]:.2f}x | {'yes' if same else 'NO'} |")
