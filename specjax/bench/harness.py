"""The benchmark harness behind `python -m specjax bench`.

Every method decodes the same prompts, whole (ragged lengths), in the model's chat template when
it has one, after a warm-up call that compiles what the timed runs use. A batch holds prompts of
one category, so each call's tau is that category's. Repeats interleave the methods in a fresh
random order each round, so drift in the machine favours none, and medians are reported.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import platform
import random
import resource
import statistics
import sys
import threading
import time
from pathlib import Path

import jax
import numpy as np
from tqdm import tqdm

import specjax as sj
from specjax.adaptive import AdaptiveStats
from specjax.bench.peers import BATCH1_ONLY, PEERS
from specjax.bench.peers import SETTINGS as PEER_SETTINGS
from specjax.drafters.named import NAMED, named_drafter
from specjax.stats import Stats

LOSSY = {"typical"}  # methods whose output is not the target's law are labelled in the table
ADAPTIVE = {"adaptive": ("draft-chain", (0, 1, 2, 4)), "adaptive-draft-chain": ("draft-chain", (0, 1, 2, 4)),
            "adaptive-prompt-lookup": ("prompt-lookup", (0, 1, 2, 4, 8))}  # name -> (base, ks)
DEFAULT_METHODS = (*NAMED, "adaptive-draft-chain", "adaptive-prompt-lookup", *PEERS)
HEAD_FOLDER = "eagle:"  # a method "eagle:FOLDER" drafts with the EAGLE head saved in FOLDER (a trained one)


def known_methods() -> tuple[str, ...]:
    return (*NAMED, *ADAPTIVE, *PEERS)


@dataclasses.dataclass
class BenchConfig:
    model: str = "tiny"
    draft: str = "tiny-draft"
    methods: tuple[str, ...] = DEFAULT_METHODS
    batches: tuple[int, ...] = (1,)
    prompts: str = "stdlib"  # 'stdlib' (held-out code, for the tiny model), 'humaneval', 'chat' or a JSONL file
    num_prompts: int | None = 8  # None: the whole set
    max_new_tokens: int = 128
    repeats: int = 3
    temperature: float = 0.0  # > 0: specjax rows sample (their exact rules); peers run greedy only
    seed: int = 0


def _tokenized_prompts(cfg: BenchConfig, tokenizer) -> list[tuple[str, list[int]]]:
    """(category, token ids) per prompt: a row with turns in the chat template when the
    tokenizer has one, the raw text otherwise."""
    from specjax.bench.prompts import prompt_ids, prompt_set
    return [(r["category"], prompt_ids(tokenizer, r)) for r in prompt_set(cfg.prompts, cfg.num_prompts)]


def _groups(prompts: list[tuple[str, list[int]]], batch: int) -> list[tuple[str, list[list[int]]]]:
    """Batches of `batch` prompts, each of one category; a category's last batch is filled from
    its own first prompts."""
    by_cat = {}
    for cat, ids in prompts:
        by_cat.setdefault(cat, []).append(ids)
    return [(cat, [rows[j % len(rows)] for j in range(i, i + batch)])
            for cat, rows in by_cat.items() for i in range(0, len(rows), batch)]


def machine() -> str:
    dev = jax.devices()[0]
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    text = (f"{platform.machine()} {jax.default_backend()} ({dev.device_kind}), {cores} CPU cores, "
            f"{jax.local_device_count()} device(s), jax {jax.__version__}")
    if "torch" in sys.modules:  # the peer rows ran
        import torch
        import transformers
        text += (f"; peers: torch {torch.__version__} with {torch.get_num_threads()} threads, "
                 f"transformers {transformers.__version__}")
    return text


class _PeakRSS:
    """Peak rise of this process's resident memory while the block runs (sampled every 5 ms)."""

    def __enter__(self):
        self.base = self.peak = _rss()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, daemon=True)
        self._thread.start()
        return self

    def _watch(self):
        while not self._stop.wait(0.005):
            self.peak = max(self.peak, _rss())

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join()
        self.peak = max(self.peak, _rss())
        self.rise_mb = (self.peak - self.base) / 2**20


def _rss() -> int:
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except OSError:  # not Linux: the process peak, an upper bound
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def _device_peak() -> int | None:
    stats = jax.devices()[0].memory_stats()  # None on CPU
    return None if not stats else int(stats.get("peak_bytes_in_use", 0))


