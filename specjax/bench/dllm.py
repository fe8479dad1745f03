"""ParallelBench-style evaluation of a masked-diffusion LM: `python -m specjax bench --dllm MODEL`.

For each task of `specjax.data.parallel_bench`, N seeded examples decode with each named
sampler (`SAMPLERS`); a row per (task, sampler, cache) holds accuracy (the task's `check` on
the decoded output), forwards per example (NFE), tokens per forward and tokens/s (the jit
warm-up excluded). Beside them, the closed-form accuracy of copy / replace_random / shuffle at
k tokens per step (a perfect model sampling each position from its marginal) next to RandomK(k)
(positions drawn at random, as the closed form assumes) and TopK(k) measured the same way
(temperature 1), and TopK(k) greedy. Written to results.json, results.md (one
table per task group) and quality_vs_parallelism.png.

The model must be a masked-diffusion LM (`ModelConfig.mask_token_id`) on parallel_bench's
vocabulary, e.g. the shipped `tiny-dllm-tasks`; `learn2pd.npz` beside its weights (a Learn2PD
filter, `specjax.diffusion.learn2pd.save_filter`) adds the `learn2pd` sampler.
"""

from __future__ import annotations

import dataclasses
import json
import sys
import time
from pathlib import Path
from typing import NamedTuple

import jax
import numpy as np

from specjax.bench.report import machine
from specjax.data import parallel_bench as pb
from specjax.diffusion import Canvas, DiffusionOutput, RandomK, TopK, make_canvas
from specjax.diffusion.named import FILTER_FILE, SAMPLERS, Sampler, filter_of
from specjax.models import Model

CLOSED_FORM_TASKS = ("copy", "replace_random", "shuffle")
CLOSED_FORM_K = (1, 2, 4, 8)
GROUPS = {"deterministic": pb.DETERMINISTIC, "dependent": pb.DEPENDENT}
PLOT = "quality_vs_parallelism.png"


@dataclasses.dataclass(frozen=True)
class DllmConfig:
    model: str
    tasks: tuple[str, ...] = pb.TASKS
    samplers: tuple[str, ...] | None = None  # None: every sampler the model has what it needs for
    num_examples: int = 64
    batch: int = 16
    block: int = 8
    seed: int = 0


class Prepared(NamedTuple):
    """A bench's inputs, read and checked: the model, the samplers by name, the Learn2PD filter
    (None without one)."""

    cfg: DllmConfig
    model: Model
    samplers: dict[str, Sampler]
    filter_params: tuple | None


def prepare(cfg: DllmConfig) -> Prepared:
    """Check the names, load the model and check it is a masked-diffusion LM on parallel_bench's
    vocabulary. Bad input raises ValueError or OSError."""
    from specjax.convert import load, resolve
    unknown = [t for t in cfg.tasks if t not in pb.TASKS]
    if unknown:
        raise ValueError(f"unknown task {unknown[0]!r}; choose from {', '.join(pb.TASKS)}")
    bad = [s for s in cfg.samplers or () if s not in SAMPLERS]
    if bad:
        raise ValueError(f"unknown sampler {bad[0]!r}; choose from {', '.join(SAMPLERS)}")
    folder = resolve(cfg.model)
    model = load(folder)
    c = model.config
    if c.mask_token_id is None:
        raise ValueError(f"{cfg.model} is not a masked-diffusion model (its config has no mask_token_id)")
    if c.mask_token_id != pb.MASK_ID or c.vocab_size < len(pb.VOCAB):
        raise ValueError(f"{cfg.model} is not on parallel_bench's vocabulary (mask id {c.mask_token_id}, "
                         f"vocab {c.vocab_size}; need mask id {pb.MASK_ID}, vocab >= {len(pb.VOCAB)})")
    has_filter = (folder / FILTER_FILE).is_file()
    if cfg.samplers and "learn2pd" in cfg.samplers and not has_filter:
        raise ValueError(f"the learn2pd sampler needs a filter at {folder / FILTER_FILE}")
    names = cfg.samplers or tuple(n for n, s in SAMPLERS.items() if has_filter or not s.learn2pd)
    filter_params = filter_of(folder) if any(SAMPLERS[n].learn2pd for n in names) else None
    return Prepared(cfg, model, {n: SAMPLERS[n] for n in dict.fromkeys(names)}, filter_params)


