"""The benchmark harness behind `python -m specjax bench`.

Every method decodes the same prompts, whole (ragged lengths), in the model's chat template when
it has one, after a warm-up call that compiles what the timed runs use. A batch holds prompts of
one category, so each call's tau is that category's. Repeats interleave the methods in a fresh
random order each round, so drift in the machine favours none, and medians are reported.
The files it writes: `specjax.bench.report`.
"""

from __future__ import annotations

import dataclasses
import math
import os
import random
import resource
import statistics
import sys
import threading
import time
from typing import NamedTuple

import jax
import numpy as np
from tqdm import tqdm

from specjax import cli, decoding, memory, methods
from specjax.convert import load
from specjax.decoding import generate
from specjax.stats import Stats

LOSSY = {"typical"}  # methods whose output is not the target's law are labelled in the table
# every method the bench runs, by default all with a plain name (`name:ARGUMENT` ones on request)
DEFAULT_METHODS = tuple(u for u, m in methods.METHODS.items() if "constraint" not in m.needs and not m.argument)


def _check_methods(names) -> None:
    """Raise for a name that is no method the bench runs."""
    for name in names:
        try:
            m, _ = methods.find(name)
        except ValueError:
            m = None
        if m is None or "constraint" in m.needs:
            raise ValueError(f"unknown methods {[name]}; choose from: "
                             f"{', '.join(u for u, m in methods.METHODS.items() if 'constraint' not in m.needs)}")


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
    int8_activations: bool = False  # a quantized model's matmuls take int8 activations (sj.quantize_activations)


def _tokenized_prompts(rows: list[dict], tokenizer) -> list[tuple[str, list[int]]]:
    """(category, token ids) per prompt row: a row with turns in the chat template when the
    tokenizer has one, the raw text otherwise."""
    from specjax.data.chat import prompt_ids
    return [(r["category"], prompt_ids(tokenizer, r)) for r in rows]


def _groups(prompts: list[tuple[str, list[int]]], batch: int) -> list[tuple[str, list[list[int]]]]:
    """Batches of `batch` prompts, each of one category; a category's last batch is filled from
    its own first prompts."""
    by_cat = {}
    for cat, ids in prompts:
        by_cat.setdefault(cat, []).append(ids)
    return [(cat, [rows[j % len(rows)] for j in range(i, i + batch)])
            for cat, rows in by_cat.items() for i in range(0, len(rows), batch)]


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
        self.method, _ = methods.find(name)
        self.kind = self.method.runner
        self.drafter, self.calibrated = None, {}  # calibrated: batch size -> the Adaptive calibrated at it
        if self.kind == "drafter":
            self.drafter = methods.make(name, model, draft)
            self.nodes = 1 if self.drafter is None else self.drafter.num_nodes
            layout = getattr(self.drafter, "layout", None)  # PPD / Hidden Transfer guess positions
            self.nodes = f"{self.nodes}+{layout.size}" if layout is not None else self.nodes
        elif self.kind == "adaptive":
            self.drafter = methods.make(name, model, draft)
            self.nodes = f"1..{self.drafter.ks[-1] + 1}"
        else:
            self.nodes = "-"

    def supports(self, batch: int) -> bool:
        return self.kind != "peer" or (self.cfg.temperature == 0 and self.peers.supports(self.name, batch))

    def prepare(self, groups) -> None:
        """Per batch size, before the warm-up: adaptive measures its step costs and acceptance here."""
        if self.kind == "adaptive":
            self.calibrated[len(groups[0])] = self.drafter.calibrate(
                self.model, [p for g in groups for p in g], batch_size=len(groups[0]),
                max_new_tokens=self.cfg.max_new_tokens, temperature=self.cfg.temperature)

    def decode(self, groups):
        n, t = self.cfg.max_new_tokens, self.cfg.temperature
        if self.kind == "peer":
            return [self.peers.decode(self.name, g, n) for g in groups]
        keys = [jax.random.key(self.cfg.seed + i) for i in range(len(groups))]
        outs = [generate(self.model, g, max_new_tokens=n, drafter=self.calibrated.get(len(g), self.drafter),
                            temperature=t, key=k) for g, k in zip(groups, keys)]
        return [(o.tokens, o.stats) for o in outs]


