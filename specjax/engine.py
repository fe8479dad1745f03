"""The decode loop on the device: prefill, one step, and the `lax.while_loop` that runs them.

One step: the root (last committed token, whose K/V is not yet cached) goes through the target
with the cache, the processed target distribution is sampled, and the accepted path is
committed. Autoregressive decoding is this loop with a root-only tree; speculative decoding
adds a drafter's nodes to the same step, and a constraint (`sj.constraints.Constraint`, carried
in the state) restricts what the step may accept.

Every function here is pure and traced; the host side (checking a request, padding it to
buckets, compiling, timing, stats) is `specjax.decoding`.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp

from specjax import sampling, sharding, verify
from specjax.drafters.base import Context, Drafter
from specjax.models import ForwardOutput, KVCache, Model
from specjax.models.target import fill


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
    budget: jax.Array  # int32[B]: new tokens each row may emit (<= max_new_tokens; 0 = padding row)
    done: jax.Array  # bool[B]
    key: jax.Array
    target_calls: jax.Array  # int32[B]: target forwards while the row was active
    accepted_hist: jax.Array  # int32[B, D+1]: steps that accepted exactly a draft tokens
    drafter_state: Any
    constraint: Any  # a `sj.constraints.Constraint`, each row at its output's place

    def context(self, model: Model, params: sampling.SamplingParams) -> Context:
        """What a drafter sees of this state."""
        return Context(self.history, self.length, params, model, self.cache, self.constraint)


def prefill(model: Model, drafter: Drafter, prompts: jax.Array, lengths: jax.Array, key: jax.Array,
            *, settings: DecodeSettings, cache_len: int, constraint, budget: jax.Array | None = None
            ) -> DecodeState:
    """Cache every prompt token but the last (the last is the first root); start the drafter
    and the constraint (`sj.constraints.Unconstrained()` for none). budget: int32[B], the new
    tokens each row may emit (default max_new_tokens; a row with 0 is padding, done from the start)."""
    b = prompts.shape[0]
    budget = jnp.full((b,), settings.max_new_tokens, jnp.int32) if budget is None else budget
    cache = KVCache.init(model.config, b, cache_len)
    pre = None  # the prefill's hidden states go to the drafter (head drafters start from them)
    if prompts.shape[1] > 1:
        pre = fill(model, prompts[:, :-1], cache, compute_logits=False, return_layers=drafter.target_layers)
        cache = pre.cache
    history = jnp.zeros((b, cache_len), jnp.int32).at[:, : prompts.shape[1]].set(prompts)
    return sharding.constrain_caches(DecodeState(
        cache=cache._replace(lengths=lengths - 1), history=history, length=lengths,
        out=jnp.full((b, settings.max_new_tokens), -1, jnp.int32),
        num_out=jnp.zeros((b,), jnp.int32), budget=budget, done=budget <= 0, key=key,
        target_calls=jnp.zeros((b,), jnp.int32),
        accepted_hist=jnp.zeros((b, drafter.max_depth + 1), jnp.int32),
        drafter_state=drafter.init(model, prompts, lengths, cache_len, pre),
        constraint=constraint.start(b, settings.max_new_tokens + 2 * (drafter.max_depth + 1))))


class StepRecord(NamedTuple):
    """What one step did, per row: num_accepted int32[B] (draft tokens accepted; the bonus
    token is not counted) and active bool[B] (the rows that were not done, so stepped)."""

    num_accepted: jax.Array
    active: jax.Array


def step(model: Model, drafter: Drafter, state: DecodeState, *, settings: DecodeSettings,
         verifier: verify.Verifier) -> tuple[DecodeState, StepRecord]:
    """One target forward: propose a tree, verify it, commit the accepted path, emit its tokens.
    The state's accepted_hist counts the step at its accepted depth (its width is the state's:
    a loop over several drafters carries the widest)."""
    key, draft_key, verify_key = jax.random.split(state.key, 3)
    ctx = state.context(model, settings.sampling)
    constraint, active = state.constraint, ~state.done
    with jax.named_scope("propose"):
        tree, dstate = drafter.propose(state.drafter_state, ctx, draft_key)
        nodes = constraint.nodes(tree)  # each node's place in the constraint, along its own path
        tree = constraint.prune(tree, nodes)
    positions = tree.positions(state.cache.lengths)
    with jax.named_scope("verify_forward"):
        out = _verify_forward(model, drafter, tree, positions, state.cache,
                              drafter.injection(dstate, tree, positions), active)
    with jax.named_scope("verify"):  # the constrained target: masked, then processed (renormalised)
        logits = constraint.mask_logits(out.logits[:, : tree.num_nodes], nodes)
        verdict = verifier(tree, sampling.probs(logits, settings.sampling), verify_key)
    with jax.named_scope("commit"):
        cache = out.cache.commit(verdict.path, verdict.num_accepted)
        cache = cache._replace(lengths=jnp.where(active, cache.lengths, state.cache.lengths))
    with jax.named_scope("update"):
        dstate = drafter.update(dstate, ctx, tree, verdict, out)
        constraint = constraint.advance(nodes, verdict.last_node, verdict.next_token, active)
        width = state.accepted_hist.shape[1]
        hist = state.accepted_hist + jax.nn.one_hot(verdict.num_accepted, width, dtype=jnp.int32) * active[:, None]
        state = state._replace(cache=cache, key=key, drafter_state=dstate, accepted_hist=hist,
                               constraint=constraint)
        state = _emit(state, verdict.emitted(tree), verdict.num_accepted + 1, settings)
    return sharding.constrain_caches(state), StepRecord(verdict.num_accepted, active)


def _verify_forward(model: Model, drafter: Drafter, tree, positions: jax.Array, cache: KVCache,
                    inject, active: jax.Array):
    """The target's forward over the tree. A drafter with several `tree_sizes` is verified at
    the smallest size that holds every active row's valid nodes (a `lax.switch` over one
    forward per size; nodes are topologically ordered, so the first n form a tree), so a step
    with little to verify costs a small forward. Outputs are padded back to the tree's N."""
    def run(n, write_cache=True):
        return model(tree.tokens[:, :n], positions=positions[:, :n], cache=cache,
                     tree_mask=tree.ancestors[:, :n, :n], write_cache=write_cache,
                     return_layers=drafter.target_layers, inject=inject)

    sizes, n_max = drafter.tree_sizes, tree.num_nodes
    if len(sizes) == 1:
        return run(n_max)

    def padded(n):  # the cache is only read in here: it is written once, after the switch
        def pad(x, axis):
            return jnp.pad(x, [(0, n_max - n if a == axis else 0) for a in range(x.ndim)])
        out = run(n, write_cache=False)
        return (pad(out.logits, 1), pad(out.hidden, 1),
                None if out.layer_hidden is None else pad(out.layer_hidden, 2),
                tuple(pad(x, 2) for x in out.new_kv))

    used = jnp.max(jnp.where(tree.valid & active[:, None], jnp.arange(n_max) + 1, 1))
    which = jnp.searchsorted(jnp.array(sizes), used)  # the smallest size >= used
    logits, hidden, layer_hidden, new_kv = jax.lax.switch(
        which, [functools.partial(padded, n) for n in sizes])
    return ForwardOutput(logits, hidden, layer_hidden, cache.write(*new_kv))


