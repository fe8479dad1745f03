"""Train the Learn2PD filter shipped beside the task dLLM (specjax/assets/tiny-dllm-tasks/learn2pd.npz).

For fresh seeded examples of every task: static decoding (TopK(1)) gives the reference answers,
the oracle's traces against them give (block confidences, correct?) per forward, and the filter
is fitted on 80% of the traces; the false-positive rate at the acceptance threshold is reported
on the other 20%.

    python recipes/make_learn2pd.py [--model tiny-dllm-tasks] [--examples 96] [--block 8]
"""

from __future__ import annotations

import argparse
import sys

import numpy as np

import specjax as sj
from specjax import diffusion as dd
from specjax.convert import resolve
from specjax.data import parallel_bench as pb
from specjax.diffusion import learn2pd
from specjax.diffusion.named import FILTER_FILE
from specjax.diffusion.rules import filter_scores


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="tiny-dllm-tasks")
    ap.add_argument("--examples", type=int, default=96, help="examples per task")
    ap.add_argument("--block", type=int, default=8, help="the filter's width: the block length it decodes")
    ap.add_argument("--accept", type=float, default=0.96)
    ap.add_argument("--steps", type=int, default=3000)
    ap.add_argument("--seed", type=int, default=1000, help="apart from the bench's examples (seed 0)")
    args = ap.parse_args()
    folder = resolve(args.model)
    model = sj.load(folder)
    features, labels = [], []
    for i, task in enumerate(pb.TASKS):
        rng = np.random.default_rng((args.seed, i))
        prompts = [pb.encode(pb.sample(task, rng))[0] for _ in range(args.examples)]
        canvas = dd.make_canvas(prompts, pb.GEN_LENGTH, pb.MASK_ID, pb.PAD_ID)
        reference = dd.generate(model, canvas, gen_length=pb.GEN_LENGTH, blocks=args.block, rule=dd.TopK(1)).tokens
        f, y = learn2pd.oracle_traces(model, canvas, reference, gen_length=pb.GEN_LENGTH, block_length=args.block)
        features.append(f)
        labels.append(y)
        print(f"{task}: {len(f)} traces", file=sys.stderr)
    features, labels = np.concatenate(features), np.concatenate(labels)
    order = np.random.default_rng(args.seed).permutation(len(features))
    split = int(0.8 * len(order))
    train, held = order[:split], order[split:]
    params = learn2pd.train_filter(features[train], labels[train], steps=args.steps)
    fp = learn2pd.false_positive_rate(params, features[held], labels[held], args.accept)
    accepted = np.asarray(filter_scores(params, features[held])) > args.accept
    learn2pd.save_filter(params, folder / FILTER_FILE)
    print(f"{len(features)} traces ({labels.mean():.2f} correct); held out: {accepted.mean():.2f} accepted "
          f"at {args.accept}, false positives {fp:.4f}; wrote {folder / FILTER_FILE}")


if __name__ == "__main__":
    main()
