"""The training loop: AdamW (warmup + cosine, clipping), a jitted step, periodic eval, logging
and checkpoints. SIGINT/SIGTERM stop the run at a step boundary with a checkpoint; starting
again with the same `out` resumes from the latest checkpoint (step, params, optimizer and
data RNG state), so the resumed run draws the same batches a straight run would. With
`[train] mesh`, the same loop runs over a device mesh (see `init_state`), on one host or many
(every process runs the same command and draws the same batches)."""

from __future__ import annotations

import functools
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
from specjax.train.checkpoint import Checkpointer
from specjax.train.config import Config, OptimConfig, to_dict
from specjax.train.data import WindowSampler, eval_windows, load_streams
from specjax.train.metrics import MetricsLog, plot_curves
from specjax.train.objectives import make_objective
from specjax.train.tokenizer import build_tokenizer


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


@functools.lru_cache(maxsize=8)
def compiled_functions(objective, optim: OptimConfig, total_steps: int, head_dim: int | None = None):
    """(train_step, eval_loss, schedule), jitted once per setting so that repeated runs in one
    process (resume, tests) reuse the compiled step. Under a mesh (`jax.set_mesh`) the step
    returns params and optimizer state in the layout `init_state` gives them."""
    optimizer, schedule = make_optimizer(optim, total_steps)

    @jax.jit
    def train_step(params, opt_state, batch):
        (_, metrics), grads = jax.value_and_grad(objective.loss_fn, has_aux=True)(params, batch)
        updates, opt_state = optimizer.update(grads, opt_state, params)
        metrics["grad_norm"] = optax.tree.norm(grads)
        state = sharding.constrain((optax.apply_updates(params, updates), opt_state), head_dim=head_dim, fsdp=True)
        return *state, metrics

    return train_step, jax.jit(objective.loss_fn), schedule


def init_state(objective, optimizer: optax.GradientTransformation, key: jax.Array, mesh=None,
               head_dim: int | None = None) -> tuple:
    """(params, opt_state); on a `mesh`, built straight into their shards: tensor parallel over
    'model' and FSDP over 'data' (specjax.sharding; `head_dim` keeps attention heads whole)."""
    def init(key):
        params = objective.init(key)
        return params, optimizer.init(params)

    if mesh is None:
        return init(key)
    out = sharding.shardings(jax.eval_shape(init, key), mesh, head_dim=head_dim, fsdp=True)
    return jax.jit(init, out_shardings=out)(key)


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


def evaluate(loss_fn, params, windows: np.ndarray, batch_size: int) -> dict:
    """Mean loss (and perplexity) over windows, in full batches plus one remainder batch."""
    total, count = 0.0, 0
    for i in range(0, len(windows), batch_size):
        chunk = windows[i:i + batch_size]
        loss, _ = loss_fn(params, jnp.asarray(chunk))
        total += float(loss) * len(chunk)
        count += len(chunk)
    loss = total / count
    return {"loss": loss, "ppl": math.exp(loss)}


def train(config: Config, *, resume: bool = False, progress: bool = True,
          stop_after: int | None = None) -> dict:
    """Train per `config`, resuming from `config.train.out` when it holds a checkpoint
    (`resume=True` makes a missing checkpoint an error). `stop_after` leaves after that many
    steps of this call, checkpointed as on SIGTERM. Returns the last train and val metrics."""
    tc = config.train
    out = Path(tc.out)
    out.mkdir(parents=True, exist_ok=True)
    objective = make_objective(tc.objective, config.model, config)
    if not (Path(config.data.tokenizer) / "tokenizer.json").is_file():
        print(f"no tokenizer in {config.data.tokenizer}: training one on the {config.data.corpus} corpus", flush=True)
        build_tokenizer(config.data.tokenizer, config.data.corpus, config.data.held_out, config.model.vocab_size)
    train_stream, val_stream = load_streams(config.data)
    sampler = WindowSampler(train_stream, config.data.seq_len + 1, tc.seed)
    val = eval_windows(val_stream, config.data.seq_len + 1, tc.eval_batches * tc.batch_size)

    mesh = sharding.make_mesh(tc.mesh) if tc.mesh else None
    if mesh is not None and tc.batch_size % mesh.shape[sharding.DATA]:
        raise ValueError(f"batch_size {tc.batch_size} does not split over the mesh's "
                         f"{mesh.shape[sharding.DATA]}-way 'data' axis")
    params, opt_state = init_state(objective, make_optimizer(config.optim, tc.steps)[0],
                                   jax.random.PRNGKey(tc.seed), mesh, config.model.head_dim)
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

    train_step, eval_loss, schedule = compiled_functions(objective, config.optim, tc.steps, config.model.head_dim)

    def save():
        ckpt.save(step, {"params": params, "opt_state": opt_state},
                  {"step": step, "data_rng": sampler.state()})

    def run_eval():
        m = evaluate(eval_loss, params, val, tc.batch_size)
        if hasattr(objective, "evaluate"):  # draft heads: per-head top-1/top-5 accuracy
            m.update(objective.evaluate(params, val, tc.batch_size))
        log.write({"split": "val", "step": step, **m})
        return m

    last_train, last_val = {}, {}
    start_step, tokens_per_step = step, tc.batch_size * config.data.seq_len
    bar = tqdm(total=tc.steps, initial=step, disable=not (progress and primary), dynamic_ncols=True,
               desc=f"{tc.objective} {n_params / 1e6:.2f}M")
    t_last, step_last = time.perf_counter(), step
    with _StopFlag() as stop:
        while step < tc.steps and stop.signum is None:
            batch = sharding.shard_batch(mesh, sampler.next(tc.batch_size))
            with sharding.use_mesh(mesh):  # traced for the mesh: the state keeps its layout
                params, opt_state, metrics = train_step(params, opt_state, batch)
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
    return {"step": step, "train": last_train, "val": last_val, "params": params}
