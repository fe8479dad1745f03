"""Clover draft heads (Xiao et al. 2024, Clover and Clover-2): sequentially dependent heads on
the target's hidden states, as Clover-2's released code builds them (`XiaoBin1992/clover`,
`clover/model/clover2.py`; Clover-1's code is not public, so where the papers differ this
follows Clover-2).

Entry t reads l_t, the output of the target's last decoder layer (before the final norm), and
e(x_{t+1}), the embedding of the next token:
    h_t = ResAttn_1(l_t, e(x_{t+1}))                   the attention decoder
    h_t = clover_norm(Block(h_t))                      the Augmenting Block: `num_layers` Llama
                                                       decoder layers, causal over the sequence
    head 0:   o_0 = head_norm(W_mlp h_t + b)           predicts x_{t+2}
    head i>0: s_i = ResAttn_2(s_{i-1}, e(y_i)),  s_0 = h_t,  y_i the token after head i-1's
              (x_{t+1+i} in training, the drafted token in a tree)
              o_i = head_norm(W_mlp2 [s_i; e(y_i)] + b2)       predicts x_{t+2+i}
    logits_i = the target's frozen LM head (o_i)
    ResAttn(x, y) = x + concat_h cos(q_h, k_h) v_h,  q = W_q norm(x) + b_q, k = W_k y + b_k,
                    v = W_v y + b_v, in H = the target's attention heads of size E / H (a
                    per-head gate at the same position: no attention over the sequence)
Heads i > 0 share their weights (an RNN cell), so the head unrolls to any depth.

Init (as the code): the block's layers are copies of the target's last layer, clover_norm and
head_norm of its final norm; W_q, W_k, W_mlp = I + U(0, 0.01); W_v = U(0, 0.01); W_mlp2 =
U(0, 0.01) plus I on its hidden half; biases 0; the ResAttn input norms 1.

Deviations: the token embedding is the target's input embedding (Clover's code copies the LM
head matrix into a frozen embedding table; its README suggests the input embedding to save that
memory; for tied targets the two are the same); the block attends to the whole prefix (no
sliding window even for Mistral targets).

Params (`PARAMS`, matrices [in, out]): rnn1, rnn2 {norm, wq, bq, wk, bk, wv, bv}; block (the
target's layer params, stacked on a leading axis of num_layers); norm, head_norm; w_mlp, b_mlp,
w_mlp2 [2E, E], b_mlp2.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp

from specjax.layout import portable_layout
from specjax.models import KVCache, ModelConfig, RopeScaling
from specjax.models.llama import (
    attention_block,
    dense,
    mlp_block,
    rms_norm,
    rope_inv_freq,
    rope_tables,
)
from specjax.models.params import LAYER as LLAMA_LAYER
from specjax.models.params import Param, Stacked, shapes


@dataclasses.dataclass(frozen=True)
class CloverConfig:
    """Static shape of a Clover head. `block`: the Augmenting Block as a ModelConfig (the
    target's, with num_layers = the block's layers, float32, no sliding window); its attention
    heads also split the ResAttn gates. `target_num_layers`: the target's depth (the head reads
    its last layer). `num_heads`: the heads trained (head 0 and num_heads - 1 RNN steps), the
    depth of the default tree."""

    block: ModelConfig
    target_num_layers: int
    num_heads: int = 5

    def __post_init__(self):
        e, h = self.block.hidden_size, self.block.num_heads
        if e % h:
            raise ValueError(f"Clover's ResAttn gates split the hidden size {e} into {h} heads: it "
                             f"must be a multiple of num_heads")
        if self.target_num_layers < 1 or self.num_heads < 1:
            raise ValueError(f"target_num_layers and num_heads must be >= 1, got "
                             f"{self.target_num_layers}, {self.num_heads}")

    @property
    def hidden_size(self) -> int:
        return self.block.hidden_size

    @property
    def vocab_size(self) -> int:
        return self.block.vocab_size

    @classmethod
    def for_target(cls, target: ModelConfig, num_layers: int = 2, num_heads: int = 5) -> CloverConfig:
        block = dataclasses.replace(target, num_layers=num_layers, dtype="float32", sliding_window=None)
        return cls(block, target.num_layers, num_heads)

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> CloverConfig:
        unknown = set(d) - {f.name for f in dataclasses.fields(cls)}
        if unknown:
            raise ValueError(f"unknown Clover config key(s): {', '.join(sorted(unknown))}")
        block = dict(d["block"])
        if block.get("rope_scaling"):
            block["rope_scaling"] = RopeScaling(**block["rope_scaling"])
        return cls(**{**d, "block": ModelConfig(**block)})


def _e(c: CloverConfig) -> tuple[int]:
    return (c.hidden_size,)


def _square(c: CloverConfig) -> tuple[int, int]:
    return (c.hidden_size, c.hidden_size)


RES_ATTENTION = {  # a ResAttn gate: q from the normed x, k and v from y, in the block's heads
    "norm": Param(_e, (None,), "norm"),
    "wq": Param(_square, ("embed", "q_heads")), "bq": Param(_e, ("q_heads",), "zeros"),
    "wk": Param(_square, ("embed", "kv_heads")), "bk": Param(_e, ("kv_heads",), "zeros"),
    "wv": Param(_square, ("embed", "kv_heads")), "bv": Param(_e, ("kv_heads",), "zeros"),
}
PARAMS = {  # the parameters (specjax.models.params)
    "rnn1": RES_ATTENTION, "rnn2": RES_ATTENTION,
    "block": Stacked(LLAMA_LAYER, count=lambda c: c.block.num_layers, config_of=lambda c: c.block),
    "norm": Param(_e, (None,), "norm"), "head_norm": Param(_e, (None,), "norm"),
    "w_mlp": Param(_square, (None, None)), "b_mlp": Param(_e, (None,), "zeros"),
    "w_mlp2": Param(lambda c: (2 * c.hidden_size, c.hidden_size), (None, None)),
    "b_mlp2": Param(_e, (None,), "zeros"),
}


def param_shapes(cfg: CloverConfig) -> dict:
    return shapes(PARAMS, cfg)


def init(cfg: CloverConfig, key: jax.Array, target_params: dict) -> dict:
    """Clover-2's init (module docstring) from the target's params."""
    e, n = cfg.hidden_size, cfg.block.num_layers
    k_rnn1, k_rnn2, k_mlp, k_mlp2 = jax.random.split(key, 4)
    small = lambda k, shape: jax.random.uniform(k, shape, jnp.float32, 0.0, 0.01)
    eye = jnp.eye(e, dtype=jnp.float32)

    def rnn(k):
        kq, kk, kv = jax.random.split(k, 3)
        zero = jnp.zeros((e,), jnp.float32)
        return {"norm": jnp.ones((e,), jnp.float32), "wq": eye + small(kq, (e, e)), "bq": zero,
                "wk": eye + small(kk, (e, e)), "bk": zero, "wv": small(kv, (e, e)), "bv": zero}

    last = cfg.target_num_layers - 1
    block = jax.tree.map(lambda a: jnp.broadcast_to(jnp.asarray(a[last], jnp.float32), (n, *a.shape[1:])),
                         portable_layout(target_params["layers"]))
    final_norm = jnp.asarray(target_params["norm"], jnp.float32)
    return {"rnn1": rnn(k_rnn1), "rnn2": rnn(k_rnn2), "block": block, "norm": final_norm,
            "head_norm": final_norm, "w_mlp": eye + small(k_mlp, (e, e)), "b_mlp": jnp.zeros((e,), jnp.float32),
            "w_mlp2": small(k_mlp2, (2 * e, e)).at[:e].add(eye), "b_mlp2": jnp.zeros((e,), jnp.float32)}


def init_cache(cfg: CloverConfig, batch: int, max_len: int) -> KVCache:
    return KVCache.init(cfg.block, batch, max_len, jnp.float32)


# ---- the pieces ----------------------------------------------------------------------------------

def res_attention(p: dict, x: jax.Array, y: jax.Array, num_heads: int, eps: float) -> jax.Array:
    """ResAttentionBlock: x + concat_h cos(q_h, k_h) v_h (q from norm(x), k and v from y)."""
    q = dense(rms_norm(x, p["norm"], eps), p["wq"]) + p["bq"]
    k, v = dense(y, p["wk"]) + p["bk"], dense(y, p["wv"]) + p["bv"]
    split = lambda a: a.reshape(*a.shape[:-1], num_heads, -1)
    q, k, v = split(q), split(k), split(v)
    norm = lambda a: jnp.sqrt(jnp.maximum((a * a).sum(-1), eps * eps))  # max(|a|, eps), finite gradient at 0
    gate = (q * k).sum(-1) / (norm(q) * norm(k))  # [..., H]
    return x + (gate[..., None] * v).reshape(x.shape)


def block(cfg: CloverConfig, params: dict, hidden: jax.Array, emb: jax.Array, positions: jax.Array,
          mask: jax.Array, cache: KVCache | None = None) -> tuple[jax.Array, jax.Array, jax.Array]:
    """The attention decoder and the Augmenting Block on T entries: hidden [B,T,E] the target's
    last-layer outputs, emb [B,T,E] the next tokens' embeddings, at positions int[B,T]; they see
    the cache's committed slots and the new entries `mask` bool[B,T,T] allows. Returns (h
    [B,T,E] after clover_norm, k_new, v_new [L,B,T,KV,hd])."""
    c = cfg.block
    x = res_attention(params["rnn1"], hidden.astype(jnp.float32), emb, c.num_heads, c.rms_norm_eps)
    if cache is None:
        cache = init_cache(cfg, x.shape[0], 0)
    rope = rope_tables(positions, rope_inv_freq(c))
    ks, vs = [], []
    for i in range(c.num_layers):
        lp = {name: w[i] for name, w in params["block"].items()}
        a, k, v = attention_block(c, lp, rms_norm(x, lp["attn_norm"], c.rms_norm_eps), positions, mask,
                                   cache.k[i], cache.v[i], cache.lengths, rope)
        x = x + a
        x = x + mlp_block(lp, rms_norm(x, lp["mlp_norm"], c.rms_norm_eps))
        ks.append(k)
        vs.append(v)
    return rms_norm(x, params["norm"], c.rms_norm_eps), jnp.stack(ks), jnp.stack(vs)


def first_head(cfg: CloverConfig, params: dict, h: jax.Array) -> jax.Array:
    """Head 0's output o_0 [..., E] from the block's h."""
    return rms_norm(dense(h, params["w_mlp"]) + params["b_mlp"], params["head_norm"], cfg.block.rms_norm_eps)


def next_head(cfg: CloverConfig, params: dict, state: jax.Array, emb: jax.Array) -> tuple[jax.Array, jax.Array]:
    """One RNN step (head i > 0): the previous state s_{i-1} and the embedding of the token
    chosen under it -> (o_i, s_i), [..., E] each."""
    eps = cfg.block.rms_norm_eps
    state = res_attention(params["rnn2"], state, emb, cfg.block.num_heads, eps)
    out = dense(jnp.concatenate([state, emb], -1), params["w_mlp2"]) + params["b_mlp2"]
    return rms_norm(out, params["head_norm"], eps), state


def unroll(cfg: CloverConfig, params: dict, h: jax.Array, emb: jax.Array, num_heads: int) -> list:
    """All heads over a window, teacher-forced: h [B,T,E] the block's outputs; emb
    [B, T + num_heads - 1, E], emb[:, j] = e(x_{j+1}) (head i at position t reads e(x_{t+1+i})).
    Returns [o_0, ..., o_{num_heads-1}], [B,T,E] each."""
    t = h.shape[1]
    outs, state = [first_head(cfg, params, h)], h
    for i in range(1, num_heads):
        out, state = next_head(cfg, params, state, emb[:, i:i + t])
        outs.append(out)
    return outs


def logits(out: jax.Array, lm_head: jax.Array) -> jax.Array:
    """Head outputs [..., E] -> float32 logits [..., V] through the target's LM head [E, V]."""
    return dense(out, lm_head, out_dtype=jnp.float32)
