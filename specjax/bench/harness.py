"""The benchmark harness behind `python -m specjax bench`.

Every method decodes the same prompts (cut to the same token length, so each method compiles
once per batch size) after a warm-up call. Repeats interleave the methods in a fresh random
order each round, so drift in the machine favours none, and medians are reported.
"""

from __future__ import annotations

import dataclasses
import json
import platform
import random
import resource
import statistics
import time
from pathlib import Path

import jax
import numpy as np
from tqdm import tqdm

import specjax as sj
from specjax.drafters.named import NAMED, named_drafter

LOSSY = {"typical"}  # methods whose output is not the target's law are labelled in the table


@dataclasses.dataclass
class BenchConfig:
    model: str = "tiny"
    methods: tuple[str, ...] = tuple(NAMED)
    batches: tuple[int, ...] = (1,)
    num_prompts: int = 8
    prompt_tokens: int = 96
    max_new_tokens: int = 128
    repeats: int = 3
    prompts_file: str | None = None
    seed: int = 0


def _tokenized_prompts(cfg: BenchConfig, tokenizer) -> np.ndarray:
    from specjax.bench.prompts import heldout_prompts, load_prompts
    texts = load_prompts(cfg.prompts_file) if cfg.prompts_file else heldout_prompts(cfg.num_prompts)
    ids = [tokenizer.encode(t).ids[-cfg.prompt_tokens:] for t in texts[: cfg.num_prompts]]
    short = [i for i, x in enumerate(ids) if len(x) < cfg.prompt_tokens]
    if short:
        raise ValueError(f"prompts {short} are shorter than prompt_tokens={cfg.prompt_tokens}")
    return np.asarray(ids, np.int32)


def machine() -> str:
    dev = jax.devices()[0]
    return (f"{platform.machine()} {jax.default_backend()} ({dev.device_kind}), "
            f"{jax.local_device_count()} device(s), jax {jax.__version__}")


def run(cfg: BenchConfig, progress: bool = True) -> list[dict]:
    """Measure every method at every batch size; one row per (method, batch)."""
    from tokenizers import Tokenizer

    from specjax.convert import resolve
    folder = resolve(cfg.model)
    model = sj.load(folder)
    prompts = _tokenized_prompts(cfg, Tokenizer.from_file(str(folder / "tokenizer.json")))
    unknown = [m for m in cfg.methods if m not in NAMED]
    if unknown:
        raise ValueError(f"unknown methods {unknown}; choose from: {', '.join(NAMED)}")
    methods = ["ar", *[m for m in cfg.methods if m != "ar"]]
    drafters = {m: named_drafter(m, model) for m in methods}
    rows = []
    rng = random.Random(cfg.seed)
    for batch in cfg.batches:
        groups = [prompts[np.arange(i, i + batch) % len(prompts)] for i in range(0, len(prompts), batch)]

        def decode(method):
            t0 = time.perf_counter()
            outs = [sj.generate(model, g, max_new_tokens=cfg.max_new_tokens, drafter=drafters[method])
                    for g in groups]
            return time.perf_counter() - t0, outs

        for m in methods:
            decode(m)  # compile
        walls = {m: [] for m in methods}
        last = {}
        bar = tqdm(total=cfg.repeats * len(methods), desc=f"bench batch {batch}", disable=not progress)
        for _ in range(cfg.repeats):
            for m in rng.sample(methods, len(methods)):
                wall, last[m] = decode(m)
                walls[m].append(wall)
                bar.update()
        bar.close()
        ar_tps = None
        for m in methods:
            new = sum(int(o.num_tokens.sum()) for o in last[m])
            committed = sum(o.stats["committed_tokens"] for o in last[m])
            steps = sum(o.stats["steps"] for o in last[m])
            tps = new / statistics.median(walls[m])
            ar_tps = tps if m == "ar" else ar_tps
            rows.append({
                "method": m, "batch": batch, "tau": committed / max(steps, 1),
                "acceptance_per_depth": _mean_acceptance([o.stats for o in last[m]]),
                "tokens_per_s": tps, "speedup": tps / ar_tps,
                "verifier": last[m][0].stats["verifier"], "lossy": m in LOSSY,
                "wall_s_median": statistics.median(walls[m]), "new_tokens": new,
            })
    peak_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    for r in rows:
        r["peak_rss_mb"] = round(peak_mb, 1)  # the process's peak: an upper bound per method
    return rows


def _mean_acceptance(stats: list[dict]) -> list[float]:
    depths = max(len(s["acceptance_per_depth"]) for s in stats)
    return [float(np.mean([s["acceptance_per_depth"][d] for s in stats if d < len(s["acceptance_per_depth"])]))
            for d in range(depths)]


def markdown(rows: list[dict]) -> str:
    lines = ["| method | batch | verifier | tau | acceptance by depth | tokens/s | speedup |",
             "|---|---|---|---|---|---|---|"]
    for r in rows:
        acc = " ".join(f"{a:.2f}" for a in r["acceptance_per_depth"][:6]) or "-"
        label = r["method"] + (" (lossy)" if r["lossy"] else "")
        lines.append(f"| {label} | {r['batch']} | {r['verifier']} | {r['tau']:.2f} | {acc} | "
                     f"{r['tokens_per_s']:.1f} | {r['speedup']:.2f}x |")
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
            vals = [next((r[key] for r in rows if r["method"] == m and r["batch"] == b), 0) for m in methods]
            ax.bar(np.arange(len(methods)) + i * width, vals, width, label=f"batch {b}")
        ax.set_xticks(np.arange(len(methods)) + width * (len(batches) - 1) / 2)
        ax.set_xticklabels(methods, rotation=45, ha="right")
        ax.set_title(key)
        ax.axhline(1.0, color="gray", lw=0.8)
        ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def write(rows: list[dict], cfg: BenchConfig, out: Path, command: str) -> None:
    out.mkdir(parents=True, exist_ok=True)
    with open(out / "results.json", "w") as f:
        json.dump({"machine": machine(), "config": dataclasses.asdict(cfg), "command": command,
                   "rows": rows}, f, indent=2)
    (out / "results.md").write_text(f"{markdown(rows)}\n\nMachine: {machine()}\n\nCommand: `{command}`\n")
    try:
        chart(rows, out / "chart.png")
    except ImportError:  # matplotlib is optional (the `train` extra)
        pass