class _Method:
    """One row's decoder: `decode(groups) -> list of (tokens int[B, N], stats)`."""

    def __init__(self, name, cfg, model, draft, peers):
        self.name, self.cfg, self.model, self.peers = name, cfg, model, peers
        self.kind = "peer" if name in PEERS else "adaptive" if name in ADAPTIVE else "specjax"
        self.drafter, self.calibrated = None, {}  # calibrated: batch size -> the Adaptive calibrated at it
        if self.kind == "specjax":
            if name.startswith(HEAD_FOLDER):
                from specjax.drafters import Eagle
                self.drafter = Eagle.load(name[len(HEAD_FOLDER):], target=model)
            else:
                self.drafter = named_drafter(name, model, draft)
            self.nodes = 1 if self.drafter is None else self.drafter.num_nodes
            layout = getattr(self.drafter, "layout", None)  # PPD / Hidden Transfer guess positions
            self.nodes = f"{self.nodes}+{layout.size}" if layout is not None else self.nodes
        elif self.kind == "adaptive":
            base, ks = ADAPTIVE[name]
            self.drafter = sj.Adaptive(named_drafter(base, model, draft), ks=ks)
            self.nodes = f"1..{ks[-1] + 1}"
        else:
            self.nodes = "-"

    def supports(self, batch: int) -> bool:
        return self.kind != "peer" or (self.cfg.temperature == 0 and self.peers.supports(self.name, batch))

    def prepare(self, groups) -> None:
        """Per batch size, before the warm-up: adaptive measures its step costs and acceptance here."""
        if isinstance(self.drafter, sj.Adaptive):
            self.calibrated[len(groups[0])] = self.drafter.calibrate(
                self.model, [p for g in groups for p in g], batch_size=len(groups[0]),
                max_new_tokens=self.cfg.max_new_tokens, temperature=self.cfg.temperature)

    def decode(self, groups):
        n, t = self.cfg.max_new_tokens, self.cfg.temperature
        if self.kind == "peer":
            return [self.peers.decode(self.name, g, n) for g in groups]
        keys = [jax.random.key(self.cfg.seed + i) for i in range(len(groups))]
        outs = [sj.generate(self.model, g, max_new_tokens=n, drafter=self.calibrated.get(len(g), self.drafter),
                            temperature=t, key=k) for g, k in zip(groups, keys)]
        return [(o.tokens, o.stats) for o in outs]


