"""The benchmark's report: results.json, results.md (a markdown table with the machine, the
command and the notes) and chart.png, from the rows `harness.run` measures."""

from __future__ import annotations

import dataclasses
import json
import os
import platform
import sys
from pathlib import Path

import jax
import numpy as np

from specjax.bench.harness import BenchConfig


def cpu() -> str:
    """The CPU's model and the vector extensions the CPU kernels build for (hosts of one
    machine kind differ: only figures taken on one host compare)."""
    model, flags = platform.processor() or platform.machine(), set()
    try:
        for line in open("/proc/cpuinfo"):
            key, _, value = line.partition(":")
            if key.strip() == "model name":
                model = value.strip()
            elif key.strip() == "flags":
                flags = set(value.split())
    except OSError:
        pass
    vector = [f for f in ("avx2", "fma", "avx512f", "avx512bw", "avx512_vnni", "avx_vnni") if f in flags]
    return f"{model} ({' '.join(vector) or 'no AVX2'})"


def machine() -> str:
    dev = jax.devices()[0]
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    kernels = "on" if os.environ.get("SPECJAX_CPU_KERNELS", "1") != "0" else "off"
    if kernels == "on" and os.environ.get("SPECJAX_CPU_KERNEL_FLAGS"):
        kernels += f" (built with {os.environ['SPECJAX_CPU_KERNEL_FLAGS']})"
    text = (f"{platform.machine()} {jax.default_backend()} ({dev.device_kind}), {cpu()}, {cores} CPU "
            f"cores, {jax.local_device_count()} device(s), jax {jax.__version__}, CPU kernels {kernels}")
    if "torch" in sys.modules:  # the peer rows ran
        import torch
        import transformers
        text += (f"; peers: torch {torch.__version__} with {torch.get_num_threads()} threads, "
                 f"transformers {transformers.__version__}")
    return text


def caveat(cfg: BenchConfig) -> str:
    """A warning for runs too small to measure speed by (as --quick is); '' otherwise."""
    if cfg.max_new_tokens >= 64 and (cfg.num_prompts or 4) >= 4 and cfg.repeats >= 3:
        return ""
    return (f"**Not representative:** {cfg.max_new_tokens} new tokens x {cfg.num_prompts} prompts x "
            f"{cfg.repeats} repeat(s) is a smoke test; prefill and timer noise dominate the speedups. "
            f"Measure without --quick (128 new tokens x 8 prompts x 3 repeats).")


def markdown(rows: list[dict], skipped_rows: list[dict] = ()) -> str:
    lines = ["| method | batch | tree nodes | verifier | tau | acceptance by depth | tokens/s | speedup | "
             "mem (MB) | = ar |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        acc = " ".join(f"{a:.2f}" for a in r["acceptance_per_depth"][:6]) or "-"
        label = r["method"] + (" (lossy)" if r["lossy"] else "")
        tau = "-" if r["tau"] is None else f"{r['tau']:.2f}"
        lines.append(f"| {label} | {r['batch']} | {r.get('tree_nodes', '-')} | {r['verifier']} | {tau} | {acc} | "
                     f"{r['tokens_per_s']:.1f} | {r['speedup']:.2f}x | {r.get('mem_mb', '-')} | "
                     f"{ {True: 'yes', False: 'NO', None: '-'}[r.get('matches_ar_first_prompt', True)]} |")
    for s in skipped_rows:
        lines.append(f"| {s['method']} | {s['batch']} | skipped: {s['why']} | | | | | | | |")
    cats = list(dict.fromkeys(c for r in rows for c in r.get("tau_per_category", {})))
    if len(cats) > 1:
        lines += ["", "tau per category:", "", f"| method | batch | {' | '.join(cats)} |",
                  "|---|---|" + "---|" * len(cats)]
        lines += [f"| {r['method']} | {r['batch']} | " + " | ".join(
            f"{r['tau_per_category'][c]:.2f}" if c in r["tau_per_category"] else "-" for c in cats) + " |"
            for r in rows]
    return "\n".join(lines)


def chart(rows: list[dict], path: Path) -> None:
    """Speedup and tau per method, one group of bars per batch size."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    batches = sorted({r["batch"] for r in rows})
    methods = list(dict.fromkeys(r["method"] for r in rows))
    fig, axes = plt.subplots(1, 2, figsize=(12, 4))
    width = 0.8 / len(batches)
    for ax, key in zip(axes, ("speedup", "tau")):
        for i, b in enumerate(batches):
            vals = [next((r[key] or 0 for r in rows if r["method"] == m and r["batch"] == b), 0)
                    for m in methods]
            ax.bar(np.arange(len(methods)) + i * width, vals, width, label=f"batch {b}")
        ax.set_xticks(np.arange(len(methods)) + width * (len(batches) - 1) / 2)
        ax.set_xticklabels(methods, rotation=45, ha="right")
        ax.set_title(key)
        ax.axhline(1.0, color="gray", lw=0.8)
        ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def write(rows: list[dict], cfg: BenchConfig, out: Path, command: str, skipped_rows: list[dict] = ()) -> None:
    out.mkdir(parents=True, exist_ok=True)
    with open(out / "results.json", "w") as f:
        json.dump({"machine": machine(), "config": dataclasses.asdict(cfg), "command": command,
                   "rows": rows, "skipped": list(skipped_rows), "notes": NOTES}, f, indent=2)
    warning = caveat(cfg) and f"{caveat(cfg)}\n\n"
    (out / "results.md").write_text(f"{warning}{markdown(rows, skipped_rows)}\n\nMachine: {machine()}\n\n"
                                    f"Command: `{command}`\n\n" + "\n".join(f"- {n}" for n in NOTES) + "\n")
    try:
        chart(rows, out / "chart.png")
    except ImportError:  # matplotlib is optional (the `train` extra)
        pass


NOTES = [
    "tau = tokens per target forward, bonus included (peers: new tokens / forward calls of the "
    "transformers target, counted by a hook, the prefill forward included).",
    "speedup = tokens/s over specjax `ar` at the same batch, same run; the least wall time of the interleaved repeats (interference on a shared machine only adds time; medians are in results.json).",
    "Every prompt decodes exactly max_new_tokens tokens, EOS ignored (specjax and transformers alike), so "
    "every method does the same work; the tokens after an EOS are still the model's greedy (or sampled) text.",
    "Prompts are whole (ragged lengths), in the model's chat template when it has one (multi-turn chat rows: "
    "both user turns with the set's fixed reply between them), raw text otherwise; a batch holds one "
    "category's prompts (a category with fewer than the batch repeats its own), and tau_per_category is "
    "tau over each category's calls.",
    "mem = rise of the process RSS during the method's first timed (already compiled) run, sampled "
    "every 5 ms (device peak-bytes rise on accelerators): approximate, since memory the allocator "
    "kept from earlier methods is reused; peak_rss_mb in results.json is the whole process's peak.",
    "= ar: the method's greedy output on the first prompt equals specjax ar's token for token ('-' when sampling: "
    "each method draws its own random stream; exactness is tested by chi-square instead).",
    "adaptive-*: speculation length chosen by goodput (SmartSpec) from step costs (step_costs_ms, per k) "
    "and per-depth acceptance (calibrated_rates) measured on the prompts per batch size before the run; "
    "where no k > 0 beats AR by 10%, or the loop lost a race with AR then (calibrated_speedup), it runs "
    "AR's own program (speculated: false), else k is re-chosen every 8 steps from moving-average rates; "
    "k_counts = steps per k.",
]
