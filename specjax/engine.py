"""Prefill, the decode step, and the `lax.while_loop` driver behind generate/stream/make_generate.

One step: the root (last committed token, whose K/V is not yet cached) goes through the target
with the cache, the processed target distribution is sampled, and the accepted path is
committed. Autoregressive decoding is this loop with a root-only tree; speculative decoding
adds a drafter's nodes to the same step.
"""

from __future__ import annotations

import dataclasses
import functools
import time
from typing import Any, Iterator, NamedTuple, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from specjax import sampling, sharding, verify
from specjax.drafters.base import Context, Drafter, NoDrafter
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
    history: jax.Array  # int32[B, S]: committed tokens, the root last (see drafters.Context)
    length: jax.Array  # int32[B]: committed tokens per row
    out: jax.Array
    num_out: jax.Array  # int32[B]
    done: jax.Array  # bool[B]
    key: jax.Array
    target_calls: jax.Array  # int32[B]: target forwards while the row was active
    accepted_hist: jax.Array  # int32[B, D+1]: steps that accepted exactly a draft tokens
    drafter_state: Any

    @property
    def root(self) -> jax.Array:
        return jnp.take_along_axis(self.history, (self.length - 1)[:, None], axis=1)[:, 0]


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

def prefill(model: Model, drafter: Drafter, prompts: jax.Array, lengths: jax.Array, key: jax.Array,
            *, settings: DecodeSettings, cache_len: int) -> DecodeState:
    """Cache every prompt token but the last (the last is the first root); start the drafter."""
    b = prompts.shape[0]
    cache = KVCache.init(model.config, b, cache_len)
    pre = None  # the prefill's hidden states go to the drafter (head drafters start from them)
    if prompts.shape[1] > 1:
        pre = forward(model.config, model.params, prompts[:, :-1], cache=cache, compute_logits=False,
                      return_layers=drafter.target_layers)
        cache = pre.cache
    history = jnp.zeros((b, cache_len), jnp.int32).at[:, : prompts.shape[1]].set(prompts)
    return sharding.constrain_caches(DecodeState(
        cache=cache._replace(lengths=lengths - 1), history=history, length=lengths,
        out=jnp.full((b, settings.max_new_tokens), -1, jnp.int32),
        num_out=jnp.zeros((b,), jnp.int32), done=jnp.zeros((b,), bool), key=key,
        target_calls=jnp.zeros((b,), jnp.int32),
        accepted_hist=jnp.zeros((b, drafter.max_depth + 1), jnp.int32),
        drafter_state=drafter.init_from_prefill(model, prompts, lengths, cache_len, pre)))


def step(model: Model, drafter: Drafter, state: DecodeState, *, settings: DecodeSettings,
         verifier: verify.Verifier) -> DecodeState:
    """One target forward: propose a tree, verify it, commit the accepted path, emit its tokens."""
    key, draft_key, verify_key = jax.random.split(state.key, 3)
    ctx = Context(state.history, state.length, settings.sampling)
    tree, dstate = drafter.propose(state.drafter_state, ctx, draft_key)
    positions = tree.positions(state.cache.lengths)
    out = forward(model.config, model.params, tree.tokens, positions=positions, cache=state.cache,
                  tree_mask=tree.ancestors, return_layers=drafter.target_layers,
                  inject=drafter.injection(dstate, tree, positions))
    logits = out.logits[:, : tree.num_nodes]
    verdict = verifier(tree, sampling.probs(logits, settings.sampling), verify_key)
    active = ~state.done
    cache = out.cache.commit(verdict.path, verdict.num_accepted)
    cache = cache._replace(lengths=jnp.where(active, cache.lengths, state.cache.lengths))
    dstate = drafter.update(dstate, ctx, tree, verdict, out)
    hist = state.accepted_hist + (jax.nn.one_hot(verdict.num_accepted, drafter.max_depth + 1, dtype=jnp.int32)
                                  * active[:, None])
    state = state._replace(cache=cache, key=key, drafter_state=dstate, accepted_hist=hist)
    return sharding.constrain_caches(_emit(state, verdict.emitted(tree), verdict.num_accepted + 1, settings))


