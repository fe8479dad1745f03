"""The `dparallel` objective: dParallel's certainty-forcing self-distillation (its
`llada_train.py`, `forward_process_semi_ar` and `DLMTrainer.compute_loss`), full fine-tuning of
a masked-diffusion LM on canvases of its own static greedy responses (`[data] corpus` an .npz
of `specjax.train.task_decoding.write_trajectories`).

Per row a block b of the answer slots is drawn (block_size; the last one may be short): the
slots before it stay clean, those after it are all MASK, and the block itself is masked with
probability (1 - eps) mask_ratio + eps by a mask M in one forward and by its complement ~M in a
second. L = CE(M) + CE(~M) (each a plain mean over its masked positions) + entropy_weight *
[H(M) + H(~M)], H the mean entropy of softmax(logits / temperature) over the masked positions
whose argmax is the target ("certainty forcing": only what is already right is sharpened)."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import jax
import jax.numpy as jnp

from specjax.convert import save
from specjax.convert.model_paths import resolve
from specjax.diffusion import key_mask
from specjax.models import Model, ModelConfig, forward
from specjax.train.objectives.base import Objective
from specjax.train.objectives.mdm import EPS, export_tokenizer
from specjax.train.objectives.scoring import token_nll


@dataclasses.dataclass(frozen=True)
class DParallelSettings:
    """[heads] of dparallel (the paper's values, its block of 32 excepted)."""

    target: str  # the teacher, which is fine-tuned: a folder or a shipped name
    block_size: int = 32
    mask_ratio: float = 0.5
    entropy_weight: float = 2.0
    temperature: float = 0.5  # of the entropy's softmax


def block_masks(key: jax.Array, answer: jax.Array, settings: DParallelSettings) -> tuple:
    """(M, ~M, later) bool [B, T]: a random block of each row's answer slots split by a
    Bernoulli mask and its complement, and the answer slots after that block."""
    slot = jnp.cumsum(answer, -1) - 1  # the index among the answer slots
    blocks = -(-answer.sum(-1, keepdims=True) // settings.block_size)
    k_block, k_mask = jax.random.split(key)
    chosen = jax.random.randint(k_block, blocks.shape, 0, blocks)
    block = slot // settings.block_size
    inside, later = answer & (block == chosen), answer & (block > chosen)
    drawn = jax.random.uniform(k_mask, answer.shape) < (1 - EPS) * settings.mask_ratio + EPS
    return inside & drawn, inside & ~drawn, later


def certainty_loss(logits: jax.Array, tokens: jax.Array, masked: jax.Array, temperature: float) -> tuple:
    """(mean CE over `masked`, mean entropy of softmax(logits / temperature) over the masked
    positions whose argmax is the token, their count)."""
    ce = jnp.sum(jnp.where(masked, token_nll(logits, tokens), 0.0)) / jnp.maximum(masked.sum(), 1)
    logp = jax.nn.log_softmax(logits.astype(jnp.float32) / temperature, -1)
    entropy = -(jnp.exp(logp) * logp).sum(-1)
    right = masked & (jnp.argmax(logits, -1) == tokens)
    return ce, jnp.sum(jnp.where(right, entropy, 0.0)) / jnp.maximum(right.sum(), 1), right.sum()


def dparallel(model: ModelConfig, settings: DParallelSettings) -> Objective:
    """Fine-tune the teacher `settings.target` ([model] describes it) on its trajectories; export
    an HF folder with the teacher's tokenizer."""
    if model.mask_token_id is None:
        raise ValueError("dparallel fine-tunes a masked-diffusion LM: set [model] mask_token_id")

    def init(key, target):
        if target.config != model:
            raise ValueError(f"[model] does not describe the teacher {settings.target!r}: {model} vs {target.config}")
        return target.params

    def loss(params, batch, key, target=None):
        tokens, valid = batch["tokens"], batch["valid"]
        m, complement, later = block_masks(key, batch["answer"], settings)
        noisy = jnp.concatenate([jnp.where(m | later, model.mask_token_id, tokens),
                                 jnp.where(complement | later, model.mask_token_id, tokens)])
        both = jnp.concatenate([valid, valid])
        logits = forward(model, params, noisy, tree_mask=key_mask(both, tokens.shape[1])).logits
        b = tokens.shape[0]
        ce, h, right = certainty_loss(logits[:b], tokens, m, settings.temperature)
        ce_c, h_c, right_c = certainty_loss(logits[b:], tokens, complement, settings.temperature)
        value = ce + ce_c + settings.entropy_weight * (h + h_c)
        return value, {"loss": value, "ce": ce + ce_c, "entropy": h + h_c,
                       "accuracy": (right + right_c) / jnp.maximum((m | complement).sum(), 1)}

    def evaluate(params, batch, target=None):
        return {k: v for k, v in loss(params, batch, jax.random.key(0))[1].items() if k != "loss"}

    def export(params, out_dir, target=None, held_out=None):
        save(Model(params, model), str(out_dir), format="hf")
        export_tokenizer(resolve(settings.target), Path(out_dir), model.mask_token_id)

    return Objective(init, loss, evaluate, export)