def examples(task: str, n: int, seed: int = 0) -> list[pb.Example]:
    """The task's first n examples from a generator seeded by (seed, the task's index in TASKS):
    the same whichever other tasks run."""
    rng = np.random.default_rng((seed, pb.TASKS.index(task)))
    return [pb.sample(task, rng) for _ in range(n)]


def canvases(exs: list[pb.Example], batch: int, width: int) -> list[tuple[Canvas, int]]:
    """(canvas, real rows) per batch of `batch` examples, prompts left-padded to `width` so
    every canvas has one shape (one compile per sampler); a short last batch repeats its
    first prompt."""
    out = []
    for i in range(0, len(exs), batch):
        prompts = [pb.encode(e)[0] for e in exs[i:i + batch]]
        real = len(prompts)
        prompts += [prompts[0]] * (batch - real)
        out.append((make_canvas(prompts, pb.GEN_LENGTH, pb.MASK_ID, pb.PAD_ID, prompt_width=width), real))
    return out


def block_of(prep: Prepared, sampler: Sampler) -> int:
    """A sampler's block length: --block, or the Learn2PD filter's (the block it was trained on)."""
    return sampler.block_length(prep.cfg.block, prep.filter_params)


def decode(prep: Prepared, sampler: Sampler, canvas: Canvas, cache: str | None = None, *,
           temperature: float = 0.0, key: jax.Array | None = None) -> DiffusionOutput:
    # The answers hold no separator (lists of names, digits, grid cells), so the only boundary a
    # block can end at is the answer's end: AdaBlock's delimiter is EOS (`<sep>` is in prompts only).
    return sampler.run(prep.model, canvas, gen_length=pb.GEN_LENGTH, block=prep.cfg.block, eos_id=pb.EOS_ID,
                       delimiters=(pb.EOS_ID,), filter_params=prep.filter_params, cache=cache,
                       temperature=temperature, key=key)


def _run(prep, sampler, batches, cache=None, temperature=0.0, seed=0, warmed=None):
    """(tokens int[N, G], nfe int[N], seconds) over the batches' real rows. Unless `warmed`
    (a set of what has run already) holds it, a first call compiles outside the timing."""
    keys = [jax.random.PRNGKey(seed + i) for i in range(len(batches))]
    if warmed is None or (sampler, cache) not in warmed:
        jax.block_until_ready(decode(prep, sampler, batches[0][0], cache, temperature=temperature, key=keys[0]))
        if warmed is not None:
            warmed.add((sampler, cache))
    tokens, nfe, seconds = [], [], 0.0
    for (canvas, real), key in zip(batches, keys):
        start = time.perf_counter()
        out = jax.block_until_ready(decode(prep, sampler, canvas, cache, temperature=temperature, key=key))
        seconds += time.perf_counter() - start
        tokens.append(np.asarray(out.tokens)[:real])
        nfe.append(np.asarray(out.nfe)[:real])
    return np.concatenate(tokens), np.concatenate(nfe), seconds


def measure(prep: Prepared, progress: bool = True) -> tuple[list[dict], list[dict]]:
    """(rows: one per task, sampler and cache; closed: one per closed-form task and k)."""
    cfg = prep.cfg
    per_task = {t: examples(t, cfg.num_examples, cfg.seed) for t in cfg.tasks}
    width = max(len(e.prompt) for exs in per_task.values() for e in exs)
    static = SAMPLERS["static"]
    rows, closed, warmed = [], [], set()  # canvases share one shape: a sampler compiles once
    for task, exs in per_task.items():
        batches = canvases(exs, cfg.batch, width)
        answer_tokens = sum(len(e.answer) for e in exs)
        reference = None  # static decoding's tokens, FreeDave's check
        for name, sampler in prep.samplers.items():
            for cache in sampler.caches:
                tokens, nfe, seconds = _run(prep, sampler, batches, cache, warmed=warmed)
                row = {"task": task, "sampler": name, "cache": cache, "block": block_of(prep, sampler),
                       "examples": len(exs), "accuracy": pb.accuracy(exs, tokens),
                       "nfe_mean": float(nfe.mean()), "nfe_total": int(nfe.sum()), "answer_tokens": answer_tokens,
                       "tokens_per_forward": len(exs) * pb.GEN_LENGTH / nfe.sum(),
                       "answer_tokens_per_forward": answer_tokens / nfe.sum(), "seconds": seconds,
                       "tokens_per_s": len(exs) * pb.GEN_LENGTH / seconds, "eos_exit": sampler.eos_exit}
                if name == "static" and cache is None:
                    reference = tokens
                if sampler.drafts:
                    if reference is None:
                        reference = _run(prep, static, batches, warmed=warmed)[0]
                    row["mismatches_vs_static"] = int(np.sum(np.any(tokens != reference, axis=-1)))
                rows.append(row)
                if progress:
                    print(f"{task:>15} {name:>14} {cache or '-':>5}: accuracy {row['accuracy']:.3f}, "
                          f"{row['tokens_per_forward']:.2f} tokens/forward, {row['tokens_per_s']:.0f} tokens/s",
                          file=sys.stderr, flush=True)
        if task in CLOSED_FORM_TASKS:
            closed += _closed_form(prep, task, exs, batches, rows, warmed)
    return rows, closed