class Prepared(NamedTuple):
    """A bench's inputs, read and checked: (category, token ids) per prompt and each method's
    decoder, AR first."""

    cfg: BenchConfig
    prompts: list[tuple[str, list[int]]]
    runners: dict[str, _Method]


def prepare(cfg: BenchConfig) -> Prepared:
    """Read and check everything `run` needs before it measures anything: the method names,
    the prompt set, the models, each method against the target, the context and the memory at
    each batch size. Bad input raises ValueError or OSError (FileNotFoundError for a missing
    file)."""
    from specjax.convert import resolve
    from specjax.data.prompts import prompt_set
    from specjax.tokenizer import load_tokenizer
    _check_methods(cfg.methods)
    rows = prompt_set(cfg.prompts, cfg.num_prompts)
    model = load(cfg.model)
    if cfg.int8_activations:
        model = cli.int8_activations(model, cfg.model)
    prompts = _tokenized_prompts(rows, load_tokenizer(cfg.model))
    names = ["ar", *dict.fromkeys(m for m in cfg.methods if m != "ar")]
    uses_draft = any("draft model" in methods.find(m)[0].needs for m in names)
    draft_folder = resolve(cfg.draft) if uses_draft else None
    draft = load(draft_folder) if draft_folder is not None else None
    peers = None
    if any(methods.find(m)[0].runner == "peer" for m in names):
        from specjax.bench.peers import Peers
        peers = Peers(resolve(cfg.model), draft_folder)
    runners = {m: _Method(m, cfg, model, draft, peers) for m in names}
    _check_fits(model, runners.values(), max(len(ids) for _, ids in prompts), cfg)
    return Prepared(cfg, prompts, runners)


def _check_fits(model, runners, longest: int, cfg: BenchConfig) -> None:
    """Raise ValueError when a method's longest prompt and new tokens overflow the context, or
    one of its batches the memory (an adaptive method counted as its base drafter)."""
    for runner in runners:
        if runner.kind == "peer":
            continue
        drafter = runner.drafter.base if runner.kind == "adaptive" else runner.drafter
        p = decoding.plan(model.config, model, longest, drafter, decoding.Request(cfg.max_new_tokens,
                          temperature=cfg.temperature), bucketed=True)
        for b in cfg.batches:
            memory.check(model, p, b, compiled_rows=decoding.batch_bucket(b))


def run(cfg: BenchConfig, progress: bool = True) -> list[dict]:
    """Measure every method at every batch size; one row per (method, batch). Peer methods
    that transformers runs at batch 1 only get no row at larger batches (see `skipped`)."""
    return measure(prepare(cfg), progress)


def measure(prepared: Prepared, progress: bool = True) -> list[dict]:
    """`run` on inputs `prepare` has read and checked."""
    cfg, prompts, runners = prepared
    names = list(runners)
    rows = []
    rng = random.Random(cfg.seed)
    for batch in cfg.batches:
        cats, groups = zip(*_groups(prompts, batch))
        here = [m for m in names if runners[m].supports(batch)]
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
            if runners[m].kind == "peer":
                row["settings"] = runners[m].method.description
            if runners[m].kind == "adaptive":
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
    peers = {u: m for u, m in ((u, methods.find(u)[0]) for u in cfg.methods) if m.runner == "peer"}
    if cfg.temperature > 0:
        return [{"method": u, "batch": b, "why": "transformers rows run greedy only"}
                for b in cfg.batches for u in peers]
    return [{"method": u, "batch": b, "why": f"transformers supports it at batch {m.max_batch} only"}
            for b in cfg.batches for u, m in peers.items() if b > (m.max_batch or b)]


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
