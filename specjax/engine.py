"""Prefill, the decode step, and the `lax.while_loop` driver behind generate/stream/make_generate.

One step: the root (last committed token, whose K/V is not yet cached) goes through the target
with the cache, the processed target distribution is sampled, and the accepted path is
committed. Autoregressive decoding is this loop with a root-only tree; speculative decoding
adds a drafter's nodes to the same step.
"""

from __future__ import annotations

import dataclasses
import time
from typing import Iterator, NamedTuple, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from specjax import sampling
from specjax.models import KVCache, Model, ModelConfig, forward


@dataclasses.dataclass(frozen=True)
class DecodeSettings:
    """Static settings of one decode loop (hashable: a static jit argument)."""

    max_new_tokens: int
    sampling: sampling.SamplingParams = sampling.SamplingParams()
    eos_token_ids: tuple[int, ...] = ()

    def __post_init__(self):
        if not isinstance(self.max_new_tokens, int) or self.max_new_tokens < 1:
            raise ValueError(f"max_new_tokens must be an integer >= 1, got {self.max_new_tokens!r}")


class DecodeState(NamedTuple):
    """Everything the loop carries. out: int32[B, max_new_tokens] (-1 = not written)."""

    cache: KVCache
    root: jax.Array  # int32[B]: last committed token, next forward's root
    out: jax.Array
    num_out: jax.Array  # int32[B]
    done: jax.Array  # bool[B]
    key: jax.Array
    target_calls: jax.Array  # int32[B]: target forwards while the row was active


@dataclasses.dataclass
class GenerateOutput:
    """tokens: int32[B, max_new_tokens], -1 after each row's end; num_tokens: int32[B]."""

    tokens: np.ndarray
    num_tokens: np.ndarray
    stats: dict


# ---- input checks -------------------------------------------------------------------------------

def pad_prompts(prompts, vocab_size: int) -> tuple[np.ndarray, np.ndarray]:
    """A [B, T] array or a list of token lists (ragged allowed) -> right-padded int32 [B, T]
    and lengths int32[B]. Raises on empty prompts and out-of-vocabulary ids."""
    if isinstance(prompts, (np.ndarray, jax.Array)):
        arr = np.asarray(prompts)
        if arr.ndim == 1:
            arr = arr[None]
        if arr.ndim != 2:
            raise ValueError(f"prompts must be [B, T] token ids, got shape {arr.shape}")
        rows = list(arr)
    else:
        rows = [np.asarray(r) for r in prompts]
        if rows and rows[0].ndim == 0:  # a single flat list of ids
            rows = [np.asarray(prompts)]
    if not rows:
        raise ValueError("no prompts given")
    for i, r in enumerate(rows):
        if r.size == 0:
            raise ValueError(f"prompt {i} is empty; every prompt needs at least one token")
        if not np.issubdtype(r.dtype, np.integer):
            raise ValueError(f"prompt {i} must hold integer token ids, got dtype {r.dtype}")
        bad = r[(r < 0) | (r >= vocab_size)]
        if bad.size:
            raise ValueError(f"prompt {i} has token ids outside the vocabulary [0, {vocab_size}): "
                             f"{bad[:5].tolist()}")
    lengths = np.array([len(r) for r in rows], np.int32)
    padded = np.zeros((len(rows), lengths.max()), np.int32)
    for i, r in enumerate(rows):
        padded[i, : len(r)] = r
    return padded, lengths


def cache_size(config: ModelConfig, prompt_len: int, settings: DecodeSettings, tree_size: int = 1) -> int:
    """Slots the cache needs; raises when the model's positions cannot hold the request."""
    need = prompt_len + settings.max_new_tokens
    if need > config.max_position_embeddings:
        raise ValueError(f"prompt length {prompt_len} + max_new_tokens {settings.max_new_tokens} = "
                         f"{need} exceeds the model's max_position_embeddings "
                         f"{config.max_position_embeddings}")
    return need + tree_size


