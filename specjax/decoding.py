"""Decoding requests on the host: `generate`, `stream` and `make_generate` around the engine's loop.

Every call goes the same way: `prepare` checks the prompts and the options (a `Request`),
resolves the static pieces (`plan`: drafter, verifier, sampling, EOS ids, constraint, cache
size), checks that the batch fits in memory (`specjax.memory`), pads the batch to buckets and
lays it out on the model's mesh; the loop runs (`specjax.engine`); `finish` brings the outputs
to the host with their `Stats`. A `Policy` passed as the drafter (`sj.Adaptive`) runs its own
loop between the same prepare and finish.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Iterator, NamedTuple, Sequence

import jax
import numpy as np

from specjax import constraints, engine, memory, sampling, sharding, verify
from specjax.drafters.base import Drafter, NoDrafter
from specjax.engine import DecodeSettings
from specjax.models import Model, ModelConfig
from specjax.stats import Clock, Stats


@dataclasses.dataclass
class GenerateOutput:
    """tokens: int32[B, max_new_tokens], -1 after each row's end; num_tokens: int32[B]."""

    tokens: np.ndarray
    num_tokens: np.ndarray
    stats: Stats


@dataclasses.dataclass(frozen=True)
class Request:
    """One call's options, as `generate` takes them (see there)."""

    max_new_tokens: int = 64
    verifier: verify.Verifier | None = None
    temperature: float = 0.0
    top_k: int | None = None
    top_p: float | None = None
    eos_token_id: int | Sequence[int] | None = None
    constraint: constraints.Constraint | None = None


class Policy:
    """A decode that picks its drafter as it runs (`sj.Adaptive`): passed as `drafter` to
    `generate`, it gets the call, and decodes between `prepare` and `finish` itself."""

    def generate(self, model: Model, prompts, request: Request, key: jax.Array) -> GenerateOutput:
        raise NotImplementedError


# ---- checks -------------------------------------------------------------------------------------

def check_tokens(tokens, vocab_size: int, lengths: np.ndarray | None = None, what: str = "tokens") -> np.ndarray:
    """`tokens` as a host array int[B, T], checked: integer ids, and those of each row's first
    lengths[b] (default: all) in [0, vocab_size). The one check of every entry point."""
    tokens = np.asarray(tokens)
    if tokens.ndim != 2 or not np.issubdtype(tokens.dtype, np.integer):
        raise ValueError(f"{what} must be integer ids [B, T], got {tokens.dtype} {list(tokens.shape)}")
    real = np.ones(tokens.shape, bool) if lengths is None else np.arange(tokens.shape[1]) < lengths[:, None]
    bad = tokens[real & ((tokens < 0) | (tokens >= vocab_size))]
    if bad.size:
        raise ValueError(f"{what} hold token ids outside the vocabulary [0, {vocab_size}): {bad[:5].tolist()}")
    return tokens


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
        if r.ndim != 1:
            raise ValueError(f"prompt {i} must be a list of token ids, got shape {r.shape}")
    lengths = np.array([len(r) for r in rows], np.int32)
    padded = np.zeros((len(rows), lengths.max()), np.result_type(*{r.dtype for r in rows}))
    for i, r in enumerate(rows):
        padded[i, : len(r)] = r
    return check_tokens(padded, vocab_size, lengths, "prompts").astype(np.int32), lengths


def check_positions(config: ModelConfig, prompt_len: int, max_new_tokens: int) -> None:
    """Raise when the model's positions cannot hold the prompt and the new tokens."""
    need = prompt_len + max_new_tokens
    if need > config.max_position_embeddings:
        raise ValueError(f"prompt length {prompt_len} + max_new_tokens {max_new_tokens} = "
                         f"{need} exceeds the model's max_position_embeddings "
                         f"{config.max_position_embeddings}")


def _eos_ids(eos_token_id) -> tuple[int, ...]:
    if eos_token_id is None:
        return ()
    return tuple(int(e) for e in (eos_token_id if isinstance(eos_token_id, (list, tuple)) else [eos_token_id]))


# ---- the static pieces and the batch ------------------------------------------------------------

def bucket(n: int, floor: int = 16) -> int:
    """The size a request of n compiles at: the next power of two, at least `floor`. `generate`
    and `stream` pad the prompt length, the output length and the batch to buckets (see
    `prompt_bucket`, `batch_bucket`), so a session of varied requests compiles a few programs,
    not one per call."""
    return max(floor, 1 << (int(n) - 1).bit_length())


