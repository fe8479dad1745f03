"""Evaluate trained runs: held-out loss/perplexity over every held-out window (for a masked-
diffusion LM, the `mdm` loss: a bound on it), and greedy continuations of held-out function
signatures, printed as Markdown
(`python -m specjax.train evaluate --config configs/tiny.toml [--config ...] [--new-tokens 64]`).
"""

from __future__ import annotations

from pathlib import Path

import jax

from specjax import diffusion
from specjax.decoding import generate
from specjax.diffusion import make_canvas
from specjax.models import Model
from specjax.train.bpe import EOT, load_bpe
from specjax.train.export import load_trained_params
from specjax.train.loop import held_out, score_function
from specjax.train.objectives import make_objective
from specjax.train.run_config import load_config
from specjax.train.token_windows import eval_windows, load_streams

# Signatures of functions in held-out modules (textwrap, heapq, shlex). No trailing newline:
# the BPE merges a newline with the next line's indentation, so a prompt ending in a bare
# "\n" would end on a token boundary never seen in training.
PROMPTS = ("def dedent(text):", "def heappush(heap, item):", "def quote(s):")
DLLM_BLOCK = 32  # LLaDA's demo block length


def continuations(model: Model, prompts: list[list[int]], new_tokens: int) -> jax.Array:
    """int32 [B, new_tokens]: greedy decoding (`sj.generate`), or for a masked-diffusion LM its
    static decoding (one token per forward, semi-autoregressive blocks of DLLM_BLOCK)."""
    if not model.config.bidirectional:
        return generate(model, prompts, max_new_tokens=new_tokens).tokens
    canvas = make_canvas(prompts, new_tokens, model.config.mask_token_id)
    return diffusion.generate(model, canvas, gen_length=new_tokens, blocks=DLLM_BLOCK, rule=diffusion.TopK(1)).tokens


def report(config_paths, new_tokens: int = 64, windows: int | None = None) -> None:
    """Print each run's held-out loss, then its greedy continuations of PROMPTS (`sj.generate`)."""
    print("| model | params | step | held-out loss (nats/token) | perplexity |")
    print("|---|---|---|---|---|")
    samples = []
    for path in config_paths:
        cfg = load_config(path)
        params, step = load_trained_params(cfg)
        _, val = load_streams(cfg.data)
        held = eval_windows(val, cfg.data.seq_len + 1, windows)
        m = held_out(score_function(make_objective(cfg), cfg.train.seed), params, held, cfg.train.batch_size)
        n = sum(x.size for x in jax.tree.leaves(params))
        name = Path(cfg.train.out).name
        print(f"| {name} | {n / 1e6:.2f}M | {step} | {m['loss']:.4f} | {m['ppl']:.2f} |")
        tok = load_bpe(cfg.data.tokenizer)
        prompts = [[tok.token_to_id(EOT)] + tok.encode(prompt).ids for prompt in PROMPTS]
        out = continuations(Model(params, cfg.model), prompts, new_tokens)
        samples += [(name, prompt, tok.decode(out[i].tolist())) for i, prompt in enumerate(PROMPTS)]
    print(f"\nHeld-out loss over {len(held)} disjoint {cfg.data.seq_len}-token windows spread "
          f"over the held-out modules ({len(val)} tokens in all).\n")
    for name, prompt, text in samples:
        print(f"**{name}**, greedy, {new_tokens} new tokens:\n\n```python\n{prompt}{text}\n```\n")
