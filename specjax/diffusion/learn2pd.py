"""Learn2PD's filter (Bao et al., arXiv 2509.25188): a small MLP over a block's top-1
confidences that says which positions already hold their final token. Trained on the traces of
the "extremely greedy parallel" oracle, which knows the reference answer y* (static decoding's
output) and commits every masked position whose prediction already equals it.

    traces = oracle_traces(model, canvas, reference, gen_length=24, block_length=8)
    params = train_filter(*traces)
    rule = Learn2PD(params, block_length=8)          # specjax.diffusion.rules
"""

from __future__ import annotations

from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import optax

from specjax.diffusion.canvas import Canvas, key_mask
from specjax.diffusion.rules import block_confidences, filter_scores, predict
from specjax.models import Model, forward


def oracle_traces(model: Model, canvas: Canvas, reference: jax.Array, *, gen_length: int,
                  block_length: int) -> tuple[np.ndarray, np.ndarray]:
    """Decode `canvas` block by block with the oracle and record, at every forward, each row's
    block confidences float32[block_length] and whether each position's prediction equals the
    reference (bool[block_length]). reference int32[B, G]: the answer to reach (static
    decoding's). When no masked prediction matches, the most confident masked position gets
    its reference token (the reference code's force-fill), so the decode always ends."""
    config = model.config
    tokens = np.array(canvas.tokens)
    b, t = tokens.shape
    gen_start, mask_id = t - gen_length, config.mask_token_id
    ref = np.concatenate([tokens[:, :gen_start], np.asarray(reference)], axis=1)
    run = jax.jit(lambda tok: predict(forward(config, model.params, tok, tree_mask=key_mask(canvas.valid, t))
                                      .logits.at[..., mask_id].set(-jnp.inf)))
    features, labels = [], []
    for start in range(gen_start, t, block_length):
        block = slice(start, min(start + block_length, t))
        while (tokens[:, block] == mask_id).any():
            pred = jax.tree.map(np.asarray, run(jnp.asarray(tokens)))
            active = (tokens[:, block] == mask_id).any(axis=1)
            conf = np.asarray(block_confidences(jnp.asarray(pred.conf), jnp.full((b,), start), block_length))
            right = np.zeros((b, block_length), bool)
            width = block.stop - block.start
            right[:, :width] = pred.x0[:, block] == ref[:, block]
            features.append(conf[active])
            labels.append(right[active])
            masked = tokens[:, block] == mask_id
            take = masked & right[:, :width]
            stuck = active & ~take.any(axis=1)
            best = np.argmax(np.where(masked, pred.conf[:, block], -1.0), axis=1)
            take[stuck, best[stuck]] = True
            tokens[:, block] = np.where(take, ref[:, block], tokens[:, block])
    return np.concatenate(features), np.concatenate(labels)


def train_filter(features: np.ndarray, labels: np.ndarray, *, layers: int = 2, steps: int = 2000,
                 lr: float = 3e-3, seed: int = 0) -> tuple:
    """Fit the filter (Linear(n, n) -> ReLU -> ... -> Linear(n, n)) by full-batch AdamW on the
    binary cross-entropy of `labels` bool[N, n] given `features` float32[N, n]."""
    n = features.shape[1]
    keys = jax.random.split(jax.random.PRNGKey(seed), layers)
    params = tuple((jax.random.normal(k, (n, n)) / np.sqrt(n), jnp.zeros(n)) for k in keys)
    x, y = jnp.asarray(features, jnp.float32), jnp.asarray(labels, jnp.float32)

    def loss(params):
        h = x
        for i, (w, b) in enumerate(params):
            h = h @ w + b
            if i < len(params) - 1:
                h = jax.nn.relu(h)
        return jnp.mean(optax.sigmoid_binary_cross_entropy(h, y))

    opt = optax.adamw(lr)

    @jax.jit
    def step(params, state):
        value, grads = jax.value_and_grad(loss)(params)
        updates, state = opt.update(grads, state, params)
        return optax.apply_updates(params, updates), state, value

    state = opt.init(params)
    for _ in range(steps):
        params, state, _ = step(params, state)
    return params


def false_positive_rate(params, features: np.ndarray, labels: np.ndarray, accept: float) -> float:
    """Of the positions the filter accepts at `accept`, the share whose prediction is wrong."""
    accepted = np.asarray(filter_scores(params, jnp.asarray(features))) > accept
    return float((accepted & ~labels).sum() / max(accepted.sum(), 1))


def save_filter(params, path: str | Path) -> None:
    np.savez(path, **{f"{name}{i}": np.asarray(a) for i, layer in enumerate(params) for name, a in zip("wb", layer)})


def load_filter(path: str | Path) -> tuple:
    with np.load(path) as f:
        return tuple((jnp.asarray(f[f"w{i}"]), jnp.asarray(f[f"b{i}"])) for i in range(len(f.files) // 2))