def quarter_bucket(n: int, above: int, floor: int = 16) -> int:
    """`bucket(n, floor)` up to `above`; past it, the next of 2^k * (5/4, 3/2, 7/4, 2), so a
    large size pads by at most 25%, not up to 100%, for three more programs an octave."""
    if n <= above:
        return bucket(n, floor)
    step = bucket(n) // 8
    return -(-int(n) // step) * step


LONG_PROMPT = 1024  # tokens; longer prompts pad by at most a quarter, not to the next power of two
LARGE_BATCH = 64  # rows; larger batches (sampling many rows, RL rollouts) likewise


def prompt_bucket(n: int) -> int:
    """The width a prompt of n tokens compiles at (see `quarter_bucket`)."""
    return quarter_bucket(n, LONG_PROMPT)


def batch_bucket(n: int) -> int:
    """The number of rows a batch of n compiles at (see `quarter_bucket`); added rows are done
    from the start, but the forward passes still compute them."""
    return quarter_bucket(n, LARGE_BATCH, floor=1)


@dataclasses.dataclass(frozen=True)
class Plan:
    """The static pieces of one decode, resolved and checked on the host. `prompt_len` and
    `settings.max_new_tokens` are the compiled sizes (buckets when `bucketed`); `budget` is
    the new tokens each real row may emit, as asked (<= settings.max_new_tokens)."""

    drafter: Drafter
    verifier: verify.Verifier
    settings: DecodeSettings
    constraint: constraints.Constraint
    cache_len: int
    prompt_len: int
    budget: int
    bucketed: bool = False


def plan(config: ModelConfig, target: Model | None, prompt_len: int, drafter: Drafter | None,
         request: Request, bucketed: bool = False) -> Plan:
    """Resolve and check one decode's static pieces on the host: the drafter (None: AR), the
    verifier (None: the drafter's exact default), sampling settings, the constraint (None:
    `Unconstrained`; its EOS ids join the request's) and the cache size; with `target`, the
    drafter is checked against it. Errors name the bad argument."""
    if config.bidirectional:
        raise ValueError(f"this {config.model_type} model is a masked-diffusion LM (mask_token_id "
                         f"{config.mask_token_id}): decode it with specjax.diffusion, not left to right")
    params = sampling.SamplingParams(float(request.temperature), request.top_k, request.top_p)
    constraint = request.constraint
    if constraint is None:
        constraint = constraints.Unconstrained()
    elif isinstance(constraint, (list, tuple)):  # one a row
        constraint = constraints.per_row(constraint)
    if not isinstance(constraint, constraints.Constraint):
        raise TypeError(f"constraint must come from sj.constraints (json_schema, regex, grammar), or be "
                        f"a list of them (one a row), got {type(constraint).__name__}")
    constraint.check(config.vocab_size)
    eos = tuple(dict.fromkeys(_eos_ids(request.eos_token_id) + constraint.eos_token_ids))
    asked = DecodeSettings(request.max_new_tokens, params, eos)
    if any(not 0 <= e < config.vocab_size for e in eos):
        raise ValueError(f"eos_token_id must be in the vocabulary [0, {config.vocab_size}), got {list(eos)}")
    drafter = NoDrafter() if drafter is None else drafter
    if not isinstance(drafter, Drafter):
        raise TypeError(f"drafter must be a specjax drafter (sj.drafters.*), got {type(drafter).__name__}")
    sizes = drafter.tree_sizes
    if list(sizes) != sorted(set(sizes)) or sizes[0] < 1 or sizes[-1] != drafter.num_nodes:
        raise ValueError(f"{type(drafter).__name__}.tree_sizes must ascend from >= 1 to num_nodes = "
                         f"{drafter.num_nodes}, got {sizes}")
    if target is not None:
        drafter.check(target)
    verifier = drafter.default_verifier(params) if request.verifier is None else request.verifier
    if not isinstance(verifier, verify.Verifier):
        raise TypeError(f"verifier must be a specjax rule (sj.verify.*), got {type(verifier).__name__}")
    check_positions(config, prompt_len, request.max_new_tokens)
    width = prompt_bucket(prompt_len) if bucketed else prompt_len
    settings = dataclasses.replace(asked, max_new_tokens=bucket(asked.max_new_tokens)) if bucketed else asked
    return Plan(drafter, verifier, settings, constraint, width + settings.max_new_tokens + drafter.num_nodes,
                width, asked.max_new_tokens, bucketed)


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
    extra = batch_bucket(b) - b if plan.bucketed else 0
    rows = np.zeros((b + extra, plan.prompt_len), np.int32)
    rows[:b, : padded.shape[1]] = padded
    rows[b:] = rows[b - 1]
    lens = np.concatenate([lengths, np.repeat(lengths[-1:], extra)])
    budget = np.array([plan.budget] * b + [0] * extra, np.int32)
    return Batch(*(sharding.shard_batch(mesh, x) for x in sharding.pad_batch(mesh, rows, lens, budget)))


class Prepared(NamedTuple):
    """A request ready for the loop: its bucketed plan, the drafter and the batch laid out on
    the model's mesh (None: no mesh), and the number of real rows."""

    plan: Plan
    drafter: Drafter
    rows: Batch
    num_rows: int
    mesh: Any


def prepare(model: Model, prompts, drafter: Drafter | None, request: Request) -> Prepared:
    """generate's, stream's and the adaptive loop's setup (see the module docstring)."""
    padded, lengths = pad_prompts(prompts, model.config.vocab_size)
    p = plan(model.config, model, padded.shape[1], drafter, request, bucketed=True)
    mesh = sharding.mesh_of(model)
    memory.check(model, p, len(padded), compiled_rows=batch_bucket(len(padded)),
                 devices=1 if mesh is None else mesh.shape.get(sharding.DATA, 1))
    drafter = p.drafter if mesh is None else sharding.shard(p.drafter, mesh)
    return Prepared(p, drafter, batch(p, mesh, padded, lengths), len(padded), mesh)


def finish(prepared: Prepared, state: engine.DecodeState, clock: Clock) -> GenerateOutput:
    """The real rows' outputs on the host, with their stats (timed by `clock` up to here)."""
    tokens, num, calls, hist = (x[: prepared.num_rows] for x in sharding.to_host(
        (state.out, state.num_out, state.target_calls, state.accepted_hist)))
    wall, compile_s = clock.read()
    p = prepared.plan
    verifier = (f"none ({'greedy' if p.settings.sampling.greedy else 'sampling'})"
                if isinstance(p.drafter, NoDrafter) else type(p.verifier).__name__)
    return GenerateOutput(np.asarray(tokens)[:, : p.budget], np.asarray(num),
                          Stats.count(p.drafter.name, verifier, num, calls, hist, wall, compile_s))


# ---- public entry points ------------------------------------------------------------------------

def generate(model: Model, prompts, *, max_new_tokens: int = 64, drafter: Drafter | Policy | None = None,
             verifier: verify.Verifier | None = None, temperature: float = 0.0, top_k: int | None = None,
             top_p: float | None = None, key: jax.Array | None = None, eos_token_id=None,
             constraint: constraints.Constraint | None = None) -> GenerateOutput:
    """Generate up to `max_new_tokens` per prompt; the whole loop is one compiled while_loop.
    `drafter=None` is plain autoregressive decoding, `sj.Adaptive(...)` chooses the speculation
    length as it goes; `verifier=None` picks the exact rule that fits the drafter and the
    temperature. Prompt length, max_new_tokens and batch size are padded to buckets (see
    `prompt_bucket`, `batch_bucket`), so varied requests reuse a few compiled programs; a new
    drafter, verifier, sampling setting or EOS list compiles anew. The stats give decoding
    time (`wall_time_s`, `tokens_per_s`) without compilation, and `compile_s` apart. A model
    laid out on a mesh (`sj.shard`) decodes sharded: the batch over 'data', the drafter laid
    out on the same mesh.
    `constraint` (`sj.constraints.json_schema` / `regex` / `grammar`, or a list of them or None,
    one a row) restricts the output to its language: the target's logits are masked to the
    allowed tokens before processing (so p is renormalised over them), which keeps every exact
    verifier exact for the constrained distribution; the constraint's EOS ids end rows."""
    request = Request(max_new_tokens, verifier, temperature, top_k, top_p, eos_token_id, constraint)
    key = jax.random.key(0) if key is None else key
    if isinstance(drafter, Policy):
        return drafter.generate(model, prompts, request, key)
    return run(model, prompts, drafter, request, key)


def run(model: Model, prompts, drafter: Drafter | None, request: Request, key: jax.Array) -> GenerateOutput:
    """`generate` with a drafter (not a Policy) and its options as a Request."""
    prepared = prepare(model, prompts, drafter, request)
    p, rows, clock = prepared.plan, prepared.rows, Clock()
    with sharding.use_mesh(prepared.mesh):
        state = _decode_jit(model, prepared.drafter, rows.prompts, rows.lengths, key, constraint=p.constraint,
                            budget=rows.budget, settings=p.settings, verifier=p.verifier, cache_len=p.cache_len)
    return finish(prepared, state, clock)


def stream(model: Model, prompt: Sequence[int], *, max_new_tokens: int = 64, drafter: Drafter | None = None,
           verifier: verify.Verifier | None = None, temperature: float = 0.0, top_k: int | None = None,
           top_p: float | None = None, key: jax.Array | None = None, eos_token_id=None,
           constraint: constraints.Constraint | None = None) -> Iterator[list[int]]:
    """Yield the new token ids of one prompt as each jitted step produces them (a host loop over
    the same step `generate` compiles into its while_loop, for CLIs; shapes bucketed as there).
    The generator's return value (StopIteration.value) is the `Stats`, with the same timing as
    `generate`'s: decoding alone, and `compile_s` apart. `constraint` as in generate.
    The inputs are checked by this call, not at the first token."""
    request = Request(max_new_tokens, verifier, temperature, top_k, top_p, eos_token_id, constraint)
    prepared = prepare(model, [list(prompt)], drafter, request)
    return _stream_steps(model, prepared, jax.random.key(0) if key is None else key)


def _stream_steps(model: Model, prepared: Prepared, key: jax.Array) -> Iterator[list[int]]:
    p, rows, clock = prepared.plan, prepared.rows, Clock()
    with sharding.use_mesh(prepared.mesh):  # a sharded model: traced for its mesh
        state = _prefill_jit(model, prepared.drafter, rows.prompts, rows.lengths, key, constraint=p.constraint,
                             budget=rows.budget, settings=p.settings, cache_len=p.cache_len)
    emitted = 0
    while True:
        with sharding.use_mesh(prepared.mesh):
            state, _ = _step_jit(model, prepared.drafter, state, settings=p.settings, verifier=p.verifier)
        out, num, done = sharding.to_host((state.out, state.num_out, state.done))
        if num[0] > emitted:  # slice on the host: a device slice would compile per (start, stop)
            yield out[0, emitted: num[0]].tolist()
            emitted = int(num[0])
        if done[0]:
            return finish(prepared, state, clock).stats


def make_generate(config: ModelConfig, *, prompt_len: int, max_new_tokens: int = 64,
                  drafter: Drafter | None = None, verifier: verify.Verifier | None = None,
                  temperature: float = 0.0, top_k: int | None = None, top_p: float | None = None,
                  eos_token_id=None, constraint: constraints.Constraint | None = None):
    """The decode loop as a pure function `(params, prompts int[B, prompt_len], lengths int[B],
    key, drafter=drafter) -> (tokens int32[B, max_new_tokens], num_tokens int32[B])`, for use
    inside the caller's jit / vmap / sharded pipeline. Prompts are right-padded with ids in
    [0, vocab_size) and 1 <= lengths[b] <= prompt_len: called with concrete arrays it checks
    that; traced, it cannot, and out-of-range ids would read clamped embeddings. Pass the
    drafter as an argument to keep its weights traced rather than baked in. Sharded (params
    from `sj.shard`, prompts from `sj.sharding.shard_batch`): trace it under
    `jax.set_mesh(mesh)`, which pins the KV caches and keeps the Pallas kernels out.
    `constraint` as in `generate` (its EOS ids end rows)."""
    p = plan(config, None, prompt_len, drafter,
             Request(max_new_tokens, verifier, temperature, top_k, top_p, eos_token_id, constraint))

    def generate_fn(params, prompts, lengths, key, drafter=p.drafter):
        if not isinstance(prompts, jax.core.Tracer) and not isinstance(lengths, jax.core.Tracer):
            _check_padded(np.asarray(prompts), np.asarray(lengths), config.vocab_size, prompt_len)
        s = engine.decode(Model(params, config), drafter, prompts, lengths, key, constraint=p.constraint,
                          settings=p.settings, verifier=p.verifier, cache_len=p.cache_len)
        return s.out, s.num_out

    return generate_fn


def _check_padded(prompts: np.ndarray, lengths: np.ndarray, vocab_size: int, prompt_len: int) -> None:
    if prompts.ndim != 2 or prompts.shape[1] != prompt_len or lengths.shape != prompts.shape[:1]:
        raise ValueError(f"prompts must be int[B, {prompt_len}] and lengths int[B], got "
                         f"{list(prompts.shape)} and {list(lengths.shape)}")
    if np.any((lengths < 1) | (lengths > prompt_len)):
        raise ValueError(f"lengths must be in [1, {prompt_len}], got {lengths.tolist()}")
    check_tokens(prompts, vocab_size, lengths, "prompts")


_decode_jit = jax.jit(engine.decode, static_argnames=("settings", "verifier", "cache_len"))
_prefill_jit = jax.jit(engine.prefill, static_argnames=("settings", "cache_len"))
_step_jit = jax.jit(engine.step, static_argnames=("settings", "verifier"), donate_argnames=("state",))