def _closed_form(prep, task, exs, batches, rows, warmed) -> list[dict]:
    """Per k: the closed form averaged over the examples' answer lengths n; TopK(k) and RandomK(k)
    (the positions the closed form assumes: drawn whatever the predictions) sampled at
    temperature 1, with their standard errors; TopK(k) greedy (from the rows, when that sampler
    ran)."""
    greedy = {r["sampler"]: r["accuracy"] for r in rows if r["task"] == task and r["cache"] is None}
    se = lambda a: float(np.sqrt(a * (1 - a) / len(exs)))
    n, block = [len(e.answer) for e in exs], block_of(prep, SAMPLERS["static"])
    out = []
    for k in CLOSED_FORM_K:
        tokens, nfe, _ = _run(prep, Sampler("sampled", TopK(k)), batches, temperature=1.0,
                              seed=prep.cfg.seed + 1000 * k, warmed=warmed)
        sampled = pb.accuracy(exs, tokens)
        drawn = pb.accuracy(exs, _run(prep, Sampler("random order", RandomK(k)), batches, temperature=1.0,
                                      seed=prep.cfg.seed + 1000 * k + 500, warmed=warmed)[0])
        out.append({"task": task, "k": k, "n_mean": float(np.mean(n)), "n": n,
                    "closed_form": float(np.mean([pb.closed_form_accuracy(task, m, k) for m in n])),
                    "closed_form_random_order": float(np.mean([pb.random_order_accuracy(task, m, k, block=block)
                                                               for m in n])),
                    "sampled": sampled, "sampled_se": se(sampled), "random_order": drawn, "random_order_se": se(drawn),
                    "greedy": greedy.get("static" if k == 1 else f"topk-{k}"),
                    "answer_tokens_per_forward": sum(n) / nfe.sum()})
    one, one_se = out[0]["random_order"], out[0]["random_order_se"]   # CLOSED_FORM_K starts at 1
    for c in out:   # relative to one token per step: a perfect model's curve scaled to this model
        drawn = c["random_order"]
        relative = drawn / one if one else float("nan")
        c["random_order_relative"] = relative
        c["random_order_relative_se"] = (relative * float(np.hypot(c["random_order_se"] / drawn, one_se / one))
                                         if c["k"] > 1 and one and drawn else 0.0)
    return out


def groups(rows: list[dict]) -> list[dict]:
    """Per task group and (sampler, cache): accuracy averaged over the group's tasks, NFE per
    example, tokens per forward and tokens/s over all its examples."""
    out = []
    for group, tasks in GROUPS.items():
        mine = [r for r in rows if r["task"] in tasks]
        for key in dict.fromkeys((r["sampler"], r["cache"]) for r in mine):
            rs = [r for r in mine if (r["sampler"], r["cache"]) == key]
            n, forwards = sum(r["examples"] for r in rs), sum(r["nfe_total"] for r in rs)
            g = {"group": group, "sampler": key[0], "cache": key[1], "block": rs[0]["block"],
                 "tasks": [r["task"] for r in rs], "accuracy": float(np.mean([r["accuracy"] for r in rs])),
                 "accuracy_per_task": {r["task"]: r["accuracy"] for r in rs}, "nfe_mean": forwards / n,
                 "tokens_per_forward": n * pb.GEN_LENGTH / forwards,
                 "answer_tokens_per_forward": sum(r["answer_tokens"] for r in rs) / forwards,
                 "tokens_per_s": n * pb.GEN_LENGTH / sum(r["seconds"] for r in rs)}
            if "mismatches_vs_static" in rs[0]:
                g["mismatches_vs_static"] = sum(r["mismatches_vs_static"] for r in rs)
            out.append(g)
    return out