def _emit(state: DecodeState, new: jax.Array, count: jax.Array, settings: DecodeSettings) -> DecodeState:
    """Append new[b, :count[b]] to active rows (output cut at EOS and the row's budget; the
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
    valid &= idx < (state.budget - state.num_out)[:, None]
    pos = jnp.where(valid, state.num_out[:, None] + idx, settings.max_new_tokens)
    out = state.out.at[rows, pos].set(new, mode="drop")
    num_out = state.num_out + valid.sum(1).astype(jnp.int32)
    done = state.done | hit_eos | (num_out >= state.budget)
    return state._replace(history=history, length=length, out=out, num_out=num_out, done=done,
                          target_calls=state.target_calls + active.astype(jnp.int32))


def decode(model: Model, drafter: Drafter, prompts: jax.Array, lengths: jax.Array, key: jax.Array,
           *, constraint, budget: jax.Array | None = None, settings: DecodeSettings,
           verifier: verify.Verifier, cache_len: int) -> DecodeState:
    """Prefill and run the loop to the end, all on the device."""
    state = prefill(model, drafter, prompts, lengths, key, settings=settings, cache_len=cache_len,
                    constraint=constraint, budget=budget)
    return jax.lax.while_loop(lambda s: ~jnp.all(s.done),
                              lambda s: step(model, drafter, s, settings=settings, verifier=verifier)[0],
                              state)