def run(cfg: BenchConfig, progress: bool = True) -> list[dict]:
    """Measure every method at every batch size; one row per (method, batch). Peer methods
    that transformers runs at batch 1 only get no row at larger batches (see `skipped`)."""
    from specjax.convert import resolve
    from specjax.tokenizer import load_tokenizer
    unknown = [m for m in cfg.methods if m not in known_methods() and not m.startswith(HEAD_FOLDER)]
    if unknown:
        raise ValueError(f"unknown methods {unknown}; choose from: {', '.join(known_methods())}")
    model = sj.load(cfg.model)
    prompts = _tokenized_prompts(cfg, load_tokenizer(cfg.model))
    methods = ["ar", *dict.fromkeys(m for m in cfg.methods if m != "ar")]
    uses_draft = any(getattr(NAMED.get(m), "uses_draft", False) or ADAPTIVE.get(m, ("",))[0].startswith("draft")
                     or m == "hf-assisted" for m in methods)
    draft_folder = resolve(cfg.draft) if uses_draft else None
    draft = sj.load(draft_folder) if draft_folder is not None else None
    peers = None
    if any(m in PEERS for m in methods):
        from specjax.bench.peers import Peers
        peers = Peers(resolve(cfg.model), draft_folder)
    runners = {m: _Method(m, cfg, model, draft, peers) for m in methods}
    rows = []
    rng = random.Random(cfg.seed)
    for batch in cfg.batches:
        cats, groups = zip(*_groups(prompts, batch))
        here = [m for m in methods if runners[m].supports(batch)]
        for m in here:
            runners[m].prepare(groups)
            runners[m].decode(groups)  # compile / warm up
        walls = {m: [] for m in here}
        last, mem = {}, {}
        bar = tqdm(total=cfg.repeats * len(here), desc=f"bench batch {batch}", disable=not progress)
        for r in range(cfg.repeats):
            for m in rng.sample(here, len(here)):
                dev0 = _device_peak()
                with _PeakRSS() as watch:
                    t0 = time.perf_counter()
                    last[m] = runners[m].decode(groups)
                    walls[m].append(time.perf_counter() - t0)
                if r == 0:  # memory from the first timed (already compiled) run
                    dev1 = _device_peak()
                    mem[m] = ((dev1 - dev0) / 2**20, "device peak rise") if dev0 is not None and \
                        runners[m].kind != "peer" else (watch.rise_mb, "RSS rise")
                bar.update()
        bar.close()
        ar_tps = None
        ar_first = last["ar"][0][0][0]
        for m in here:
            outs = [s for _, s in last[m]]
            new = sum(int(s.new_tokens) for s in outs)
            committed = sum(s.committed_tokens for s in outs)
            steps = sum(s.steps for s in outs)
            tps = new / min(walls[m])  # the least of the repeats: interference only adds time
            ar_tps = tps if m == "ar" else ar_tps
            first = last[m][0][0][0]
            matches = bool(np.array_equal(first, ar_first)) if cfg.temperature == 0 else None  # sampled: apart
            if matches is False:
                print(f"warning: {m} (batch {batch}) differs from specjax ar on the first prompt at token "
                      f"{int(np.argmax(first != ar_first))}", file=sys.stderr)
            row = {
                "method": m, "batch": batch, "kind": runners[m].kind, "tree_nodes": runners[m].nodes,
                "tau": committed / max(steps, 1),
                "acceptance_per_depth": _mean_acceptance(outs) if runners[m].kind != "peer" else [],
                "tokens_per_s": tps, "speedup": tps / ar_tps,
                "verifier": outs[0].verifier, "lossy": m in LOSSY,
                "wall_s_min": min(walls[m]), "wall_s_median": statistics.median(walls[m]), "new_tokens": new,
                "matches_ar_first_prompt": matches,
                "mem_mb": round(mem[m][0], 1), "mem_source": mem[m][1],
                "tau_per_category": _tau_per_category(cats, outs),
            }
            if m in PEERS:
                row["settings"] = PEER_SETTINGS[m]
            if isinstance(outs[0], AdaptiveStats):
                k_counts = {}
                for s in outs:
                    for k, c in s.k_counts.items():
                        k_counts[k] = k_counts.get(k, 0) + c
                raced = outs[0].calibrated_speedup  # nan: no race, the rule predicted no win
                row.update(k_counts=k_counts, speculated=outs[0].speculated,
                           step_costs_ms=[round(c * 1e3, 3) for c in outs[0].costs],
                           calibrated_rates=[round(r, 3) for r in outs[0].rates],
                           calibrated_speedup=None if math.isnan(raced) else round(raced, 3))
            rows.append(row)
    peak_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    for r in rows:
        r["peak_rss_mb"] = round(peak_mb, 1)  # the process's peak: an upper bound per method
    return rows


def skipped(cfg: BenchConfig) -> list[dict]:
    """The (method, batch) pairs `run` leaves out: transformers' rows when sampling (they run
    greedy), and its assisted generation and prompt lookup at batch > 1 (batch 1 only)."""
    if cfg.temperature > 0:
        return [{"method": m, "batch": b, "why": "transformers rows run greedy only"}
                for b in cfg.batches for m in cfg.methods if m in PEERS]
    return [{"method": m, "batch": b, "why": "transformers supports it at batch 1 only"}
            for b in cfg.batches for m in cfg.methods if m in BATCH1_ONLY and b > 1]


def _tau_per_category(cats, stats: list[Stats]) -> dict[str, float]:
    """tau over each category's calls (`cats[i]` is call i's category)."""
    sums = {}
    for cat, s in zip(cats, stats):
        c, n = sums.get(cat, (0, 0))
        sums[cat] = (c + s.committed_tokens, n + s.steps)
    return {cat: c / max(n, 1) for cat, (c, n) in sums.items()}


def _mean_acceptance(stats: list[Stats]) -> list[float]:
    depths = max(len(s.acceptance_per_depth) for s in stats)
    return [float(np.mean([s.acceptance_per_depth[d] for s in stats if d < len(s.acceptance_per_depth)]))
            for d in range(depths)]


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