def _emit(state: DecodeState, new: jax.Array, count: jax.Array, settings: DecodeSettings) -> DecodeState:
    """Append new[b, :count[b]] to active rows (output cut at EOS and max_new_tokens; the
    history takes all of them, so the next root is the last new token)."""
    b, width = new.shape
    rows = jnp.arange(b)[:, None]
    active = ~state.done
    idx = jnp.arange(width)[None, :]
    valid = (idx < count[:, None]) & active[:, None]
    hist_pos = jnp.where(valid, state.length[:, None] + idx, state.history.shape[1])
    history = state.history.at[rows, hist_pos].set(new, mode="drop")
    length = state.length + jnp.where(active, count, 0)
    if settings.eos_token_ids:
        is_eos = jnp.isin(new, jnp.array(settings.eos_token_ids)) & valid
        first_eos = jnp.where(is_eos.any(1), jnp.argmax(is_eos, 1), width)
        valid &= idx <= first_eos[:, None]
        hit_eos = is_eos.any(1)
    else:
        hit_eos = jnp.zeros((b,), bool)
    valid &= idx < (settings.max_new_tokens - state.num_out)[:, None]
    pos = jnp.where(valid, state.num_out[:, None] + idx, settings.max_new_tokens)
    out = state.out.at[rows, pos].set(new, mode="drop")
    num_out = state.num_out + valid.sum(1).astype(jnp.int32)
    done = state.done | hit_eos | (num_out >= settings.max_new_tokens)
    return state._replace(history=history, length=length, out=out, num_out=num_out, done=done,
                          target_calls=state.target_calls + active.astype(jnp.int32))


def decode(model: Model, drafter: Drafter, prompts: jax.Array, lengths: jax.Array, key: jax.Array, *,
           settings: DecodeSettings, verifier: verify.Verifier, cache_len: int) -> DecodeState:
    """Prefill and run the loop to the end, all on the device."""
    state = prefill(model, drafter, prompts, lengths, key, settings=settings, cache_len=cache_len)
    return jax.lax.while_loop(lambda s: ~jnp.all(s.done),
                              lambda s: step(model, drafter, s, settings=settings, verifier=verifier),
                              state)


_decode_jit = jax.jit(decode, static_argnames=("settings", "verifier", "cache_len"))


# ---- public entry points ------------------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class _Plan:
    """The static pieces of one decode, resolved and checked on the host."""

    drafter: Drafter
    verifier: verify.Verifier
    settings: DecodeSettings
    cache_len: int


def _plan(config: ModelConfig, target: Model | None, prompt_len: int, drafter, verifier,
          max_new_tokens, temperature, top_k, top_p, eos_token_id) -> _Plan:
    settings = DecodeSettings(max_new_tokens, sampling.SamplingParams(float(temperature), top_k, top_p),
                              _eos_ids(eos_token_id))
    drafter = NoDrafter() if drafter is None else drafter
    if not isinstance(drafter, Drafter):
        raise TypeError(f"drafter must be a specjax drafter (sj.drafters.*), got {type(drafter).__name__}")
    if target is not None:
        drafter.check(target)
    verifier = drafter.default_verifier(settings.sampling) if verifier is None else verifier
    if not isinstance(verifier, verify.Verifier):
        raise TypeError(f"verifier must be a specjax rule (sj.verify.*), got {type(verifier).__name__}")
    return _Plan(drafter, verifier, settings, cache_size(config, prompt_len, settings, drafter.num_nodes))


def make_generate(config: ModelConfig, *, prompt_len: int, max_new_tokens: int = 64, drafter=None,
                  verifier=None, temperature: float = 0.0, top_k: int | None = None,
                  top_p: float | None = None, eos_token_id=None):
    """The decode loop as a pure function `(params, prompts int[B, prompt_len], lengths int[B],
    key, drafter=drafter) -> (tokens int32[B, max_new_tokens], num_tokens int32[B])`, for use
    inside the caller's jit / vmap / sharded pipeline. Prompts are right-padded; lengths[b] >= 1.
    Pass the drafter as an argument to keep its weights traced rather than baked in. Sharded
    (params from `sj.shard`, prompts from `sj.sharding.shard_batch`): trace it under
    `jax.set_mesh(mesh)`, which pins the KV caches and keeps the Pallas kernels out."""
    plan = _plan(config, None, prompt_len, drafter, verifier, max_new_tokens, temperature, top_k,
                 top_p, eos_token_id)

    def generate_fn(params, prompts, lengths, key, drafter=plan.drafter):
        s = decode(Model(params, config), drafter, prompts, lengths, key, settings=plan.settings,
                   verifier=plan.verifier, cache_len=plan.cache_len)
        return s.out, s.num_out

    return generate_fn


