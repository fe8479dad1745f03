"""specjax vs transformers `generate` on the same weights: batch 1, prompt 128, 128 new tokens,
greedy, ~25M and ~110M parameter Llama configs, float32 on the CPU.

    python benchmarks/cpu_vs_transformers.py [--repeats 3] [--out benchmarks/cpu_vs_transformers.json]

Both sides run interleaved, after one warm-up each (which compiles specjax's loop), and the
median of the repeats is reported. Outputs are checked to be equal token for token.
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import tempfile
import time

import jax
import numpy as np
import torch
import transformers

import specjax as sj

CONFIGS = {
    "llama-25M": dict(hidden_size=512, intermediate_size=1408, num_hidden_layers=6,
                      num_attention_heads=8, num_key_value_heads=4),
    "llama-110M": dict(hidden_size=768, intermediate_size=2048, num_hidden_layers=12,
                       num_attention_heads=12, num_key_value_heads=12),
}


def bench(name, kw, prompt_len, new_tokens, repeats):
    cfg = transformers.LlamaConfig(vocab_size=8192, max_position_embeddings=1024, **kw)
    torch.manual_seed(0)
    hf = transformers.LlamaForCausalLM(cfg).eval()
    with tempfile.TemporaryDirectory() as d:
        hf.save_pretrained(d)
        model = sj.load(d)
    prompt = np.random.RandomState(0).randint(3, 8192, size=(1, prompt_len))

    def run_hf():
        with torch.no_grad():
            return hf.generate(torch.tensor(prompt), max_new_tokens=new_tokens, min_new_tokens=new_tokens,
                               do_sample=False, pad_token_id=0)[0, prompt_len:].numpy()

    def run_sj():
        return sj.generate(model, prompt, max_new_tokens=new_tokens).tokens[0]

    assert np.array_equal(run_hf(), run_sj()), "outputs differ"
    times = {"transformers": [], "specjax": []}
    for _ in range(repeats):
        for side, fn in (("transformers", run_hf), ("specjax", run_sj)):
            t0 = time.perf_counter()
            fn()
            times[side].append(time.perf_counter() - t0)
    tps = {side: new_tokens / statistics.median(t) for side, t in times.items()}
    params = sum(p.numel() for p in hf.parameters())
    return {"model": name, "params_M": round(params / 1e6, 1), "hf_tokens_per_s": round(tps["transformers"], 1),
            "specjax_tokens_per_s": round(tps["specjax"], 1),
            "speedup": round(tps["specjax"] / tps["transformers"], 2)}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--prompt-len", type=int, default=128)
    ap.add_argument("--new-tokens", type=int, default=128)
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    rows = [bench(n, kw, args.prompt_len, args.new_tokens, args.repeats) for n, kw in CONFIGS.items()]
    machine = (f"{platform.processor() or platform.machine()}, {torch.get_num_threads()} torch threads, "
               f"jax {jax.__version__} ({jax.default_backend()}), torch {torch.__version__}, "
               f"transformers {transformers.__version__}")
    print(f"machine: {machine}\n")
    print("| model | params | transformers tok/s | specjax tok/s | speedup |")
    print("|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['model']} | {r['params_M']}M | {r['hf_tokens_per_s']} | {r['specjax_tokens_per_s']} | {r['speedup']}x |")
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"machine": machine, "rows": rows}, f, indent=2)


if __name__ == "__main__":
    main()
