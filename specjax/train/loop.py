"""The training loop: AdamW (warmup + cosine, clipping), a jitted step, periodic eval, logging
and checkpoints. SIGINT/SIGTERM stop the run at a step boundary with a checkpoint; starting
again with the same `out` resumes from the latest checkpoint (step, params, optimizer and
data RNG state), so the resumed run draws the same batches a straight run would. With
`[train] mesh`, the same loop runs over a device mesh (see `init_state`), on one host or many
(every process runs the same command and draws the same batches)."""

from __future__ import annotations

import json
import math
import os
import signal
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import optax
from tqdm import tqdm

from specjax import sharding
from specjax.train.bpe import build_tokenizer
from specjax.train.metrics import MetricsLog, plot_curves
from specjax.train.objectives import Objective, make_objective
from specjax.train.canvas_batches import CanvasFile, TaskBatches
from specjax.train.run_config import TASKS, Config, OptimConfig, to_dict
from specjax.train.run_state import Checkpointer
from specjax.train.target import load_target
from specjax.train.token_windows import WindowSampler, eval_windows, load_streams


def make_optimizer(cfg: OptimConfig, total_steps: int) -> tuple[optax.GradientTransformation, optax.Schedule]:
    """(optimizer, lr schedule): clip by global norm, then AdamW (decay on matrices only) on a
    warmup + cosine schedule."""
    schedule = optax.warmup_cosine_decay_schedule(
        init_value=0.0, peak_value=cfg.lr, warmup_steps=min(cfg.warmup_steps, total_steps - 1),
        decay_steps=max(total_steps, 1), end_value=cfg.lr * cfg.min_lr_ratio)
    return optax.chain(
        optax.clip_by_global_norm(cfg.grad_clip),
        optax.adamw(schedule, b1=cfg.b1, b2=cfg.b2, weight_decay=cfg.weight_decay,
                    mask=lambda p: jax.tree.map(lambda x: x.ndim >= 2, p)),
    ), schedule


def step_function(objective: Objective, optimizer: optax.GradientTransformation, seed: int,
                  head_dim: int | None = None):
    """The jitted train step (params, opt_state, batch, step, target) -> (params, opt_state,
    metrics); the loss's key is folded from `seed` and the step, so a resumed run draws the same
    keys. Under a mesh (`jax.set_mesh`) it returns params and optimizer state in the layout
    `init_state` gives them."""

    @jax.jit
    def train_step(params, opt_state, batch, step, target):
        key = jax.random.fold_in(jax.random.key(seed), step)
        (_, metrics), grads = jax.value_and_grad(objective.loss, has_aux=True)(params, batch, key, target)
        updates, opt_state = optimizer.update(grads, opt_state, params)
        metrics["grad_norm"] = optax.tree.norm(grads)
        state = sharding.constrain((optax.apply_updates(params, updates), opt_state), head_dim=head_dim, fsdp=True)
        return *state, metrics

    return train_step


def score_function(objective: Objective, seed: int):
    """The jitted held-out score of one batch: (params, batch, target) -> (loss, metrics)."""

    @jax.jit
    def score(params, batch, target):
        loss, _ = objective.loss(params, batch, jax.random.key(seed), target)
        return loss, objective.evaluate(params, batch, target)

    return score


def init_state(objective: Objective, optimizer: optax.GradientTransformation, key: jax.Array, target=None,
               mesh=None, head_dim: int | None = None) -> tuple:
    """(params, opt_state); on a `mesh`, built straight into their shards: tensor parallel over
    'model' and FSDP over 'data' (specjax.sharding; `head_dim` keeps attention heads whole)."""
    def init(key, target):
        params = objective.init(key, target)
        return params, optimizer.init(params)

    if mesh is None:
        return init(key, target)
    out = sharding.shardings(jax.eval_shape(init, key, target), mesh, head_dim=head_dim, fsdp=True)
    return jax.jit(init, out_shardings=out)(key, target)