def mismatches(rows: list[dict]) -> str:
    """A loud line when FreeDave's tokens differ from static decoding's anywhere; '' otherwise."""
    bad = [r for r in rows if r.get("mismatches_vs_static")]
    if not bad:
        return ""
    where = ", ".join(f"{r['sampler']} on {r['task']}: {r['mismatches_vs_static']}" for r in bad)
    return f"**FREEDAVE DIFFERS FROM STATIC DECODING** (examples whose tokens differ: {where})"


def markdown(rows: list[dict], closed: list[dict]) -> str:
    lines = []
    for group, tasks in GROUPS.items():
        gs = [g for g in groups(rows) if g["group"] == group]
        if not gs:
            continue
        ran = [t for t in tasks if t in gs[0]["accuracy_per_task"]]
        lines += [f"### {group} tasks", "",
                  "| sampler | cache | block | accuracy | NFE | tokens/forward | answer tokens/forward | tokens/s | "
                  "= static | " + " | ".join(ran) + " |", "|---" * (9 + len(ran)) + "|"]
        for g in gs:
            same = "-" if "mismatches_vs_static" not in g else (
                "yes" if g["mismatches_vs_static"] == 0 else f"NO ({g['mismatches_vs_static']})")
            lines.append(f"| {g['sampler']} | {g['cache'] or '-'} | {g['block']} | {g['accuracy']:.3f} | "
                         f"{g['nfe_mean']:.2f} | {g['tokens_per_forward']:.2f} | {g['answer_tokens_per_forward']:.2f} "
                         f"| {g['tokens_per_s']:.0f} | {same} | "
                         + " | ".join(f"{g['accuracy_per_task'][t]:.2f}" for t in ran) + " |")
        lines.append("")
    if closed:
        lines += ["### closed form vs measured (k tokens per step)", "",
                  "| task | k | mean n | closed form | closed form, RandomK(k)'s steps | RandomK(k), temperature 1 "
                  "| RandomK(k) / RandomK(1) | TopK(k), temperature 1 | TopK(k), greedy | answer tokens/forward |",
                  "|---|---|---|---|---|---|---|---|---|---|"]
        for c in closed:
            greedy = "-" if c["greedy"] is None else f"{c['greedy']:.3f}"
            lines.append(f"| {c['task']} | {c['k']} | {c['n_mean']:.2f} | {c['closed_form']:.3f} | "
                         f"{c['closed_form_random_order']:.3f} | {c['random_order']:.3f} ± {c['random_order_se']:.3f} | "
                         f"{c['random_order_relative']:.3f} ± {c['random_order_relative_se']:.3f} | "
                         f"{c['sampled']:.3f} ± {c['sampled_se']:.3f} | {greedy} | "
                         f"{c['answer_tokens_per_forward']:.2f} |")
        lines.append("")
    return "\n".join(lines)


