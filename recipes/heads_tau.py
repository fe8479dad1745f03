"""Greedy tau (tokens per target forward) of the shipped head drafters on held-out prompts,
as Markdown. `TARGET=folder python recipes/heads_tau.py` (default: the shipped tiny target)."""

import os
import sys

import numpy as np

import specjax as sj
from specjax.data.corpus import list_files, read_text, resolve_root
from specjax.drafters import PPD, Clover, Eagle, HiddenTransfer, Medusa
from specjax.train.bpe import load_bpe

target = sj.load(os.environ.get("TARGET", "tiny"))
tok = load_bpe(sys.argv[1] if len(sys.argv) > 1 else "runs/tokenizer")
_, held = list_files(resolve_root("stdlib"))
print(f"Greedy decoding, 64 new tokens from 8 held-out prompts of 64 tokens, target {target.config.num_layers}"
      f" layers / hidden {target.config.hidden_size}.\n")
prompts = []
for f in held[:8]:  # the first 64 tokens of 8 held-out modules
    ids = tok.encode(read_text(f)).ids
    prompts.append(ids[len(ids) // 3: len(ids) // 3 + 64])
drafters = {"ar": None,
            "medusa, 8 nodes (named 'medusa')": Medusa.load("tiny", tree_size=8),
            "medusa, shipped tree (24 nodes)": Medusa.load("tiny"),
            "eagle, 8 nodes (named 'eagle')": Eagle.load("tiny", target=target, top_k=4, depth=4, total_tokens=8),
            "eagle, shipped tree (32 nodes)": Eagle.load("tiny", target=target),
            "clover, 8 nodes (named 'clover')": Clover.load("tiny", target=target, tree_size=8),
            "clover, shipped tree (24 nodes)": Clover.load("tiny", target=target),
            "ppd, 8 nodes + 8 guesses (named 'ppd')": PPD.load("tiny"),
            "ppd, 16 nodes + 24 guesses": PPD.load("tiny", tree_size=16, guess_budget=24),
            "hidden-transfer, 8 nodes + 8 guesses (named)": HiddenTransfer.load("tiny"),
            "hidden-transfer, 16 nodes + 24 guesses": HiddenTransfer.load("tiny", tree_size=16, guess_budget=24)}
print("| drafter | tau | acceptance per depth | tokens equal to AR |")
print("|---|---|---|---|")
ref = None
for name, d in drafters.items():
    out = sj.generate(target, prompts, max_new_tokens=64, drafter=d)
    ref = out.tokens if ref is None else ref
    acc = ", ".join(f"{a:.2f}" for a in out.stats.acceptance_per_depth)
    print(f"| {name} | {out.stats.tau:.2f} | {acc} | {bool(np.array_equal(out.tokens, ref))} |")