def generate(model: Model, prompts, *, max_new_tokens: int = 64, drafter=None, verifier=None,
             temperature: float = 0.0, top_k: int | None = None, top_p: float | None = None,
             key: jax.Array | None = None, eos_token_id=None) -> GenerateOutput:
    """Generate up to `max_new_tokens` per prompt; the whole loop is one compiled while_loop.
    `drafter=None` is plain autoregressive decoding; `verifier=None` picks the exact rule that
    fits the drafter and the temperature. A model laid out on a mesh (`sj.shard`) decodes
    sharded: the batch over 'data' (the last prompt repeated to fill it), the drafter laid out
    on the same mesh."""
    padded, lengths = pad_prompts(prompts, model.config.vocab_size)
    plan = _plan(model.config, model, padded.shape[1], drafter, verifier, max_new_tokens,
                 temperature, top_k, top_p, eos_token_id)
    key = jax.random.key(0) if key is None else key
    mesh = sharding.mesh_of(model)
    drafter = plan.drafter if mesh is None else sharding.shard(plan.drafter, mesh)
    rows, lens = sharding.pad_batch(mesh, padded, lengths)
    t0 = time.perf_counter()
    with sharding.use_mesh(mesh):
        state = _decode_jit(model, drafter, sharding.shard_batch(mesh, rows), sharding.shard_batch(mesh, lens),
                            key, settings=plan.settings, verifier=plan.verifier, cache_len=plan.cache_len)
    tokens, num, calls, hist = (x[: len(padded)] for x in sharding.to_host(
        (state.out, state.num_out, state.target_calls, state.accepted_hist)))
    wall = time.perf_counter() - t0
    return GenerateOutput(np.asarray(tokens), np.asarray(num),
                          _stats(plan, num, calls, hist, wall))


def _stats(plan: _Plan, num_tokens, target_calls, accepted_hist, wall: float) -> dict:
    """tau = committed tokens per target forward (bonus included, output cut-offs excluded);
    acceptance_per_depth[d-1] = P(depth d accepted | depth d-1 accepted)."""
    hist = accepted_hist.sum(0)
    steps = int(hist.sum())
    reach = hist[::-1].cumsum()[::-1]  # reach[d] = steps that accepted >= d drafts
    committed = float((hist * np.arange(len(hist))).sum() + hist.sum())
    return {
        "method": plan.drafter.name,
        "verifier": type(plan.verifier).__name__,
        "tau": committed / max(steps, 1),
        "steps": steps,
        "committed_tokens": int(committed),
        "target_calls": int(target_calls.max()),
        "acceptance_per_depth": [float(reach[d] / reach[d - 1]) if reach[d - 1] else 0.0
                                 for d in range(1, len(hist))],
        "new_tokens": int(num_tokens.sum()),
        "wall_time_s": wall,
        "tokens_per_s": float(num_tokens.sum() / wall) if wall > 0 else float("inf"),
    }


def stream(model: Model, prompt: Sequence[int], *, max_new_tokens: int = 64, drafter=None,
           verifier=None, temperature: float = 0.0, top_k: int | None = None,
           top_p: float | None = None, key: jax.Array | None = None,
           eos_token_id=None) -> Iterator[list[int]]:
    """Yield the new token ids of one prompt as each jitted step produces them (a host loop over
    the same step `generate` compiles into its while_loop, for CLIs). Both functions are
    compiled before the first token, so the timing in the returned stats dict (the generator's
    StopIteration.value) is decoding alone."""
    padded, lengths = pad_prompts([list(prompt)], model.config.vocab_size)
    plan = _plan(model.config, model, padded.shape[1], drafter, verifier, max_new_tokens,
                 temperature, top_k, top_p, eos_token_id)
    key = jax.random.key(0) if key is None else key
    args = (model, plan.drafter, jnp.asarray(padded), jnp.asarray(lengths), key)
    statics = dict(settings=plan.settings, cache_len=plan.cache_len)
    with sharding.use_mesh(sharding.mesh_of(model)):  # a sharded model: traced for its mesh
        prefill_fn = _prefill_jit.lower(*args, **statics).compile()  # compile before the clock starts
        state_shape = sharding.abstract(jax.eval_shape(functools.partial(prefill, **statics), *args),
                                        prefill_fn.output_shardings)
        step_fn = _step_jit.lower(model, plan.drafter, state_shape, settings=plan.settings,
                                  verifier=plan.verifier).compile()
    t0 = time.perf_counter()
    state = prefill_fn(*args)
    emitted = 0
    while True:
        state = step_fn(model, plan.drafter, state)
        out, num, done = jax.device_get((state.out, state.num_out, state.done))
        if num[0] > emitted:  # slice on the host: a device slice would compile per (start, stop)
            yield out[0, emitted: num[0]].tolist()
            emitted = int(num[0])
        if done[0]:
            return _stats(plan, *jax.device_get((state.num_out, state.target_calls, state.accepted_hist)),
                          time.perf_counter() - t0)


_prefill_jit = jax.jit(prefill, static_argnames=("settings", "cache_len"))
_step_jit = jax.jit(step, static_argnames=("settings", "verifier"), donate_argnames=("state",))
