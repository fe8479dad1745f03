"""specjax against llama.cpp on the same GGUF files, prompts, threads and host, side by side.

Each engine runs in its own process, batch 1, greedy, on the chat template of each prompt set
row (the same token ids for both engines), warm (one generation before timing); the runs are
interleaved (llama.cpp, then each specjax method, per file, per repeat) and each figure is the
least over repeats. tokens/s counts new tokens over the wall time of generation, prompt
processing included, summed over the prompts; llama.cpp's reuse of a prompt prefix it has just
seen is off (each prompt is prefilled from nothing, as specjax does: with it on, the warm-up's
prompt, the longest, came back free). `--activations float int8` adds specjax rows whose
quantized matmuls take int8 activations (`sj.quantize_activations`), as llama.cpp's Q8_0 /
Q4_0 matmuls do. Needs llama-cpp-python (a benchmark-only tool:
`pip install llama-cpp-python`, ~9 minutes to build; on a VM whose CPU reports AMX, build it
with `CMAKE_ARGS="-DGGML_NATIVE=OFF -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON -DGGML_AVX512=ON
-DGGML_AVX512_VNNI=ON"`: a native build there crashed on quantized files). A Q4_0 file is made
from the f32 one with `--make-q4_0 OUT` (llama.cpp's own quantizer).

    python benchmarks/vs_llamacpp.py --gguf smol-f32.gguf smol-q8_0.gguf \
        --methods ar prompt-lookup eagle --prompts chat --repeats 3
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import subprocess
import sys
import time

from specjax.bench.report import cpu


def prompt_ids(prompts: str, n: int) -> list[list[int]]:
    import specjax as sj
    from specjax.data.chat import prompt_ids as row_ids
    from specjax.data.prompts import prompt_set

    tok = sj.load_tokenizer("smollm2")
    return [row_ids(tok, row) for row in prompt_set(prompts, n)]


def run_llamacpp(gguf: str, prompts: list[list[int]], max_new: int, threads: int) -> dict:
    from llama_cpp import Llama

    llm = Llama(model_path=gguf, n_ctx=2048, n_threads=threads, n_batch=512, verbose=False)
    llm.create_completion(prompts[0], max_tokens=8, temperature=0.0)  # warm
    new, seconds, texts = 0, 0.0, []
    for ids in prompts:
        llm.reset()  # no prefix reuse: the whole prompt is prefilled, as specjax does
        t0 = time.perf_counter()
        out = llm.create_completion(ids, max_tokens=max_new, temperature=0.0, top_k=1)
        seconds += time.perf_counter() - t0
        new += out["usage"]["completion_tokens"]
        texts.append(out["choices"][0]["text"])
    return {"tokens_per_s": new / seconds, "new_tokens": new}


def run_specjax(gguf: str, method: str, activations: str, prompts: list[list[int]], max_new: int) -> dict:
    import specjax as sj
    from specjax.methods import make
    from specjax.quantize import is_quantized

    model = sj.load(gguf)
    if activations == "int8":
        if not is_quantized(model):
            return {"skipped": "float weights (int8 activations go with quantized matmuls)"}
        model = sj.quantize_activations(model)
    eos = sj.load_tokenizer("smollm2").eos_token_ids
    try:
        drafter = make(method, model)
    except ValueError as e:  # a method this file cannot serve (quantized-self on a quantized file)
        return {"skipped": str(e)}
    sj.generate(model, [prompts[0]], max_new_tokens=max_new, drafter=drafter, eos_token_id=eos)
    new, seconds, calls, digest = 0, 0.0, 0, hashlib.sha256()
    for ids in prompts:
        out = sj.generate(model, [ids], max_new_tokens=max_new, drafter=drafter, eos_token_id=eos)
        new += int(out.num_tokens[0])
        seconds += out.stats.wall_time_s
        calls += out.stats.target_calls
        digest.update(str(out.tokens[0, :int(out.num_tokens[0])].tolist()).encode())
    return {"tokens_per_s": new / seconds, "new_tokens": new, "tau": new / calls,
            "digest": digest.hexdigest()}


def make_q4_0(src: str, out: str) -> None:
    """Write `out`, the Q4_0 quantization of the GGUF `src`, with llama.cpp's own quantizer (its
    default mixture for the type)."""
    import ctypes

    import llama_cpp

    params = llama_cpp.llama_model_quantize_default_params()
    params.ftype = llama_cpp.LLAMA_FTYPE_MOSTLY_Q4_0
    params.nthread = os.cpu_count()
    if llama_cpp.llama_model_quantize(src.encode(), out.encode(), ctypes.byref(params)):
        sys.exit(f"llama.cpp could not quantize {src}")


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--gguf", nargs="+", default=[], help="GGUF files of the same model")
    p.add_argument("--methods", nargs="+", default=["ar", "prompt-lookup"], help="specjax methods")
    p.add_argument("--activations", nargs="+", default=["float"], choices=["float", "int8"],
                   help="specjax's activations into quantized matmuls (each a set of rows)")
    p.add_argument("--prompts", default="chat", help="chat or humaneval")
    p.add_argument("--num-prompts", type=int, default=8)
    p.add_argument("--max-new-tokens", type=int, default=96)
    p.add_argument("--threads", type=int, default=os.cpu_count())
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--make-q4_0", metavar="OUT", help="write a Q4_0 of the first --gguf to OUT and stop")
    p.add_argument("--child", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.make_q4_0:
        return make_q4_0(args.gguf[0], args.make_q4_0)
    if args.child:
        engine, gguf, method, activations = json.loads(args.child)
        prompts = prompt_ids(args.prompts, args.num_prompts)
        out = (run_llamacpp(gguf, prompts, args.max_new_tokens, args.threads) if engine == "llama.cpp"
               else run_specjax(gguf, method, activations, prompts, args.max_new_tokens))
        print(json.dumps(out))
        return
    if not args.gguf:
        p.error("--gguf: give at least one GGUF file")
    rows = [(g, "llama.cpp", "ar", "-") for g in args.gguf] + [
        (g, "specjax", m, a) for g in args.gguf for a in args.activations for m in args.methods]
    best: dict[tuple, dict] = {}
    for _ in range(args.repeats):
        for gguf, engine, method, activations in rows:
            cmd = [sys.executable, __file__, "--child", json.dumps([engine, gguf, method, activations]),
                   "--prompts", args.prompts, "--num-prompts", str(args.num_prompts),
                   "--max-new-tokens", str(args.max_new_tokens), "--threads", str(args.threads)]
            done = subprocess.run(cmd, capture_output=True, text=True)
            if done.returncode:
                sys.exit(f"{engine} {method} on {gguf} failed:\n{done.stderr[-3000:]}")
            out = json.loads(done.stdout.strip().splitlines()[-1])
            key = (gguf, engine, method, activations)
            if "skipped" in out:
                best[key] = out
                continue
            if key not in best or out["tokens_per_s"] > best[key]["tokens_per_s"]:
                best[key] = out
            print(f"# {engine} {method} {os.path.basename(gguf)} ({activations}): {out['tokens_per_s']:.1f} tokens/s",
                  file=sys.stderr, flush=True)
    print(f"SmolLM2-135M-Instruct, {args.prompts} set ({args.num_prompts} prompts), batch 1, greedy, "
          f"{args.max_new_tokens} new tokens, {args.threads} threads; host: {cpu()}; "
          f"best of {args.repeats} interleaved runs\n")
    fastest_llamacpp = max(best[(g, "llama.cpp", "ar", "-")]["tokens_per_s"] for g in args.gguf)
    print("| weights | engine | method | activations | tokens/s | vs llama.cpp AR, same file "
          "| vs llama.cpp's fastest AR | vs specjax AR, same file and activations | tau | tokens = specjax AR |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for gguf, engine, method, activations in rows:
        out, anchor = best[(gguf, engine, method, activations)], best[(gguf, "llama.cpp", "ar", "-")]
        if "skipped" in out:
            print(f"| {os.path.basename(gguf)} | {engine} | {method} | {activations} | not run: {out['skipped']} |"
                  + " |" * 5)
            continue
        own = best.get((gguf, "specjax", "ar", activations)) if engine == "specjax" else None
        vs_own = f"{out['tokens_per_s'] / own['tokens_per_s']:.2f}x" if own else "-"
        same = ("yes" if out["digest"] == own["digest"] else "**no**") if own else "-"
        print(f"| {os.path.basename(gguf)} | {engine} | {method} | {activations} | {out['tokens_per_s']:.1f} | "
              f"{out['tokens_per_s'] / anchor['tokens_per_s']:.2f}x | "
              f"{out['tokens_per_s'] / fastest_llamacpp:.2f}x | {vs_own} | {out.get('tau', 1.0):.2f} | {same} |")


if __name__ == "__main__":
    main()
