"""Medusa heads (Cai et al. 2024): K heads on the target's final normed hidden h_t.

    ResBlock(x) = x + SiLU(x W1 + b1)            (W1 zero-initialised: the block starts as identity)
    head_k(h_t) = ResBlock_k^L(h_t) W2_k          (the L layers of a head share weights, as in Medusa)

Head k (0-indexed) predicts token t+2+k; the target's own LM head predicts t+1.
Params (`PARAMS`): {"w1": [K, E, E], "b1": [K, E], "w2": [K, E, V]} (matrices stored [in, out]).
Without "w2" every head reads the target's own LM head (Medusa's legacy variant), which keeps a
head checkpoint to K (E^2 + E) numbers; with "d2t" it drafts over a reduced vocabulary (`vocab`).
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp

from specjax.heads import vocab
from specjax.models.params import Param, shapes


class Dims(NamedTuple):
    """What the heads' shapes depend on."""

    num_heads: int
    hidden_size: int
    vocab_size: int
    own_lm_head: bool = True


PARAMS = {  # the parameters (specjax.models.params); optional d2t int32[Vd] (`vocab`)
    "w1": Param(lambda d: (d.num_heads, d.hidden_size, d.hidden_size), (None, None, "embed"), "zeros"),
    "b1": Param(lambda d: (d.num_heads, d.hidden_size), (None, None), "zeros"),
    "w2": Param(lambda d: (d.num_heads, d.hidden_size, d.vocab_size), (None, "embed", "vocab"),
                when=lambda d: d.own_lm_head),
}


def init(key: jax.Array, num_heads: int, hidden_size: int, vocab_size: int,
         lm_head: jax.Array | None = None, std: float = 0.02, own_lm_head: bool = True) -> dict:
    """Zero ResBlocks; W2 from the target's LM head [E, V] when given (Medusa's init), else
    normal(0, std); no W2 at all with own_lm_head=False (the heads share the target's)."""
    s = shapes(PARAMS, Dims(num_heads, hidden_size, vocab_size, own_lm_head))
    params = {"w1": jnp.zeros(s["w1"], jnp.float32), "b1": jnp.zeros(s["b1"], jnp.float32)}
    if not own_lm_head:
        return params
    if lm_head is not None:
        w2 = jnp.broadcast_to(jnp.asarray(lm_head, jnp.float32), s["w2"])
    else:
        w2 = std * jax.random.normal(key, s["w2"], jnp.float32)
    return {**params, "w2": jnp.array(w2)}


def features(params: dict, hidden: jax.Array, num_layers: int = 1) -> jax.Array:
    """hidden [..., E] -> each head's ResBlock output [..., K, E]."""
    x = jnp.broadcast_to(hidden[..., None, :], (*hidden.shape[:-1], params["w1"].shape[0], hidden.shape[-1]))
    x = x.astype(jnp.float32)
    for _ in range(num_layers):
        x = x + jax.nn.silu(jnp.einsum("...ke,kef->...kf", x, params["w1"].astype(jnp.float32))
                            + params["b1"].astype(jnp.float32))
    return x


def apply(params: dict, hidden: jax.Array, num_layers: int = 1, lm_head: jax.Array | None = None) -> jax.Array:
    """hidden [..., E] (the target's final normed hidden) -> float32 logits [..., K, V] (V: the
    draft vocabulary, `vocab`). `lm_head` [E, V] (the target's) serves heads without their own "w2"."""
    x = features(params, hidden, num_layers)
    if "w2" not in params:
        return jnp.einsum("...ke,ev->...kv", x, vocab.lm_head(params, lm_head).astype(jnp.float32))
    return jnp.einsum("...ke,kev->...kv", x, params["w2"].astype(jnp.float32))


def num_heads(params: dict) -> int:
    return params["w1"].shape[0]


__all__ = ["PARAMS", "Dims", "init", "apply", "features", "num_heads"]