def _eos_ids(eos_token_id) -> tuple[int, ...]:
    if eos_token_id is None:
        return ()
    return tuple(int(e) for e in (eos_token_id if isinstance(eos_token_id, (list, tuple)) else [eos_token_id]))


# ---- the loop -----------------------------------------------------------------------------------

def prefill(model: Model, prompts: jax.Array, lengths: jax.Array, key: jax.Array, *,
            settings: DecodeSettings, cache_len: int) -> DecodeState:
    """Cache every prompt token but the last; the last becomes the first root."""
    b = prompts.shape[0]
    cache = KVCache.init(model.config, b, cache_len)
    if prompts.shape[1] > 1:
        cache = forward(model.config, model.params, prompts[:, :-1], cache=cache,
                        compute_logits=False).cache
    cache = cache._replace(lengths=lengths - 1)
    root = jnp.take_along_axis(prompts, (lengths - 1)[:, None], axis=1)[:, 0]
    return DecodeState(
        cache=cache, root=root, out=jnp.full((b, settings.max_new_tokens), -1, jnp.int32),
        num_out=jnp.zeros((b,), jnp.int32), done=jnp.zeros((b,), bool), key=key,
        target_calls=jnp.zeros((b,), jnp.int32))


def step(model: Model, state: DecodeState, settings: DecodeSettings) -> DecodeState:
    """One target forward: emit one token per active row."""
    key, sample_key = jax.random.split(state.key)
    out = forward(model.config, model.params, state.root[:, None], cache=state.cache)
    p = sampling.probs(out.logits[:, 0], settings.sampling)
    next_token = sampling.sample(sample_key, p)
    path = jnp.zeros((state.root.shape[0], 1), jnp.int32)
    cache = out.cache.commit(path, jnp.zeros_like(state.num_out))
    cache = cache._replace(lengths=jnp.where(state.done, state.cache.lengths, cache.lengths))
    return _emit(state._replace(cache=cache, key=key), next_token[:, None],
                 jnp.ones_like(state.num_out), settings)


def _emit(state: DecodeState, new: jax.Array, count: jax.Array, settings: DecodeSettings) -> DecodeState:
    """Append new[b, :count[b]] to active rows, cut at EOS and max_new_tokens; next root = last."""
    b, width = new.shape
    active = ~state.done
    idx = jnp.arange(width)[None, :]
    valid = (idx < count[:, None]) & active[:, None]
    if settings.eos_token_ids:
        is_eos = jnp.isin(new, jnp.array(settings.eos_token_ids)) & valid
        first_eos = jnp.where(is_eos.any(1), jnp.argmax(is_eos, 1), width)
        valid &= idx <= first_eos[:, None]
        hit_eos = is_eos.any(1)
    else:
        hit_eos = jnp.zeros((b,), bool)
    room = settings.max_new_tokens - state.num_out
    valid &= idx < room[:, None]
    n = valid.sum(1).astype(jnp.int32)
    pos = jnp.where(valid, state.num_out[:, None] + idx, settings.max_new_tokens)
    out = state.out.at[jnp.arange(b)[:, None], pos].set(new, mode="drop")
    num_out = state.num_out + n
    done = state.done | hit_eos | (num_out >= settings.max_new_tokens)
    last = jnp.take_along_axis(new, jnp.maximum(count - 1, 0)[:, None], axis=1)[:, 0]
    return state._replace(out=out, num_out=num_out, done=done,
                          root=jnp.where(active, last, state.root),
                          target_calls=state.target_calls + active.astype(jnp.int32))


def decode(model: Model, prompts: jax.Array, lengths: jax.Array, key: jax.Array, *,
           settings: DecodeSettings, cache_len: int) -> DecodeState:
    """Prefill and run the loop to the end, all on the device."""
    state = prefill(model, prompts, lengths, key, settings=settings, cache_len=cache_len)
    return jax.lax.while_loop(lambda s: ~jnp.all(s.done), lambda s: step(model, s, settings), state)


_decode_jit = jax.jit(decode, static_argnames=("settings", "cache_len"))


# ---- public entry points ------------------------------------------------------------------------