class _StopFlag:
    """Turns SIGINT/SIGTERM into a flag checked between steps (never mid-update)."""

    def __init__(self):
        self.signum = None

    def __enter__(self):
        self.previous = {s: signal.signal(s, self._handle) for s in (signal.SIGINT, signal.SIGTERM)}
        return self

    def _handle(self, signum, frame):
        self.signum = signum

    def __exit__(self, *exc):
        for s, h in self.previous.items():
            signal.signal(s, h)


def data_source(config: Config, objective: Objective):
    """(sampler, held-out windows): token windows of the corpus, feature windows of the cache
    [data] features names (the layers `objective.feature_layers` reads), or canvases of the
    tasks or of an .npz (`canvas_batches`), each a batch dict (`sampler.next(batch_size)`)."""
    dc, tc = config.data, config.train
    length, count = dc.seq_len + 1, tc.eval_batches * tc.batch_size
    if dc.features:
        if objective.feature_layers is None:
            raise ValueError(f"the {tc.objective} objective trains on token windows, not on a feature "
                             f"cache ([data] features)")
        from specjax.train.feature_windows import FeatureWindows

        sampler = FeatureWindows(dc.features, objective.feature_layers(config.model), length, tc.seed)
        return sampler, sampler.held_out(count)
    if dc.corpus == TASKS:
        sampler = TaskBatches(dc.tasks, dc.seq_len, tc.seed)
        if config.model.mask_token_id != sampler.bench.MASK_ID:
            raise ValueError(f"[model] mask_token_id must be the tasks' MASK id {sampler.bench.MASK_ID}")
        if not (Path(dc.tokenizer) / "tokenizer.json").is_file():  # the tasks' word-level tokenizer
            Path(dc.tokenizer).mkdir(parents=True, exist_ok=True)
            sampler.bench.tokenizer().save(str(Path(dc.tokenizer) / "tokenizer.json"))
        return sampler, sampler.held_out(count)
    if dc.corpus.endswith(".npz"):
        sampler = CanvasFile(dc.corpus, dc.seq_len, tc.seed, count)
        return sampler, sampler.held_out()
    if not (Path(dc.tokenizer) / "tokenizer.json").is_file():
        print(f"no tokenizer in {dc.tokenizer}: training one on the {dc.corpus} corpus", flush=True)
        build_tokenizer(dc.tokenizer, dc.corpus, dc.held_out, config.model.vocab_size)
    train_stream, val_stream = load_streams(dc)
    return WindowSampler(train_stream, length, tc.seed), {"tokens": eval_windows(val_stream, length, count)}


def held_out(score, params, windows: np.ndarray | dict, batch_size: int, target=None) -> dict:
    """Mean loss, perplexity and the objective's held-out metrics (`score_function`) over
    windows (tokens, or a batch dict), in full batches plus one remainder batch."""
    windows = windows if isinstance(windows, dict) else {"tokens": windows}
    sums, count = {}, 0
    for i in range(0, len(windows["tokens"]), batch_size):
        chunk = {k: jnp.asarray(v[i:i + batch_size]) for k, v in windows.items()}
        n = len(chunk["tokens"])
        loss, metrics = jax.device_get(score(params, chunk, target))
        for k, v in {"loss": loss, **metrics}.items():
            sums[k] = sums.get(k, 0.0) + np.asarray(v, np.float64) * n
        count += n
    out = {k: (v / count).tolist() for k, v in sums.items()}
    return {**out, "ppl": math.exp(out["loss"])}


