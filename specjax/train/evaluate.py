"""Evaluate trained runs: held-out loss/perplexity over every held-out window, and greedy
continuations of held-out function signatures, printed as Markdown.

`python -m specjax.train.evaluate --config configs/tiny.toml [--config ...] [--new-tokens 64]`
"""

from __future__ import annotations

import argparse
from pathlib import Path

import jax
import jax.numpy as jnp

from specjax.models import ModelConfig, forward
from specjax.train.config import load_config
from specjax.train.data import eval_windows, load_streams
from specjax.train.export import load_trained_params
from specjax.train.loop import held_out, score_function
from specjax.train.objectives import make_objective
from specjax.train.tokenizer import EOT, load_trained_tokenizer

# Signatures of functions in held-out modules (textwrap, heapq, shlex). No trailing newline:
# the BPE merges a newline with the next line's indentation, so a prompt ending in a bare
# "\n" would end on a token boundary never seen in training.
PROMPTS = ("def dedent(text):", "def heappush(heap, item):", "def quote(s):")


def greedy(config: ModelConfig, params: dict, ids: list[int], new_tokens: int) -> list[int]:
    """Plain greedy decoding by full re-forwards over a fixed-size buffer (one compile)."""
    size = len(ids) + new_tokens
    buf = jnp.zeros((1, size), jnp.int32).at[0, :len(ids)].set(jnp.asarray(ids))

    @jax.jit
    def next_token(buf, pos):
        logits = forward(config, params, buf).logits
        return jnp.argmax(logits[0, pos - 1])

    for pos in range(len(ids), size):
        buf = buf.at[0, pos].set(next_token(buf, pos))
    return [int(t) for t in buf[0, len(ids):]]


def main(argv=None) -> None:
    p = argparse.ArgumentParser(prog="python -m specjax.train.evaluate", description=__doc__)
    p.add_argument("--config", action="append", required=True, help="run config (repeatable)")
    p.add_argument("--new-tokens", type=int, default=64)
    p.add_argument("--windows", type=int, help="cap on held-out windows (default: all)")
    args = p.parse_args(argv)
    print("| model | params | step | held-out loss (nats/token) | perplexity |")
    print("|---|---|---|---|---|")
    samples = []
    for path in args.config:
        cfg = load_config(path)
        params, step = load_trained_params(cfg)
        _, val = load_streams(cfg.data)
        windows = eval_windows(val, cfg.data.seq_len + 1, args.windows)
        m = held_out(score_function(make_objective(cfg), cfg.train.seed), params, windows, cfg.train.batch_size)
        n = sum(x.size for x in jax.tree.leaves(params))
        name = Path(cfg.train.out).name
        print(f"| {name} | {n / 1e6:.2f}M | {step} | {m['loss']:.4f} | {m['ppl']:.2f} |")
        tok = load_trained_tokenizer(cfg.data.tokenizer)
        for prompt in PROMPTS:
            ids = [tok.token_to_id(EOT)] + tok.encode(prompt).ids
            samples.append((name, prompt, tok.decode(greedy(cfg.model, params, ids, args.new_tokens))))
    print(f"\nHeld-out loss over {len(windows)} disjoint {cfg.data.seq_len}-token windows spread "
          f"over the held-out modules ({len(val)} tokens in all).\n")
    for name, prompt, text in samples:
        print(f"**{name}**, greedy, {args.new_tokens} new tokens:\n\n```python\n{prompt}{text}\n```\n")


if __name__ == "__main__":
    main()