def _settings(max_new_tokens, temperature, top_k, top_p, eos_token_id) -> DecodeSettings:
    return DecodeSettings(max_new_tokens, sampling.SamplingParams(float(temperature), top_k, top_p),
                          _eos_ids(eos_token_id))


def make_generate(config: ModelConfig, *, prompt_len: int, max_new_tokens: int = 64,
                  temperature: float = 0.0, top_k: int | None = None, top_p: float | None = None,
                  eos_token_id=None):
    """The decode loop as a pure function `(params, prompts int[B, prompt_len], lengths int[B],
    key) -> (tokens int32[B, max_new_tokens], num_tokens int32[B])`, for use inside the caller's
    jit / vmap / sharded pipeline. Prompts are right-padded; lengths[b] >= 1."""
    settings = _settings(max_new_tokens, temperature, top_k, top_p, eos_token_id)
    cache_len = cache_size(config, prompt_len, settings)

    def generate_fn(params, prompts, lengths, key):
        s = decode(Model(params, config), prompts, lengths, key, settings=settings, cache_len=cache_len)
        return s.out, s.num_out

    return generate_fn


def generate(model: Model, prompts, *, max_new_tokens: int = 64, drafter=None, verifier=None,
             temperature: float = 0.0, top_k: int | None = None, top_p: float | None = None,
             key: jax.Array | None = None, eos_token_id=None) -> GenerateOutput:
    """Generate up to `max_new_tokens` per prompt; the whole loop is one compiled while_loop."""
    if drafter is not None or verifier is not None:
        raise NotImplementedError("speculative decoding (drafter/verifier) is not available yet")
    settings = _settings(max_new_tokens, temperature, top_k, top_p, eos_token_id)
    padded, lengths = pad_prompts(prompts, model.config.vocab_size)
    cache_len = cache_size(model.config, padded.shape[1], settings)
    key = jax.random.key(0) if key is None else key
    t0 = time.perf_counter()
    state = _decode_jit(model, jnp.asarray(padded), jnp.asarray(lengths), key,
                        settings=settings, cache_len=cache_len)
    tokens, num, calls = jax.device_get((state.out, state.num_out, state.target_calls))
    wall = time.perf_counter() - t0
    return GenerateOutput(np.asarray(tokens), np.asarray(num), _stats(num, calls, wall))


def _stats(num_tokens: np.ndarray, target_calls: np.ndarray, wall: float) -> dict:
    return {
        "tau": float(num_tokens.sum() / max(target_calls.sum(), 1)),
        "target_calls": int(target_calls.max()),
        "acceptance_per_depth": [],
        "new_tokens": int(num_tokens.sum()),
        "wall_time_s": wall,
        "tokens_per_s": float(num_tokens.sum() / wall) if wall > 0 else float("inf"),
    }


def stream(model: Model, prompt: Sequence[int], *, max_new_tokens: int = 64,
           temperature: float = 0.0, top_k: int | None = None, top_p: float | None = None,
           key: jax.Array | None = None, eos_token_id=None) -> Iterator[list[int]]:
    """Yield the new token ids of one prompt as each jitted step produces them (a host loop over
    the same step `generate` compiles into its while_loop, for CLIs)."""
    settings = _settings(max_new_tokens, temperature, top_k, top_p, eos_token_id)
    padded, lengths = pad_prompts([list(prompt)], model.config.vocab_size)
    cache_len = cache_size(model.config, padded.shape[1], settings)
    key = jax.random.key(0) if key is None else key
    state = _prefill_jit(model, jnp.asarray(padded), jnp.asarray(lengths), key,
                         settings=settings, cache_len=cache_len)
    emitted = 0
    while True:
        state = _step_jit(model, state, settings=settings)
        num, done = jax.device_get((state.num_out[0], state.done[0]))
        if num > emitted:
            yield jax.device_get(state.out[0, emitted:num]).tolist()
            emitted = int(num)
        if done:
            return


_prefill_jit = jax.jit(prefill, static_argnames=("settings", "cache_len"))
_step_jit = jax.jit(step, static_argnames=("settings",), donate_argnames=("state",))
