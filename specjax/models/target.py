"""The target protocol: what the decode loop needs of the model it decodes, so that a model that
is not specjax's own (a Flax NNX module, a hand-written forward) can be decoded and verified as
`sj.Model` is. `sj.Model` is one; `tests/test_flax_target.py` wraps a Flax NNX Llama as another.

The loop (`specjax.engine`) calls the target twice: once over the prompts (the prefill, with
`compute_logits=False`) and once per step over the draft tree, and owns its cache:

- it allocates a `KVCache` with `KVCache.init(target.config, batch, max_len)`: keys and values
  [L, B, S, KV, hd] per layer and slot, and `lengths` int32[B], the committed slots of each row;
- a forward with `cache` attends to each row's committed slots [0, lengths) and, among the T new
  tokens, to those `tree_mask` bool[B, T, T] allows (a node sees its ancestors and itself), at
  `positions` int[B, T] (a tree node sits at lengths + its depth); it writes the T new K/V at
  slots [lengths, lengths + T) and leaves `lengths` alone (with `write_cache=False` it returns
  them in `new_kv` [L, B, T, KV, hd] instead, and the cache untouched);
- the loop then keeps the accepted path with `KVCache.commit`, which moves its slots down and
  advances `lengths`: the target never decides what is committed.

A target is a pytree (its config static metadata, its weights leaves: a registered dataclass
as `sj.Model`), passed to `jit` as the loop's argument. `return_layers` (the decoder layers
head drafters read) and `inject` (extra positions of PPD and Hidden Transfer) are asked for
only by those drafters; a target without them may raise on them, and decodes with every other
drafter: drafters that read the target's weights (heads read its embedding and LM head, the
self-speculative ones its layers) need `sj.Model` itself.
"""

from __future__ import annotations

from typing import Protocol, runtime_checkable

import jax

from specjax.models.cache import KVCache
from specjax.models.llama import ForwardOutput, Injection


class TargetConfig(Protocol):
    """The static facts of a target the loop reads: the vocabulary (prompts are checked against
    it), the positions it can hold (the cache is sized within it), and the cache's shape."""

    vocab_size: int
    max_position_embeddings: int
    num_layers: int
    num_kv_heads: int
    head_dim: int

    @property
    def jnp_dtype(self): ...


@runtime_checkable
class Target(Protocol):
    """A pure forward with the cache contract of the module docstring."""

    config: TargetConfig

    def __call__(self, tokens: jax.Array, *, positions: jax.Array | None = None,
                 cache: KVCache | None = None, tree_mask: jax.Array | None = None,
                 return_layers: tuple[int, ...] = (), compute_logits: bool = True,
                 inject: Injection | None = None, write_cache: bool = True) -> ForwardOutput:
        """tokens int[B, T] -> ForwardOutput: logits float32 [B, T, V] (None without
        compute_logits), hidden [B, T, E] (the final normed hidden), layer_hidden (the
        return_layers' outputs or None), the cache with the new K/V written (or new_kv).
        positions default to lengths + arange(T), tree_mask to causal."""
        ...


def fill(target: Target, tokens: jax.Array, cache: KVCache, **kwargs) -> ForwardOutput:
    """The forward of `tokens` [B, T] into `cache`, a fresh one (lengths 0): the tokens attend to
    each other alone, not to the cache's S empty slots (scoring them more than doubles a long
    prompt's attention), and their K/V land at slots [0, T). kwargs go to the forward."""
    empty = KVCache.init(target.config, tokens.shape[0], 0, cache.k.dtype)
    out = target(tokens, cache=empty, write_cache=False, **kwargs)
    return out._replace(cache=cache.write(*out.new_kv), new_kv=None)


__all__ = ["Target", "TargetConfig", "fill"]
