"""A trained masked-diffusion LM on the tasks' prompts: the static decoder at one token per
forward (each step commits the most confident MASK slot, LLaDA's low-confidence remasking at
k = 1), exact match per task (the shipped tiny dLLMs' evaluation), and the trajectory file
of a teacher's own responses that `dparallel` trains on. `respond` is any such decoder:
(model, tokens, valid, gen_length) -> the answer slots int32 [B, G]."""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Callable, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from specjax.diffusion import key_mask
from specjax.models import Model, forward
from specjax.train.canvas_batches import answer_slots, prompt_canvas, save, task_bench

Respond = Callable[[Model, jax.Array, jax.Array, int], jax.Array]
CHUNK = 256  # rows decoded per call


@functools.partial(jax.jit, static_argnames="gen_length")
def one_per_step(model: Model, tokens: jax.Array, valid: jax.Array, gen_length: int) -> jax.Array:
    """The last `gen_length` slots of `tokens` (MASK there) filled in `gen_length` forwards, the
    most confident still-masked slot each time, with its argmax (MASK itself never predicted)."""
    cfg, t = model.config, tokens.shape[1]
    mask, rows = key_mask(valid, t), jnp.arange(tokens.shape[0])

    def step(_, x):
        logits = forward(cfg, model.params, x, tree_mask=mask).logits[:, t - gen_length:].astype(jnp.float32)
        logits = logits.at[..., cfg.mask_token_id].set(-jnp.inf)
        slots = x[:, t - gen_length:]
        confidence = jnp.where(slots == cfg.mask_token_id, jax.nn.softmax(logits).max(-1), -jnp.inf)
        pick = jnp.argmax(confidence, -1)
        slots = slots.at[rows, pick].set(jnp.argmax(logits[rows, pick], -1).astype(slots.dtype))
        return x.at[:, t - gen_length:].set(slots)

    return jax.lax.fori_loop(0, gen_length, step, tokens)[:, t - gen_length:]


def respond_all(model: Model, prompts: Sequence[Sequence[int]], width: int, bench,
                respond: Respond = one_per_step) -> tuple[np.ndarray, np.ndarray]:
    """(tokens, valid) [N, width]: the prompts' canvases with `respond`'s answers, CHUNK rows a call."""
    tokens, valid = prompt_canvas(prompts, width, bench.GEN_LENGTH, bench.MASK_ID, bench.PAD_ID)
    for i in range(0, len(tokens), CHUNK):
        out = respond(model, jnp.asarray(tokens[i:i + CHUNK]), jnp.asarray(valid[i:i + CHUNK]), bench.GEN_LENGTH)
        tokens[i:i + CHUNK, width - bench.GEN_LENGTH:] = np.asarray(out)
    return tokens, valid


def task_accuracy(model: Model, tasks: Sequence[str], count: int, width: int, seed: int = 0, bench=None,
                  respond: Respond = one_per_step) -> dict[str, float]:
    """Per task, the share of `count` fresh examples (seeded per task) whose decoded answer
    passes the task's check (exact match, or validity for the tasks with many answers)."""
    bench = bench or task_bench()
    scores = {}
    for i, task in enumerate(tasks or bench.TASKS):
        rng = np.random.Generator(np.random.PCG64([seed, i]))
        examples = [bench.sample(task, rng) for _ in range(count)]
        tokens, _ = respond_all(model, [bench.encode(e)[0] for e in examples], width, bench, respond)
        outputs = [bench.decode(row[width - bench.GEN_LENGTH:].tolist()) for row in tokens]
        scores[task] = float(np.mean([bench.check(e, o) for e, o in zip(examples, outputs)]))
    return scores


def write_trajectories(path: str | Path, model: Model, tasks: Sequence[str], count: int, width: int,
                       seed: int = 0, bench=None, respond: Respond = one_per_step) -> None:
    """Save `count` canvases of fresh task prompts (a task drawn uniformly per row) with the
    model's own `respond` answers in the answer slots: dParallel's distillation data."""
    bench = bench or task_bench()
    tasks = tuple(tasks or bench.TASKS)
    rng = np.random.Generator(np.random.PCG64(seed))
    prompts = [bench.encode(bench.sample(tasks[rng.integers(len(tasks))], rng))[0] for _ in range(count)]
    tokens, valid = respond_all(model, prompts, width, bench, respond)
    save(path, {"tokens": tokens, "valid": valid, "answer": answer_slots(tokens.shape, bench.GEN_LENGTH)})