def plot(rows: list[dict], closed: list[dict], path: Path) -> None:
    """Accuracy vs tokens per forward, one point per sampler (and cache), a panel per task
    group; a last panel with the closed-form curves and TopK(k) measured."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    gs = groups(rows)
    present = [g for g in GROUPS if any(x["group"] == g for x in gs)]
    panels = len(present) + bool(closed)
    fig, axes = plt.subplots(1, panels, figsize=(6 * panels, 4.5), squeeze=False)
    colors, markers = plt.get_cmap("tab20").colors, "osD^vP*X<>h"
    for ax, group in zip(axes[0], present):
        for i, g in enumerate(x for x in gs if x["group"] == group):
            ax.scatter(g["tokens_per_forward"], g["accuracy"], color=colors[i % 20], marker=markers[i % len(markers)],
                       label=g["sampler"] + (f" ({g['cache']} cache)" if g["cache"] else ""))
        ax.set(title=f"{group} tasks", xlabel="tokens per forward (of the canvas's slots)", ylabel="accuracy",
               ylim=(-0.05, 1.05))
        _log2(ax)
        ax.legend(fontsize=6, ncol=2)
    if closed:
        ax = axes[0][-1]
        for task in dict.fromkeys(c["task"] for c in closed):
            cs = [c for c in closed if c["task"] == task]
            ks = [c["k"] for c in cs]
            line, = ax.plot(ks, [c["closed_form"] for c in cs], label=f"{task}: closed form")
            ax.plot(ks, [c["closed_form_random_order"] for c in cs], "--", color=line.get_color(),
                    label=f"{task}: closed form, RandomK(k)'s steps")
            ax.errorbar(ks, [c["random_order_relative"] for c in cs], yerr=[c["random_order_relative_se"] for c in cs],
                        fmt="s", color=line.get_color(), label=f"{task}: RandomK(k) / RandomK(1), temperature 1")
            ax.errorbar(ks, [c["sampled"] for c in cs], yerr=[c["sampled_se"] for c in cs], fmt="o", mfc="none",
                        color=line.get_color(), label=f"{task}: TopK(k), temperature 1")
        ax.set(title="closed form vs measured", xlabel="tokens per step k", ylabel="accuracy", ylim=(-0.05, 1.05))
        _log2(ax)
        ax.legend(fontsize=6, loc="upper center", bbox_to_anchor=(0.5, -0.2), ncol=2)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _log2(ax) -> None:
    """A log2 x axis labelled 1, 2, 4, ... and a light grid."""
    from matplotlib.ticker import FuncFormatter, LogLocator, NullLocator
    ax.set_xscale("log", base=2)
    ax.xaxis.set_major_locator(LogLocator(base=2))
    ax.xaxis.set_major_formatter(FuncFormatter(lambda x, _: f"{x:g}"))
    ax.xaxis.set_minor_locator(NullLocator())
    ax.grid(alpha=0.3)


NOTES = [
    "accuracy: ParallelBench's metric on the output decoded up to its first EOS (exact match for the "
    "deterministic tasks and sudoku; validity for shuffle, the random operations, latin_square, pair); "
    "a group's accuracy is the mean over its tasks.",
    f"NFE: forwards per example decoded alone (a FreeDave forward runs its drafts as one batch). "
    f"tokens/forward = {pb.GEN_LENGTH} canvas slots (answer and EOS padding) / NFE; answer tokens/forward "
    f"counts the reference answer's tokens only; both are totals over the examples (slots / forwards).",
    "tokens/s: canvas slots per second of wall time, each sampler's first (compiling) call excluded; "
    "batches of --batch examples, greedy.",
    "= static: FreeDave's tokens equal static decoding's (TopK(1), no cache, same blocks) on every example.",
    "eos_exit (learn2pd only, its end-of-text prediction): once EOS is committed the rest of the row is EOS; "
    "every other sampler decodes all slots.",
    "closed form: a perfect model committing k answer positions per step, each sampled from its marginal "
    "(`parallel_bench.closed_form_accuracy`), averaged over the examples' answer lengths n. RandomK(k)'s "
    "steps draw k of the block's open slots at random, EOS slots included, so a step takes fewer answer "
    "positions; its closed form is the expectation over which (`parallel_bench.random_order_accuracy`). "
    "Measured at temperature 1 (± binomial standard error): RandomK(k), the same relative to RandomK(1) "
    "(the closed form starts from a perfect model's 1; this model's own one-per-step accuracy is RandomK(1)), "
    "and TopK(k), whose positions are the most confident (EOS first, usually), and TopK(k) greedy.",
]


def write(prep: Prepared, rows: list[dict], closed: list[dict], out: Path, command: str) -> None:
    out.mkdir(parents=True, exist_ok=True)
    info = machine()
    with open(out / "results.json", "w") as f:
        json.dump({"machine": info, "command": command, "config": dataclasses.asdict(prep.cfg),
                   "samplers": {n: s.description for n, s in prep.samplers.items()}, "rows": rows,
                   "groups": groups(rows), "closed_form": closed, "notes": NOTES}, f, indent=2)
    loud = mismatches(rows) and f"{mismatches(rows)}\n\n"
    c = prep.cfg
    setup = (f"{c.num_examples} examples per task (seed {c.seed}), {c.batch} per canvas, blocks of {c.block} "
             f"of the {pb.GEN_LENGTH} slots")
    (out / "results.md").write_text(f"Machine: {info}\n\nCommand: `{command}`\n\n{setup}\n\n{loud}"
                                    f"{markdown(rows, closed)}\n"
                                    f"![quality vs parallelism]({PLOT})\n\n" + "\n".join(f"- {n}" for n in NOTES)
                                    + "\n")
    try:
        plot(rows, closed, out / PLOT)
    except ImportError:  # matplotlib is optional (the `train` extra)
        pass


def listing() -> str:
    return "\n".join(f"{n}: {s.description}" for n, s in SAMPLERS.items())
