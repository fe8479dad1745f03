"""What one drafted token of Swift, DEL and the quantized self-draft costs next to an AR step of
the same target.

An AR step is the target's forward over 1 token after `--cached` committed tokens
(specjax.bench.forward_cost); a draft step is `skip_forward` over 1 token with the drafter's
sublayers plus the LM head, timed the same way (a compiled loop, least of the repeats). Rows:
Swift's starting skip set, DEL at each of its named exits, and every sublayer of the target's
int8 and int4 copies (`quantized-self`).

    nice -n 10 python benchmarks/self_draft_cost.py --model smollm2
"""

from __future__ import annotations

import argparse

import jax
import jax.numpy as jnp
import numpy as np

import specjax as sj
from specjax.bench.forward_cost import forward_seconds, loop_seconds
from specjax.drafters.dynamic_exit import spread_exits
from specjax.drafters.swift import Swift
from specjax.models import KVCache, lm_head
from specjax.models.layer_skip import empty_block, skip_forward


def draft_seconds(model, params, keep_attn, keep_mlp, *, cached: int, loop: int, reps: int) -> float:
    cfg = model.config
    cache = KVCache.init(cfg, 1, cached + 8)._replace(lengths=jnp.full((1,), cached, jnp.int32))
    ka, km = jnp.asarray(keep_attn)[None], jnp.asarray(keep_mlp)[None]

    @jax.jit
    def run(params, cache):
        def body(i, acc):
            hidden, _ = skip_forward(cfg, params, jnp.full((1, 1), i, jnp.int32), cache, empty_block(cfg, 1, 8),
                                     0, ka, km)
            return acc + lm_head(cfg, params, hidden).max()  # every logit, so XLA computes the whole head
        return jax.lax.fori_loop(0, loop, body, 0.0)

    return loop_seconds(run, params, cache, loop=loop, reps=reps)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="smollm2")
    ap.add_argument("--cached", type=int, default=256)
    ap.add_argument("--loop", type=int, default=20)
    ap.add_argument("--reps", type=int, default=5)
    args = ap.parse_args()
    model = sj.load(args.model)
    layers = model.config.num_layers
    ar = forward_seconds(model, 1, 1, cached=args.cached, cache_len=args.cached + 8, loop=args.loop, reps=args.reps)
    every = np.ones((2, layers), bool)
    rows = [("swift (starting set)", model.params, ~Swift().initial_skip(layers))]
    rows += [(f"del exit {e}/{layers}", model.params, np.broadcast_to(np.arange(layers) < e, (2, layers)))
             for e in spread_exits(layers)]
    rows += [(f"quantized-self, {mode}", sj.quantize(model, mode).params, every) for mode in ("int8", "int4")]
    print(f"{args.model}, batch 1, {args.cached} cached tokens: AR step {ar * 1e3:.2f} ms")
    print("| draft | sublayers run | ms per drafted token | x AR step |\n|---|---|---|---|")
    for name, params, keep in rows:
        t = draft_seconds(model, params, keep[0], keep[1], cached=args.cached, loop=args.loop, reps=args.reps)
        print(f"| {name} | {int(keep.sum())}/{2 * layers} | {t * 1e3:.2f} | {t / ar:.2f} |")


if __name__ == "__main__":
    main()
