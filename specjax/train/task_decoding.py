"""The file of a teacher's own answers to fresh task prompts that `dparallel` trains on, decoded
by `respond`: (model, tokens, valid, gen_length) -> the answer slots int32 [B, G]; by default
static greedy decoding, one token per forward (`specjax.diffusion`, TopK(1)), the trajectory
dParallel's teacher follows."""

from __future__ import annotations

from pathlib import Path
from typing import Callable, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from specjax.diffusion import Canvas, TopK, generate
from specjax.models import Model
from specjax.train.canvas_batches import answer_slots, prompt_canvas, save, task_bench

Respond = Callable[[Model, jax.Array, jax.Array, int], jax.Array]
CHUNK = 256  # rows decoded per call


def static_greedy(model: Model, tokens: jax.Array, valid: jax.Array, gen_length: int) -> jax.Array:
    """LLaDA's static decoding over one block: the most confident MASK slot each forward."""
    return generate(model, Canvas(tokens, valid), gen_length=gen_length, blocks=gen_length, rule=TopK(1)).tokens


def respond_all(model: Model, prompts: Sequence[Sequence[int]], width: int, bench,
                respond: Respond = static_greedy) -> tuple[np.ndarray, np.ndarray]:
    """(tokens, valid) [N, width]: the prompts' canvases with `respond`'s answers, CHUNK rows a call."""
    tokens, valid = prompt_canvas(prompts, width, bench.GEN_LENGTH, bench.MASK_ID, bench.PAD_ID)
    for i in range(0, len(tokens), CHUNK):
        out = respond(model, jnp.asarray(tokens[i:i + CHUNK]), jnp.asarray(valid[i:i + CHUNK]), bench.GEN_LENGTH)
        tokens[i:i + CHUNK, width - bench.GEN_LENGTH:] = np.asarray(out)
    return tokens, valid


def write_trajectories(path: str | Path, model: Model, tasks: Sequence[str], count: int, width: int,
                       seed: int = 0, bench=None, respond: Respond = static_greedy) -> None:
    """Save `count` canvases of fresh task prompts (a task drawn uniformly per row) with the
    model's own `respond` answers in the answer slots: dParallel's distillation data."""
    bench = bench or task_bench()
    tasks = tuple(tasks or bench.TASKS)
    rng = np.random.Generator(np.random.PCG64(seed))
    prompts = [bench.encode(bench.sample(tasks[rng.integers(len(tasks))], rng))[0] for _ in range(count)]
    tokens, valid = respond_all(model, prompts, width, bench, respond)
    save(path, {"tokens": tokens, "valid": valid, "answer": answer_slots(tokens.shape, bench.GEN_LENGTH)})