def train(config: Config, *, resume: bool = False, progress: bool = True,
          stop_after: int | None = None) -> dict:
    """Train per `config`, resuming from `config.train.out` when it holds a checkpoint
    (`resume=True` makes a missing checkpoint an error). `stop_after` leaves after that many
    steps of this call, checkpointed as on SIGTERM. Returns the last train and val metrics, and
    the signal that stopped the run (None when it ran its steps)."""
    tc = config.train
    out = Path(tc.out)
    out.mkdir(parents=True, exist_ok=True)
    objective, target = make_objective(config), load_target(config)
    sampler, val = data_source(config, objective)

    mesh = sharding.make_mesh(tc.mesh) if tc.mesh else None
    if mesh is not None and tc.batch_size % mesh.shape[sharding.DATA]:
        raise ValueError(f"batch_size {tc.batch_size} does not split over the mesh's "
                         f"{mesh.shape[sharding.DATA]}-way 'data' axis")
    if mesh is not None and target is not None:  # the frozen target, laid out once over the mesh
        target = sharding.shard(target, mesh, head_dim=config.model.head_dim)
    optimizer, schedule = make_optimizer(config.optim, tc.steps)
    params, opt_state = init_state(objective, optimizer, jax.random.PRNGKey(tc.seed), target, mesh,
                                   config.model.head_dim)
    ckpt = Checkpointer(out / "checkpoints", keep=tc.keep_checkpoints)
    step = 0
    if ckpt.latest_step() is not None:
        state, meta = ckpt.restore({"params": params, "opt_state": opt_state})
        params, opt_state, step = state["params"], state["opt_state"], int(meta["step"])
        sampler.set_state(meta["data_rng"])
    elif resume:
        raise FileNotFoundError(f"--resume: no checkpoint in {out / 'checkpoints'}")
    (out / "config.json").write_text(json.dumps(to_dict(config), indent=2) + "\n")
    primary = jax.process_index() == 0  # the other processes of a multi-host run log nothing
    log = MetricsLog(out / "metrics.jsonl" if primary else os.devnull)
    if step and primary:
        log.truncate(step)
        print(f"resumed from step {step} of {tc.steps} ({out / 'checkpoints'})", flush=True)
    n_params = sum(x.size for x in jax.tree.leaves(params))

    train_step = step_function(objective, optimizer, tc.seed, config.model.head_dim)
    score = score_function(objective, tc.seed)

    def save():
        ckpt.save(step, {"params": params, "opt_state": opt_state},
                  {"step": step, "data_rng": sampler.state()})

    def run_eval():
        m = held_out(score, params, val, tc.batch_size, target)  # draft heads: per-head accuracies too
        log.write({"split": "val", "step": step, **m})
        return m

    last_train, last_val = {}, {}
    start_step, tokens_per_step = step, tc.batch_size * config.data.seq_len
    bar = tqdm(total=tc.steps, initial=step, disable=not (progress and primary), dynamic_ncols=True,
               desc=f"{tc.objective} {n_params / 1e6:.2f}M")
    t_last, step_last = time.perf_counter(), step
    with _StopFlag() as stop:
        while step < tc.steps and stop.signum is None:
            drawn = sampler.next(tc.batch_size)
            batch = {k: sharding.shard_batch(mesh, v) for k, v in
                     (drawn if isinstance(drawn, dict) else {"tokens": drawn}).items()}
            with sharding.use_mesh(mesh):  # traced for the mesh: the state keeps its layout
                params, opt_state, metrics = train_step(params, opt_state, batch, step, target)
            step += 1
            bar.update(1)
            if step % tc.log_every == 0 or step == tc.steps:
                metrics = {k: float(v) for k, v in jax.device_get(metrics).items()}
                now = time.perf_counter()
                tps = tokens_per_step * (step - step_last) / (now - t_last)
                t_last, step_last = now, step
                last_train = {**metrics, "lr": float(schedule(step - 1)), "tokens_per_s": tps}
                log.write({"split": "train", "step": step, "time": time.time(), **last_train})
                bar.set_postfix(loss=f"{metrics['loss']:.3f}", tok_s=f"{tps:.0f}")
            if step % tc.eval_every == 0 or step == tc.steps:
                last_val = run_eval()
                bar.write(f"step {step}: val loss {last_val['loss']:.4f} ppl {last_val['ppl']:.2f}")
                t_last = time.perf_counter()  # eval time is not training throughput
            if step % tc.save_every == 0 or step == tc.steps:
                save()
            if stop_after is not None and step - start_step >= stop_after:
                break
        save()
    bar.close()
    ckpt.close()
    if stop.signum is not None:
        print(f"stopped by signal {stop.signum} at step {step}; checkpoint saved in {out}")
    if step == tc.steps and primary:
        plot_curves(out / "metrics.jsonl", out / "curve.png", title=f"{out.name} ({n_params / 1e6:.2f}M params)")
    return {"step": step, "train": last_train, "val": last_val, "params": params, "signal": stop.signum}
