"""EAGLE draft heads (Li et al. 2024, 2025): one Llama decoder layer that drafts at the feature
level, autoregressively, reading the target's features.

EAGLE-1 (version 1): the draft entry at position t reads f_t, the target's final normed hidden
(the tensor its LM head consumes), and e(x_{t+1}), the target's embedding of the next token:
    x = fc(concat(e(x_{t+1}), f_t)) + b           (embedding first; fc has a bias)
    h = x + Attn(x)                               (layer 0 has no input norm)
    f^_{t+1} = h + MLP(post_norm(h))
and its tokens come from the frozen target LM head applied to f^ (as EAGLE's code does: f is
already normed, so no second final norm).

EAGLE-3 (version 3): the feature is g_t = fc(concat(l_low, l_mid, l_high)) over three target
decoder-layer outputs (no bias); the layer reads concat(input_norm(e(x_{t+1})), hidden_norm(g_t))
(q/k/v take 2E), the residual is g_t, then the MLP; tokens come from the draft's own final norm
and LM head (draft vocabulary mapped to target ids by `d2t` when it is smaller).

Further draft steps feed the draft's own output f^ (v1) / h (v3) back as the feature. Attention
is the library's tree attention over the draft's own one-layer KV cache.

Params (`PARAMS`, matrices [in, out]): fc_w, fc_b (v1), layer {wq, wk, wv, wo, mlp_norm, w_gate,
w_up, w_down, + attn_norm (input norm) and hidden_norm for v3}, norm and lm_head (v3), optional
embed [V, E] (default: the target's) and d2t int32[Vd] (draft id -> target id).
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp

from pallas_kernels import QuantizedWeight, dequantize
from specjax.models import KVCache, ModelConfig
from specjax.models.llama import apply_rope, attention_block, dense, mlp_block, rms_norm, rope_inv_freq, rope_tables
from specjax.models.params import LAYER as LLAMA_LAYER
from specjax.models.params import Param, random_params, shapes
from specjax.quantize import MODES, quantize_weight


@dataclasses.dataclass(frozen=True)
class EagleConfig:
    """Static shape of an EAGLE head. `vocab_size` is the target's; `draft_vocab_size` the
    head's own LM head (v3); `target_layers` the three target decoder layers fused by v3."""

    version: int
    hidden_size: int
    intermediate_size: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    vocab_size: int
    draft_vocab_size: int | None = None
    target_hidden_size: int | None = None
    target_layers: tuple[int, ...] = ()
    rope_theta: float = 10000.0
    rms_norm_eps: float = 1e-6
    max_position_embeddings: int = 2048

    def __post_init__(self):
        if self.version not in (1, 3):
            raise ValueError(f"EAGLE version must be 1 or 3, got {self.version!r}")
        if self.version == 3 and len(self.target_layers) != 3:
            raise ValueError(f"EAGLE-3 fuses 3 target layers, got target_layers={self.target_layers}")
        object.__setattr__(self, "target_layers", tuple(int(i) for i in self.target_layers))
        if self.draft_vocab_size is None:
            object.__setattr__(self, "draft_vocab_size", self.vocab_size)
        if self.target_hidden_size is None:
            object.__setattr__(self, "target_hidden_size", self.hidden_size)

    @property
    def layer(self) -> ModelConfig:
        """The decoder layer as a one-layer ModelConfig (for the library's attention blocks)."""
        return ModelConfig(model_type="llama", vocab_size=self.vocab_size, hidden_size=self.hidden_size,
                           intermediate_size=self.intermediate_size, num_layers=1,
                           num_heads=self.num_heads, num_kv_heads=self.num_kv_heads,
                           head_dim=self.head_dim, max_position_embeddings=self.max_position_embeddings,
                           rope_theta=self.rope_theta, rms_norm_eps=self.rms_norm_eps,
                           dtype="float32")

    @classmethod
    def for_target(cls, target: ModelConfig, version: int = 1, target_layers=None,
                   intermediate_size: int | None = None) -> "EagleConfig":
        """A head shaped like one of `target`'s layers. v3 default taps: the outputs of layers
        1, L//2 - 1 and L - 4 (EAGLE-3 reads the inputs of layers 2, L//2, L-3), clipped to
        [0, L-1]."""
        n = target.num_layers
        if target_layers is None:
            target_layers = tuple(min(max(i, 0), n - 1) for i in (1, n // 2 - 1, n - 4)) if version == 3 else ()
        return cls(version=version, hidden_size=target.hidden_size,
                   intermediate_size=intermediate_size or target.intermediate_size,
                   num_heads=target.num_heads, num_kv_heads=target.num_kv_heads, head_dim=target.head_dim,
                   vocab_size=target.vocab_size, target_layers=tuple(target_layers) if version == 3 else (),
                   rope_theta=target.rope_theta, rms_norm_eps=target.rms_norm_eps,
                   max_position_embeddings=target.max_position_embeddings)

    def to_dict(self) -> dict:
        d = dataclasses.asdict(self)
        d["target_layers"] = list(self.target_layers)
        return d

    @classmethod
    def from_dict(cls, d: dict) -> "EagleConfig":
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = set(d) - known
        if unknown:
            raise ValueError(f"unknown EAGLE config key(s): {', '.join(sorted(unknown))}")
        return cls(**{**d, "target_layers": tuple(d.get("target_layers", ()))})


def _in(c: EagleConfig) -> int:
    """The layer's input width: v3 reads the embedding and the feature side by side."""
    return c.hidden_size if c.version == 1 else 2 * c.hidden_size


def _v1(c: EagleConfig) -> bool:
    return c.version == 1


def _v3(c: EagleConfig) -> bool:
    return c.version == 3


# The parameters (specjax.models.params), HF names as EAGLE's checkpoints write them.
LAYER = {  # a Llama decoder layer (under `layers.0.` in EAGLE-1 checkpoints, `midlayer.` in EAGLE-3)
    "wq": dataclasses.replace(LLAMA_LAYER["wq"], shape=lambda c: (_in(c), c.num_heads * c.head_dim)),
    "wk": dataclasses.replace(LLAMA_LAYER["wk"], shape=lambda c: (_in(c), c.num_kv_heads * c.head_dim)),
    "wv": dataclasses.replace(LLAMA_LAYER["wv"], shape=lambda c: (_in(c), c.num_kv_heads * c.head_dim)),
    **{name: LLAMA_LAYER[name] for name in ("wo", "w_gate", "w_up", "w_down")},
    "mlp_norm": dataclasses.replace(LLAMA_LAYER["mlp_norm"], hf="post_attention_layernorm.weight"),
    "attn_norm": dataclasses.replace(LLAMA_LAYER["attn_norm"], when=_v3),  # the embedding's input norm
    "hidden_norm": Param(lambda c: (c.hidden_size,), (None,), "norm", when=_v3, hf="hidden_norm.weight"),
}
PARAMS = {
    "fc_w": Param(lambda c: (2 * c.hidden_size if _v1(c) else 3 * c.target_hidden_size, c.hidden_size),
                  (None, "embed"), hf="fc.weight"),
    "fc_b": Param(lambda c: (c.hidden_size,), (None,), "zeros", when=_v1, hf="fc.bias"),
    "layer": LAYER,
    "norm": Param(lambda c: (c.hidden_size,), (None,), "norm", when=_v3, hf="norm.weight"),
    "lm_head": Param(lambda c: (c.hidden_size, c.draft_vocab_size), ("embed", "vocab"), matmul=True,
                     when=_v3, hf="lm_head.weight"),
}  # and optional: embed [V, E] (a published head's own copy, `embed_tokens.weight`), d2t int32[Vd]


def param_shapes(cfg: EagleConfig) -> dict:
    return shapes(PARAMS, cfg)


def init(cfg: EagleConfig, key: jax.Array, target_params: dict | None = None, std: float = 0.02,
         d2t=None) -> dict:
    """Random init (norms 1, bias 0). v1's fc starts as [0; I] + noise (the draft starts by
    passing the target's feature through); v3's LM head starts from the target's when given
    (its `d2t` columns for a reduced draft vocabulary; d2t itself is not a trained parameter),
    dequantized when the target's is quantized (a GGUF's)."""
    params = random_params(PARAMS, cfg, key, num_layers=1, std=std)
    if cfg.version == 1:
        e = cfg.hidden_size
        params["fc_w"] = params["fc_w"].at[e:].add(jnp.eye(e))
    elif target_params is not None and (d2t is not None or cfg.draft_vocab_size == cfg.vocab_size):
        head = target_params.get("lm_head")
        head = target_params["embed"].T if head is None else head
        head = jnp.asarray(dequantize(head) if isinstance(head, QuantizedWeight) else head, jnp.float32)
        params["lm_head"] = head if d2t is None else head[:, jnp.asarray(d2t)]
    return params


def quantize(params: dict, mode: str) -> dict:
    """The head with its matmul weights (fc, the layer's projections, its own LM head) quantized
    to `mode` ("int8" or "int4", as `sj.quantize` does a model's): the draft then reads a quarter
    (int8) of the float weights' bytes each step, which on a CPU is most of its cost. Norms,
    biases, the embedding and d2t stay; drafts are verified, so the output does not change."""
    if mode not in MODES:
        raise ValueError(f"EAGLE head weights must be one of {', '.join(MODES)}, got {mode!r}")
    one = lambda name, w: quantize_weight(w, MODES[mode], name=name)
    out = {**params, "layer": {n: one(n, w) if n in _LAYER_MATMULS else w for n, w in params["layer"].items()}}
    return {**out, **{n: one(n, params[n]) for n in ("fc_w", "lm_head") if n in params}}


def _float(w):
    """A weight as `dense` takes it: float32, or a QuantizedWeight as it is (`quantize`)."""
    return w if isinstance(w, QuantizedWeight) else w.astype(jnp.float32)


_LAYER_MATMULS = tuple(n for n, p in LAYER.items() if p.matmul)


# ---- the layer -----------------------------------------------------------------------------------

def target_feature(cfg: EagleConfig, params: dict, hidden: jax.Array, layer_hidden: jax.Array | None):
    """The target's feature per position: v1 the final normed hidden [B,T,E]; v3 fc over the
    three chosen layer outputs layer_hidden [3,B,T,E]."""
    if cfg.version == 1:
        return hidden.astype(jnp.float32)
    fused = jnp.concatenate([layer_hidden[i].astype(jnp.float32) for i in range(3)], axis=-1)
    return dense(fused, _float(params["fc_w"]))


def _inputs(cfg, params, emb, feat):
    """(attention input, residual) of the layer from embeddings and features [B,T,E]."""
    lp = params["layer"]
    emb, feat = emb.astype(jnp.float32), feat.astype(jnp.float32)
    if cfg.version == 1:
        x = dense(jnp.concatenate([emb, feat], -1), _float(params["fc_w"])) + params["fc_b"]
        return x, x
    x = jnp.concatenate([rms_norm(emb, lp["attn_norm"], cfg.rms_norm_eps),
                         rms_norm(feat, lp["hidden_norm"], cfg.rms_norm_eps)], -1)
    return x, feat


def _finish(cfg, lp, residual, attn_out):
    h = residual + attn_out
    return h + mlp_block(lp, rms_norm(h, lp["mlp_norm"], cfg.rms_norm_eps))


def step(cfg: EagleConfig, params: dict, emb: jax.Array, feat: jax.Array, positions: jax.Array,
         cache: KVCache, tree_mask: jax.Array) -> tuple[jax.Array, jax.Array, jax.Array]:
    """Run the draft layer on T new entries that see the cache's committed slots and the new
    entries `tree_mask` bool[B,T,T] allows. emb/feat [B,T,E], positions int[B,T].
    Returns (output features [B,T,E], k_new, v_new [B,T,KV,hd])."""
    lp = params["layer"]
    x, residual = _inputs(cfg, params, emb, feat)
    attn, k, v = attention_block(cfg.layer, lp, x, positions, tree_mask, cache.k[0], cache.v[0],
                                  cache.lengths, rope_tables(positions, rope_inv_freq(cfg.layer)))
    return _finish(cfg, lp, residual, attn), k, v


def write(cache: KVCache, k_new: jax.Array, v_new: jax.Array) -> KVCache:
    """Write T new entries [B,T,KV,hd] at slots [lengths, lengths + T) of each row (lengths
    unchanged)."""
    return cache.write(k_new[None], v_new[None])


def init_cache(cfg: EagleConfig, batch: int, max_len: int) -> KVCache:
    return KVCache.init(cfg.layer, batch, max_len, jnp.float32)


def logits(cfg: EagleConfig, params: dict, h: jax.Array, target_lm_head: jax.Array | None = None):
    """Output features [...,E] -> float32 logits [..., V] over the target's vocabulary.
    v1 uses the target's LM head [E, V]; v3 its own (d2t maps a smaller draft vocabulary)."""
    if cfg.version == 1:
        return dense(h.astype(jnp.float32), target_lm_head.astype(jnp.float32), out_dtype=jnp.float32)
    out = dense(rms_norm(h, params["norm"], cfg.rms_norm_eps), _float(params["lm_head"]),
                out_dtype=jnp.float32)
    if "d2t" in params:
        full = jnp.full((*out.shape[:-1], cfg.vocab_size), -1e30, jnp.float32)
        return full.at[..., params["d2t"]].set(out)
    return out


def embed(params: dict, target_embed: jax.Array, tokens: jax.Array) -> jax.Array:
    """Token embeddings: the head's own copy when it has one, else the target's."""
    table = params.get("embed", target_embed)
    return table[tokens].astype(jnp.float32)


# ---- training-time unroll ------------------------------------------------------------------------

def unroll(cfg: EagleConfig, params: dict, emb: jax.Array, feat0: jax.Array, num_steps: int) -> list:
    """The draft over a whole window for `num_steps` draft steps (EAGLE-3's training-time test).

    emb [B, T + num_steps - 1, E]: embeddings of the input tokens (x_{t+1+i} at position t, step
    i); feat0 [B,T,E]: the target features. Step 0 reads feat0 and attends causally; step i > 0
    reads step i-1's output at the same position (which stands for position t+i), with RoPE
    position t+i, and attends to the step-0 keys of positions <= t plus its own keys of steps
    1..i — exactly what a depth-i tree node sees at inference. Returns [h_0, ..., h_{n-1}]."""
    lc, lp = cfg.layer, params["layer"]
    b, t, _ = feat0.shape
    inv = rope_inv_freq(lc)
    pos0 = jnp.broadcast_to(jnp.arange(t, dtype=jnp.int32), (b, t))
    scale = lc.head_dim ** -0.5
    g = lc.num_heads // lc.num_kv_heads
    causal = jnp.tril(jnp.ones((t, t), bool))
    neg = jnp.finfo(jnp.float32).min
    outs, feat, k0 = [], feat0, None
    diag_k, diag_v = [], []
    for i in range(num_steps):
        x, residual = _inputs(cfg, params, emb[:, i:i + t], feat)
        rope = rope_tables(pos0 + i, inv)
        q = apply_rope(dense(x, lp["wq"]).reshape(b, t, lc.num_heads, lc.head_dim), rope)
        k = apply_rope(dense(x, lp["wk"]).reshape(b, t, lc.num_kv_heads, lc.head_dim), rope)
        v = dense(x, lp["wv"]).reshape(b, t, lc.num_kv_heads, lc.head_dim)
        qg = q.reshape(b, t, lc.num_kv_heads, g, lc.head_dim) * scale
        if i == 0:
            k0, v0 = k, v
        else:
            diag_k.append(k)
            diag_v.append(v)
        s0 = jnp.where(causal[None, None, None], jnp.einsum("bnkgd,bmkd->bkgnm", qg, k0), neg)
        sd = [jnp.einsum("bnkgd,bnkd->bkgn", qg, kk)[..., None] for kk in diag_k]
        p = jax.nn.softmax(jnp.concatenate([s0, *sd], -1), -1)
        o = jnp.einsum("bkgnm,bmkd->bnkgd", p[..., :t], v0)
        for j, vv in enumerate(diag_v):
            o = o + p[..., t + j].transpose(0, 3, 1, 2)[..., None] * vv[:, :, :, None, :]
        h = _finish(cfg, lp, residual, dense(o.reshape(b, t, -1), lp["wo"]))
        outs.append(h)
        feat = h
    return outs
