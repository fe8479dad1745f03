"""A model that is not specjax's own, decoded through the target protocol (`specjax.models.Target`):
a small Llama written as a Flax NNX module, wrapped in a pytree that implements the protocol's
forward and cache contract. It decodes as `sj.Model` does with the same weights, and
speculative decoding over it (prompt lookup's trees, a draft model's chains) keeps its greedy
output."""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import specjax as sj
from specjax.drafters import DraftModel, PromptLookup
from specjax.models import ForwardOutput, KVCache, ModelConfig, Target
from specjax.pytrees import register_dataclass

nnx = pytest.importorskip("flax.nnx")

CONFIG = ModelConfig(model_type="llama", vocab_size=96, hidden_size=32, intermediate_size=64, num_layers=2,
                     num_heads=4, num_kv_heads=2, head_dim=8, max_position_embeddings=256, rms_norm_eps=1e-6)
PROMPTS = [[5, 17, 33, 9, 60, 5, 17, 33, 9], [40, 3, 40, 3, 40], [8, 8, 50, 14, 22, 8, 8, 50]]


# ---- a Llama in Flax NNX, knowing nothing of specjax but the cache layout ------------------------

def rope(x, positions, theta=10000.0):
    """Half-split RoPE on x [B, T, H, hd] at positions int[B, T]."""
    hd = x.shape[-1]
    angles = positions[..., None] * (1.0 / theta ** (jnp.arange(0, hd, 2) / hd))
    cos, sin = jnp.cos(angles)[:, :, None], jnp.sin(angles)[:, :, None]
    x1, x2 = jnp.split(x, 2, axis=-1)
    return jnp.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], axis=-1)


