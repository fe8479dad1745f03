"""The `mdm` objective: LLaDA's masked-diffusion loss (its GUIDELINES.md) for a whole
bidirectional model ([model] mask_token_id), in the form the batch calls for:

- pre-training, on token windows {"tokens" [B, L]}: per row t ~ U(0, 1) and
  p = (1 - eps) t + eps; each token becomes MASK with probability p; the loss is the sum over
  masked positions of CE / p, divided by B * L. One batch in a hundred is cut to a random
  length U[1, L] (the positions after it hidden from attention and out of the loss, L that length).
- SFT, on canvases {"tokens", "valid", "answer"} (`specjax.train.canvas_batches`: the sampling
  layout, left-padded prompt then the answer slots, answer + EOS padding): the same noise on the
  answer slots only; the prompt is never masked and the pads are hidden from attention
  (`specjax.diffusion.key_mask`); the loss is the sum over masked of CE / p / answer_len, over B.

No timestep input (the network is a plain mask predictor)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import jax
import jax.numpy as jnp

from specjax.convert import save
from specjax.diffusion import key_mask
from specjax.models import Model, ModelConfig, forward
from specjax.train.objectives.base import Objective
from specjax.train.objectives.scoring import token_nll

EPS = 1e-3  # the least masking probability
TRUNCATE = 0.01  # the share of pre-training batches cut to a random length
MASK_TOKEN = "<|mdm_mask|>"  # the MASK token's name where export adds it to a tokenizer


def mask_probability(key: jax.Array, rows: int) -> jax.Array:
    """p = (1 - eps) t + eps per row, t ~ U(0, 1): float32 [rows, 1]."""
    return (1 - EPS) * jax.random.uniform(key, (rows, 1)) + EPS


def masked_loss(config: ModelConfig, params, tokens: jax.Array, masked: jax.Array, weight: jax.Array,
                valid: jax.Array) -> tuple[jax.Array, jax.Array]:
    """(sum over the masked positions of weight * CE, their top-1 accuracy): `tokens` with the
    `masked` positions replaced by MASK, the `valid` = False positions hidden from attention."""
    noisy = jnp.where(masked, config.mask_token_id, tokens)
    logits = forward(config, params, noisy, tree_mask=key_mask(valid, tokens.shape[1])).logits
    hit = (jnp.argmax(logits, -1) == tokens) & masked
    acc = hit.sum() / jnp.maximum(masked.sum(), 1)
    return jnp.sum(jnp.where(masked, token_nll(logits, tokens) * weight, 0.0)), acc


def pretrain_noise(key: jax.Array, shape: tuple[int, int]) -> tuple:
    """(masked bool [B, L], p float [B, 1], kept length, valid bool [B, L]) of the pre-training
    form: one batch in a hundred is cut to `kept` < L (valid False after it)."""
    k_t, k_mask, k_cut, k_len = jax.random.split(key, 4)
    p = mask_probability(k_t, shape[0])
    cut = jax.random.uniform(k_cut) < TRUNCATE
    kept = jnp.where(cut, jax.random.randint(k_len, (), 1, shape[1] + 1), shape[1])
    valid = jnp.broadcast_to(jnp.arange(shape[1]) < kept, shape)
    return (jax.random.uniform(k_mask, shape) < p) & valid, p, kept, valid


def sft_noise(key: jax.Array, answer: jax.Array) -> tuple:
    """(masked bool [B, T], p float [B, 1]) of the SFT form: only `answer` slots are masked."""
    k_t, k_mask = jax.random.split(key)
    p = mask_probability(k_t, answer.shape[0])
    return (jax.random.uniform(k_mask, answer.shape) < p) & answer, p


def pretrain_loss(config: ModelConfig, params, tokens: jax.Array, key: jax.Array) -> tuple:
    """LLaDA's pre-training loss of windows `tokens` int32 [B, L] (module docstring)."""
    masked, p, kept, valid = pretrain_noise(key, tokens.shape)
    total, acc = masked_loss(config, params, tokens, masked, 1.0 / p, valid)
    return total / (tokens.shape[0] * kept), acc


def sft_loss(config: ModelConfig, params, batch: dict, key: jax.Array) -> tuple:
    """LLaDA's SFT loss of canvases (module docstring): only the answer slots are noised."""
    tokens, answer = batch["tokens"], batch["answer"]
    masked, p = sft_noise(key, answer)
    answer_len = answer.sum(-1, keepdims=True)
    total, acc = masked_loss(config, params, tokens, masked, 1.0 / (p * answer_len), batch["valid"])
    return total / tokens.shape[0], acc


def mdm(model: ModelConfig, tokenizer: str | Path) -> Objective:
    """Train the masked-diffusion LM `model` from scratch; export an HF folder with
    `tokenizer`'s files (MASK added to tokenizer.json as MASK_TOKEN where it lacks the id)."""
    if model.mask_token_id is None:
        raise ValueError("the mdm objective trains a masked-diffusion LM: set [model] mask_token_id")

    def init(key, target=None):
        return Model.init(model, key).params

    def score(params, batch, key):
        if "answer" in batch:
            return sft_loss(model, params, batch, key)
        return pretrain_loss(model, params, batch["tokens"], key)

    def loss(params, batch, key, target=None):
        value, acc = score(params, batch, key)
        return value, {"loss": value, "accuracy": acc}

    def evaluate(params, batch, target=None):
        return {"accuracy": score(params, batch, jax.random.key(0))[1]}

    def export(params, out_dir, target=None, held_out=None):
        save(Model(params, model), str(out_dir), format="hf")
        export_tokenizer(Path(tokenizer), Path(out_dir), model.mask_token_id)

    return Objective(init, loss, evaluate, export)


def export_tokenizer(source: Path, out_dir: Path, mask_token_id: int) -> None:
    """Copy `source`'s tokenizer files to `out_dir`; a tokenizer.json whose vocabulary ends just
    before `mask_token_id` gets MASK_TOKEN appended as a special token (that id)."""
    from tokenizers import AddedToken, Tokenizer

    if (source / "tokenizer_config.json").is_file():
        shutil.copy(source / "tokenizer_config.json", out_dir / "tokenizer_config.json")
    tok = Tokenizer.from_file(str(source / "tokenizer.json"))
    if tok.id_to_token(mask_token_id) is None:
        if tok.get_vocab_size() != mask_token_id:
            raise ValueError(f"{source}: mask_token_id {mask_token_id} is neither in the tokenizer nor "
                             f"the next id ({tok.get_vocab_size()})")
        tok.add_special_tokens([AddedToken(MASK_TOKEN, special=True, normalized=False)])
    tok.save(str(out_dir / "tokenizer.json"))
    config = out_dir / "tokenizer_config.json"
    if config.is_file():  # name the mask token for transformers
        data = json.loads(config.read_text())
        data["mask_token"] = tok.id_to_token(mask_token_id)
        config.write_text(json.dumps(data, indent=2) + "\n")
