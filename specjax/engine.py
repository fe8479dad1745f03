"""Prefill, the decode step, and the `lax.while_loop` driver behind generate/stream/make_generate.

One step: the root (last committed token, whose K/V is not yet cached) goes through the target
with the cache, the processed target distribution is sampled, and the accepted path is
committed. Autoregressive decoding is this loop with a root-only tree; speculative decoding
adds a drafter's nodes to the same step.

Public pieces, for drivers built on top (`specjax.adaptive` keeps only its policy on them):
`plan(...)` resolves and checks a decode's static settings on the host, `batch(plan, mesh, ...)`
lays a batch out, `prefill` and `step(...) -> (state, StepRecord)` are the pure loop pieces,
and `stats(plan, ...)` turns the counters into the stats dict.
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
from specjax.models import ForwardOutput, KVCache, Model, ModelConfig
from specjax.tree import row_gather


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
    constraint: Any = None  # a TokenAutomaton (sj.constraints) or None
    constraint_state: jax.Array | None = None  # int32[B]: its state after each row's output

    @property
    def root(self) -> jax.Array:
        return row_gather(self.history, self.length - 1)


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
            *, settings: DecodeSettings, cache_len: int, budget: jax.Array | None = None,
            constraint=None) -> DecodeState:
    """Cache every prompt token but the last (the last is the first root); start the drafter.
    budget: int32[B], the new tokens each row may emit (default max_new_tokens; a row with 0
    is padding, done from the start). constraint: a TokenAutomaton the output must follow."""
    b = prompts.shape[0]
    budget = jnp.full((b,), settings.max_new_tokens, jnp.int32) if budget is None else budget
    cache = KVCache.init(model.config, b, cache_len)
    pre = None  # the prefill's hidden states go to the drafter (head drafters start from them)
    if prompts.shape[1] > 1:
        pre = model(prompts[:, :-1], cache=cache, compute_logits=False, return_layers=drafter.target_layers)
        cache = pre.cache
    history = jnp.zeros((b, cache_len), jnp.int32).at[:, : prompts.shape[1]].set(prompts)
    return sharding.constrain_caches(DecodeState(
        cache=cache._replace(lengths=lengths - 1), history=history, length=lengths,
        out=jnp.full((b, settings.max_new_tokens), -1, jnp.int32),
        num_out=jnp.zeros((b,), jnp.int32), budget=budget, done=budget <= 0, key=key,
        target_calls=jnp.zeros((b,), jnp.int32),
        accepted_hist=jnp.zeros((b, drafter.max_depth + 1), jnp.int32),
        drafter_state=drafter.init(model, prompts, lengths, cache_len, pre), constraint=constraint,
        constraint_state=None if constraint is None else jnp.full((b,), constraint.initial, jnp.int32)))


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
    automaton = state.constraint
    ctx = Context(state.history, state.length, settings.sampling, model, state.cache, automaton,
                  state.constraint_state)
    tree, dstate = drafter.propose(state.drafter_state, ctx, draft_key)
    if automaton is not None:  # every node's state along its own path
        node_states = automaton.node_states(tree, state.constraint_state)
        if tree.q is None:
            tree = automaton.prune(tree, node_states)
    positions = tree.positions(state.cache.lengths)
    active = ~state.done
    out = _verify_forward(model, drafter, tree, positions, state.cache,
                          drafter.injection(dstate, tree, positions), active)
    logits = out.logits[:, : tree.num_nodes]
    if automaton is not None:  # the constrained target: masked, then processed (renormalised)
        logits = automaton.mask_logits(logits, node_states)
    verdict = verifier(tree, sampling.probs(logits, settings.sampling), verify_key)
    cache = out.cache.commit(verdict.path, verdict.num_accepted)
    cache = cache._replace(lengths=jnp.where(active, cache.lengths, state.cache.lengths))
    dstate = drafter.update(dstate, ctx, tree, verdict, out)
    width = state.accepted_hist.shape[1]
    hist = state.accepted_hist + jax.nn.one_hot(verdict.num_accepted, width, dtype=jnp.int32) * active[:, None]
    state = state._replace(cache=cache, key=key, drafter_state=dstate, accepted_hist=hist)
    if automaton is not None:  # the state at the accepted path's end, advanced by the next token
        end = row_gather(node_states, verdict.last_node)
        advanced = automaton.step(end, verdict.next_token)
        state = state._replace(constraint_state=jnp.where(active, advanced, state.constraint_state))
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
           budget: jax.Array | None = None, constraint=None, *, settings: DecodeSettings,
           verifier: verify.Verifier, cache_len: int) -> DecodeState:
    """Prefill and run the loop to the end, all on the device."""
    state = prefill(model, drafter, prompts, lengths, key, settings=settings, cache_len=cache_len,
                    budget=budget, constraint=constraint)
    return jax.lax.while_loop(lambda s: ~jnp.all(s.done),
                              lambda s: step(model, drafter, s, settings=settings, verifier=verifier)[0],
                              state)


_decode_jit = jax.jit(decode, static_argnames=("settings", "verifier", "cache_len"))


# ---- public entry points ------------------------------------------------------------------------

def bucket(n: int, floor: int = 16) -> int:
    """The size a request of n compiles at: the next power of two, at least `floor`. `generate`
    and `stream` pad the prompt length, the output length and (floor 1) the batch to buckets, so
    a session of varied requests compiles a few programs, not one per call."""
    return max(floor, 1 << (int(n) - 1).bit_length())


@dataclasses.dataclass(frozen=True)
class Plan:
    """The static pieces of one decode, resolved and checked on the host. `settings.max_new_tokens`
    and `prompt_len` are the compiled sizes (buckets when `bucketed`, as generate/stream plan);
    `max_new_tokens` is what was asked for."""

    drafter: Drafter
    verifier: verify.Verifier
    settings: DecodeSettings
    cache_len: int
    prompt_len: int
    max_new_tokens: int
    bucketed: bool = False


def plan(config: ModelConfig, target: Model | None, prompt_len: int, drafter=None, verifier=None,
         max_new_tokens: int = 64, temperature: float = 0.0, top_k: int | None = None,
         top_p: float | None = None, eos_token_id=None, bucketed: bool = False) -> Plan:
    """Resolve and check one decode's static pieces on the host: the drafter (None: AR), the
    verifier (None: the drafter's exact default), sampling settings, EOS ids and the cache
    size; with `target`, the drafter is checked against it. Errors name the bad argument."""
    params = sampling.SamplingParams(float(temperature), top_k, top_p)
    asked = DecodeSettings(max_new_tokens, params, _eos_ids(eos_token_id))
    if any(not 0 <= e < config.vocab_size for e in asked.eos_token_ids):
        raise ValueError(f"eos_token_id must be in the vocabulary [0, {config.vocab_size}), got "
                         f"{list(asked.eos_token_ids)}")
    drafter = NoDrafter() if drafter is None else drafter
    if not isinstance(drafter, Drafter):
        raise TypeError(f"drafter must be a specjax drafter (sj.drafters.*), got {type(drafter).__name__}")
    sizes = drafter.tree_sizes
    if list(sizes) != sorted(set(sizes)) or sizes[0] < 1 or sizes[-1] != drafter.num_nodes:
        raise ValueError(f"{type(drafter).__name__}.tree_sizes must ascend from >= 1 to num_nodes = "
                         f"{drafter.num_nodes}, got {sizes}")
    if target is not None:
        drafter.check(target)
    verifier = drafter.default_verifier(params) if verifier is None else verifier
    if not isinstance(verifier, verify.Verifier):
        raise TypeError(f"verifier must be a specjax rule (sj.verify.*), got {type(verifier).__name__}")
    cache_size(config, prompt_len, asked)  # raises when the positions cannot hold the request
    width = bucket(prompt_len) if bucketed else prompt_len
    settings = dataclasses.replace(asked, max_new_tokens=bucket(max_new_tokens)) if bucketed else asked
    return Plan(drafter, verifier, settings, width + settings.max_new_tokens + drafter.num_nodes,
                width, max_new_tokens, bucketed)


class Batch(NamedTuple):
    """A batch laid out for the loop: prompts int32[B', prompt_len], lengths and budget int32[B'].
    B' >= the real rows, which come first: bucket rows have budget 0 (done from the start), rows
    that fill the mesh's 'data' axis repeat the last (see `sharding.pad_batch`)."""

    prompts: jax.Array
    lengths: jax.Array
    budget: jax.Array


def batch(plan: Plan, mesh, padded: np.ndarray, lengths: np.ndarray) -> Batch:
    """Prompts padded to the plan's width (and, bucketed, the batch to its bucket) with rows of
    budget 0, then to fill the mesh's 'data' axis, placed on the mesh (None: as they are)."""
    b = len(padded)
    extra = bucket(b, floor=1) - b if plan.bucketed else 0
    rows = np.zeros((b + extra, plan.prompt_len), np.int32)
    rows[:b, : padded.shape[1]] = padded
    rows[b:] = rows[b - 1]
    lens = np.concatenate([lengths, np.repeat(lengths[-1:], extra)])
    budget = np.array([plan.max_new_tokens] * b + [0] * extra, np.int32)
    return Batch(*(sharding.shard_batch(mesh, x) for x in sharding.pad_batch(mesh, rows, lens, budget)))


def make_generate(config: ModelConfig, *, prompt_len: int, max_new_tokens: int = 64, drafter=None,
                  verifier=None, temperature: float = 0.0, top_k: int | None = None,
                  top_p: float | None = None, eos_token_id=None, constraint=None):
    """The decode loop as a pure function `(params, prompts int[B, prompt_len], lengths int[B],
    key, drafter=drafter) -> (tokens int32[B, max_new_tokens], num_tokens int32[B])`, for use
    inside the caller's jit / vmap / sharded pipeline. Prompts are right-padded with ids in
    [0, vocab_size) and 1 <= lengths[b] <= prompt_len: called with concrete arrays it checks
    that; traced, it cannot, and out-of-range ids would read clamped embeddings. Pass the
    drafter as an argument to keep its weights traced rather than baked in. Sharded (params
    from `sj.shard`, prompts from `sj.sharding.shard_batch`): trace it under
    `jax.set_mesh(mesh)`, which pins the KV caches and keeps the Pallas kernels out.
    `constraint` as in `generate` (pass its EOS ids in eos_token_id)."""
    p = plan(config, None, prompt_len, drafter, verifier, max_new_tokens, temperature, top_k,
             top_p, eos_token_id)

    def generate_fn(params, prompts, lengths, key, drafter=p.drafter):
        if not isinstance(prompts, jax.core.Tracer) and not isinstance(lengths, jax.core.Tracer):
            _check_padded(np.asarray(prompts), np.asarray(lengths), config.vocab_size, prompt_len)
        s = decode(Model(params, config), drafter, prompts, lengths, key, None, constraint, settings=p.settings,
                   verifier=p.verifier, cache_len=p.cache_len)
        return s.out, s.num_out

    return generate_fn


def _check_padded(prompts: np.ndarray, lengths: np.ndarray, vocab_size: int, prompt_len: int) -> None:
    if prompts.ndim != 2 or prompts.shape[1] != prompt_len or lengths.shape != prompts.shape[:1]:
        raise ValueError(f"prompts must be int[B, {prompt_len}] and lengths int[B], got "
                         f"{list(prompts.shape)} and {list(lengths.shape)}")
    if np.any((lengths < 1) | (lengths > prompt_len)):
        raise ValueError(f"lengths must be in [1, {prompt_len}], got {lengths.tolist()}")
    real = np.arange(prompt_len)[None, :] < lengths[:, None]
    bad = prompts[real & ((prompts < 0) | (prompts >= vocab_size))]
    if bad.size:
        raise ValueError(f"prompts hold token ids outside the vocabulary [0, {vocab_size}): {bad[:5].tolist()}")


def generate(model: Model, prompts, *, max_new_tokens: int = 64, drafter=None, verifier=None,
             temperature: float = 0.0, top_k: int | None = None, top_p: float | None = None,
             key: jax.Array | None = None, eos_token_id=None, constraint=None) -> GenerateOutput:
    """Generate up to `max_new_tokens` per prompt; the whole loop is one compiled while_loop.
    `drafter=None` is plain autoregressive decoding; `verifier=None` picks the exact rule that
    fits the drafter and the temperature. Prompt length, max_new_tokens and batch size are
    padded to buckets (see `bucket`), so varied requests reuse a few compiled programs; a new
    drafter, verifier, sampling setting or EOS list compiles anew. The stats give decoding
    time (`wall_time_s`, `tokens_per_s`) without compilation, and `compile_s` apart. A model
    laid out on a mesh (`sj.shard`) decodes sharded: the batch over 'data', the drafter laid
    out on the same mesh. `constraint` (`sj.constraints.json_schema` / `regex`) restricts the
    output to its language: the target's logits are masked to the allowed tokens before
    processing (so p is renormalised over them), which keeps every exact verifier exact for
    the constrained distribution; the constraint's EOS ids end rows."""
    p, mesh, drafter, rows, n = _placed(model, prompts, drafter, verifier, max_new_tokens, temperature,
                                        top_k, top_p, eos_token_id, constraint)
    key = jax.random.key(0) if key is None else key
    compiled_before, t0 = _compile_seconds(), time.perf_counter()
    with sharding.use_mesh(mesh):
        state = _decode_jit(model, drafter, rows.prompts, rows.lengths, key, rows.budget, constraint,
                            settings=p.settings,
                            verifier=p.verifier, cache_len=p.cache_len)
    tokens, num, calls, hist = (x[:n] for x in sharding.to_host(
        (state.out, state.num_out, state.target_calls, state.accepted_hist)))
    compile_s = _compile_seconds() - compiled_before
    wall = time.perf_counter() - t0 - compile_s
    return GenerateOutput(np.asarray(tokens)[:, :max_new_tokens], np.asarray(num),
                          stats(p, num, calls, hist, wall, compile_s))


def _placed(model: Model, prompts, drafter, verifier, max_new_tokens, temperature, top_k, top_p,
            eos_token_id, constraint=None):
    """generate's and stream's setup: the bucketed plan, the model's mesh, the drafter and the
    batch laid out on it, and the number of real rows. A constraint adds its EOS ids."""
    padded, lengths = pad_prompts(prompts, model.config.vocab_size)
    if constraint is not None:
        from specjax.constraints import TokenAutomaton

        if not isinstance(constraint, TokenAutomaton):
            raise TypeError(f"constraint must come from sj.constraints (json_schema, regex), got "
                            f"{type(constraint).__name__}")
        if constraint.vocab_size > model.config.vocab_size:
            raise ValueError(f"the constraint was built for a vocabulary of {constraint.vocab_size} "
                             f"tokens, the model has {model.config.vocab_size}")
        eos_token_id = list(dict.fromkeys(_eos_ids(eos_token_id) + constraint.eos_token_ids))
    p = plan(model.config, model, padded.shape[1], drafter, verifier, max_new_tokens, temperature,
             top_k, top_p, eos_token_id, bucketed=True)
    mesh = sharding.mesh_of(model)
    drafter = p.drafter if mesh is None else sharding.shard(p.drafter, mesh)
    return p, mesh, drafter, batch(p, mesh, padded, lengths), len(padded)


def stats(plan: Plan, num_tokens, target_calls, accepted_hist, wall: float, compile_s: float = 0.0) -> dict:
    """tau = committed tokens per target forward (bonus included, output cut-offs excluded);
    acceptance_per_depth[d-1] = P(depth d accepted | depth d-1 accepted). wall_time_s is the
    decoding alone; compile_s the tracing and compiling this call paid."""
    hist = accepted_hist.sum(0)
    steps = int(hist.sum())
    reach = hist[::-1].cumsum()[::-1]  # reach[d] = steps that accepted >= d drafts
    committed = float((hist * np.arange(len(hist))).sum() + hist.sum())
    ar = isinstance(plan.drafter, NoDrafter)
    return {
        "method": plan.drafter.name,
        "verifier": (f"none ({'greedy' if plan.settings.sampling.greedy else 'sampling'})" if ar
                     else type(plan.verifier).__name__),
        "tau": committed / max(steps, 1),
        "steps": steps,
        "committed_tokens": int(committed),
        "target_calls": int(target_calls.max()),
        "acceptance_per_depth": [float(reach[d] / reach[d - 1]) if reach[d - 1] else 0.0
                                 for d in range(1, len(hist))],
        "new_tokens": int(num_tokens.sum()),
        "wall_time_s": wall,
        "compile_s": compile_s,
        "tokens_per_s": float(num_tokens.sum() / wall) if wall > 0 else float("inf"),
    }


_COMPILE_EVENTS = ("/jax/core/compile/jaxpr_trace_duration",
                   "/jax/core/compile/jaxpr_to_mlir_module_duration",
                   "/jax/core/compile/backend_compile_duration")
_compiled = [0.0]


def _on_event(event: str, duration: float, **_):
    if event in _COMPILE_EVENTS:
        _compiled[0] += duration


jax.monitoring.register_event_duration_secs_listener(_on_event)


def _compile_seconds() -> float:
    """Seconds this process has spent tracing, lowering and compiling (JAX's monitoring events)."""
    return _compiled[0]


def stream(model: Model, prompt: Sequence[int], *, max_new_tokens: int = 64, drafter=None,
           verifier=None, temperature: float = 0.0, top_k: int | None = None,
           top_p: float | None = None, key: jax.Array | None = None,
           eos_token_id=None, constraint=None) -> Iterator[list[int]]:
    """Yield the new token ids of one prompt as each jitted step produces them (a host loop over
    the same step `generate` compiles into its while_loop, for CLIs; shapes bucketed as there).
    The generator's return value (StopIteration.value) is the stats dict, with the same
    timing as `generate`'s: decoding alone, and `compile_s` apart. `constraint` as in generate.
    The inputs are checked by this call, not at the first token."""
    p, mesh, drafter, rows, _ = _placed(model, [list(prompt)], drafter, verifier, max_new_tokens,
                                        temperature, top_k, top_p, eos_token_id, constraint)
    return _stream_steps(model, p, mesh, drafter, rows, jax.random.key(0) if key is None else key, constraint)


def _stream_steps(model: Model, p: Plan, mesh, drafter: Drafter, rows: Batch, key: jax.Array,
                  constraint) -> Iterator[list[int]]:
    compiled_before, t0 = _compile_seconds(), time.perf_counter()
    with sharding.use_mesh(mesh):  # a sharded model: traced for its mesh
        state = _prefill_jit(model, drafter, rows.prompts, rows.lengths, key, budget=rows.budget,
                             settings=p.settings, cache_len=p.cache_len, constraint=constraint)
    emitted = 0
    while True:
        with sharding.use_mesh(mesh):
            state, _ = _step_jit(model, drafter, state, settings=p.settings, verifier=p.verifier)
        out, num, done = sharding.to_host((state.out, state.num_out, state.done))
        if num[0] > emitted:  # slice on the host: a device slice would compile per (start, stop)
            yield out[0, emitted: num[0]].tolist()
            emitted = int(num[0])
        if done[0]:
            compile_s = _compile_seconds() - compiled_before
            return stats(p, *(x[:1] for x in sharding.to_host(
                (state.num_out, state.target_calls, state.accepted_hist))),
                time.perf_counter() - t0 - compile_s, compile_s)


_prefill_jit = jax.jit(prefill, static_argnames=("settings", "cache_len"))
_step_jit = jax.jit(step, static_argnames=("settings", "verifier"), donate_argnames=("state",))