class Block(nnx.Module):
    def __init__(self, c: ModelConfig, rngs: nnx.Rngs):
        e, hd = c.hidden_size, c.head_dim
        self.heads, self.kv_heads, self.head_dim = c.num_heads, c.num_kv_heads, hd
        self.attn_norm = nnx.RMSNorm(e, epsilon=c.rms_norm_eps, rngs=rngs)
        self.wq = nnx.Linear(e, c.num_heads * hd, use_bias=False, rngs=rngs)
        self.wk = nnx.Linear(e, c.num_kv_heads * hd, use_bias=False, rngs=rngs)
        self.wv = nnx.Linear(e, c.num_kv_heads * hd, use_bias=False, rngs=rngs)
        self.wo = nnx.Linear(c.num_heads * hd, e, use_bias=False, rngs=rngs)
        self.mlp_norm = nnx.RMSNorm(e, epsilon=c.rms_norm_eps, rngs=rngs)
        self.w_gate = nnx.Linear(e, c.intermediate_size, use_bias=False, rngs=rngs)
        self.w_up = nnx.Linear(e, c.intermediate_size, use_bias=False, rngs=rngs)
        self.w_down = nnx.Linear(c.intermediate_size, e, use_bias=False, rngs=rngs)

    def __call__(self, x, positions, k_cache, v_cache, lengths, mask):
        """x [B, T, E]; the cache's slots [0, lengths) and the new tokens `mask` allows are seen."""
        b, t, _ = x.shape
        h = self.attn_norm(x)
        q = rope(self.wq(h).reshape(b, t, self.heads, self.head_dim), positions)
        k = rope(self.wk(h).reshape(b, t, self.kv_heads, self.head_dim), positions)
        v = self.wv(h).reshape(b, t, self.kv_heads, self.head_dim)
        keys = jnp.repeat(jnp.concatenate([k_cache, k], 1), self.heads // self.kv_heads, axis=2)
        values = jnp.repeat(jnp.concatenate([v_cache, v], 1), self.heads // self.kv_heads, axis=2)
        committed = jnp.arange(k_cache.shape[1])[None, None, :] < lengths[:, None, None]
        seen = jnp.concatenate([jnp.broadcast_to(committed, (b, t, k_cache.shape[1])), mask], -1)
        scores = jnp.einsum("bthd,bshd->bhts", q, keys) / jnp.sqrt(self.head_dim)
        probs = jax.nn.softmax(jnp.where(seen[:, None], scores, -jnp.inf), -1)
        x = x + self.wo(jnp.einsum("bhts,bshd->bthd", probs, values).reshape(b, t, -1))
        h = self.mlp_norm(x)
        return x + self.w_down(jax.nn.silu(self.w_gate(h)) * self.w_up(h)), k, v


class Llama(nnx.Module):
    def __init__(self, c: ModelConfig, rngs: nnx.Rngs):
        self.embed = nnx.Embed(c.vocab_size, c.hidden_size, rngs=rngs)
        self.layers = nnx.List([Block(c, rngs) for _ in range(c.num_layers)])
        self.norm = nnx.RMSNorm(c.hidden_size, epsilon=c.rms_norm_eps, rngs=rngs)
        self.lm_head = nnx.Linear(c.hidden_size, c.vocab_size, use_bias=False, rngs=rngs)

    def __call__(self, tokens, positions, k_cache, v_cache, lengths, mask):
        x, ks, vs = self.embed(tokens), [], []
        for i, layer in enumerate(self.layers):
            x, k, v = layer(x, positions, k_cache[i], v_cache[i], lengths, mask)
            ks.append(k)
            vs.append(v)
        hidden = self.norm(x)
        return self.lm_head(hidden), hidden, jnp.stack(ks), jnp.stack(vs)


# ---- the protocol, implemented for it ----------------------------------------------------------

@register_dataclass
@dataclasses.dataclass(frozen=True)
class FlaxTarget:
    """A Flax NNX module as a specjax Target: its state the pytree's leaves, its graph and
    config static; the forward keeps the KVCache contract (reads [0, lengths), writes the new
    K/V at [lengths, lengths + T) or returns them)."""

    state: nnx.State
    graphdef: nnx.GraphDef = dataclasses.field(metadata=dict(static=True))
    config: ModelConfig = dataclasses.field(metadata=dict(static=True))

    @classmethod
    def wrap(cls, module: nnx.Module, config: ModelConfig) -> "FlaxTarget":
        graphdef, state = nnx.split(module)
        return cls(state, graphdef, config)

    def __call__(self, tokens, *, positions=None, cache=None, tree_mask=None, return_layers=(),
                 compute_logits=True, inject=None, write_cache=True) -> ForwardOutput:
        if return_layers or inject is not None:
            raise NotImplementedError("this target has no layer outputs or injections (heads, PPD)")
        b, t = tokens.shape
        if cache is None:
            cache = KVCache.init(self.config, b, 0)
        if positions is None:
            positions = cache.lengths[:, None] + jnp.arange(t)[None, :]
        if tree_mask is None:
            tree_mask = jnp.broadcast_to(jnp.tril(jnp.ones((t, t), bool)), (b, t, t))
        logits, hidden, k, v = nnx.merge(self.graphdef, self.state)(
            tokens, positions, cache.k, cache.v, cache.lengths, tree_mask)
        logits = logits.astype(jnp.float32) if compute_logits else None
        if not write_cache:
            return ForwardOutput(logits, hidden, None, cache, (k, v))
        return ForwardOutput(logits, hidden, None, cache.write(k, v))


def to_specjax(module: Llama) -> sj.Model:
    """The same weights as an sj.Model (both store matmuls [in, out])."""
    layers = {name: jnp.stack([getattr(layer, name).kernel[...] for layer in module.layers])
              for name in ("wq", "wk", "wv", "wo", "w_gate", "w_up", "w_down")}
    layers.update({name: jnp.stack([getattr(layer, name).scale[...] for layer in module.layers])
                   for name in ("attn_norm", "mlp_norm")})
    return sj.Model({"embed": module.embed.embedding[...], "layers": layers, "norm": module.norm.scale[...],
                     "lm_head": module.lm_head.kernel[...]}, CONFIG)


@pytest.fixture(scope="module")
def module():
    return Llama(CONFIG, nnx.Rngs(0))


@pytest.fixture(scope="module")
def target(module):
    return FlaxTarget.wrap(module, CONFIG)


@pytest.fixture(scope="module")
def ar(target):
    return sj.generate(target, PROMPTS, max_new_tokens=16)


def test_the_wrapper_is_a_target(target):
    assert isinstance(target, Target) and isinstance(sj.Model.init(CONFIG, jax.random.key(0)), Target)


def test_it_decodes_as_specjax_does_with_the_same_weights(module, target, ar):
    tokens = jnp.asarray(np.array([PROMPTS[0]]))
    np.testing.assert_allclose(target(tokens).logits, sj.forward(to_specjax(module), tokens), atol=1e-4)
    own = sj.generate(to_specjax(module), PROMPTS, max_new_tokens=16)
    np.testing.assert_array_equal(ar.tokens, own.tokens)
    assert ar.stats.tau == 1.0


@pytest.mark.parametrize("drafter", [PromptLookup(max_ngram=2, num_tokens=4, min_ngram=1), "draft"])
def test_speculative_decoding_over_it_keeps_its_greedy_output(module, target, ar, drafter):
    """Prompt lookup's trees verify at two sizes (the cache written after a switch), a draft
    model's chains at one; the draft is the target's own weights as an sj.Model, so it agrees."""
    drafter = DraftModel(to_specjax(module), mode="chain", k=3) if drafter == "draft" else drafter
    out = sj.generate(target, PROMPTS, max_new_tokens=16, drafter=drafter)
    np.testing.assert_array_equal(out.tokens, ar.tokens)
    np.testing.assert_array_equal(out.num_tokens, ar.num_tokens)
    assert out.stats.tau > 1.0
