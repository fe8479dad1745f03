"""Grammar: the constraint `sj.constraints.json_schema / regex / grammar` return.

Two ways to run it, picked when it is built (`sj.constraints.choose`):

- small languages (enums, short regexes without unbounded repetition) run on the device as a
  `TokenAutomaton` (`automaton`), no host work per step;
- everything else runs llguidance's matchers on the host (`matchers.Matchers`): each step one
  `jax.pure_callback` returns the allowed-token bitmask of every node of every row's draft tree.
  The device carries each row's consumed tokens (`consumed`, `count`), so the callback is a pure
  function of its inputs; the host matchers are a memo of them.

Either way the pytree's shapes depend only on the batch and the vocabulary, so one compiled
decode serves every grammar of a kind; the host side is found through `handle` (a traced
integer) in a registry of live constraints."""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp

from specjax.constraints import matchers
from specjax.constraints.automaton import TokenAutomaton
from specjax.constraints.base import Constraint
from specjax.pytrees import register_dataclass
from specjax.tree import DraftTree, row_gather


@register_dataclass
@dataclasses.dataclass(frozen=True)
class Places:
    """Where each selected node of each row stands in the grammar: masks uint32[B, n, W] (bit t of
    word t // 32: token t allowed after the node), alive bool[B, n] (the node's path is in the
    language), and the tree (tokens, paths, depth of all its nodes) that `advance` reads."""

    masks: jax.Array
    alive: jax.Array
    tokens: jax.Array | None = None
    paths: jax.Array | None = None
    depth: jax.Array | None = None


@register_dataclass
@dataclasses.dataclass(frozen=True)
class Grammar(Constraint):
    """A compiled grammar (JSON schema, regex or Lark), one per row or one for all. Build with
    `sj.constraints.*`. Host mode: `consumed` int32[B, C] / `count` int32[B] after `start`."""

    handle: jax.Array  # int32[]: the host matchers (`matchers.lookup`)
    automaton: TokenAutomaton | None = None  # the device fast path, or None: host matchers
    vocab_size: int = dataclasses.field(default=0, metadata=dict(static=True))
    eos_token_ids: tuple[int, ...] = dataclasses.field(default=(), metadata=dict(static=True))
    consumed: jax.Array | None = None
    count: jax.Array | None = None

    @property
    def on_device(self) -> bool:
        """Whether this grammar runs as a device automaton (no host callback per step)."""
        return self.automaton is not None

    def check(self, vocab_size: int) -> None:
        if self.vocab_size > vocab_size:
            raise ValueError(f"the constraint was built for a vocabulary of {self.vocab_size} "
                             f"tokens, the model has {vocab_size}")

    def start(self, batch: int, max_tokens: int = 0) -> Grammar:
        if self.on_device:
            return dataclasses.replace(self, automaton=self.automaton.start(batch, max_tokens))
        return dataclasses.replace(self, consumed=jnp.zeros((batch, max(max_tokens, 1)), jnp.int32),
                                   count=jnp.zeros((batch,), jnp.int32))

    def nodes(self, tree: DraftTree | None = None, select=slice(None)):
        if self.on_device:
            return self.automaton.nodes(tree, select)
        if tree is None:
            zeros = jnp.zeros((self.count.shape[0], 1), jnp.int32)
            tree = DraftTree.build(zeros, zeros - 1, max_depth=0)
        masks, alive = self._host_masks(tree)
        return Places(masks[:, select], alive[:, select], tree.tokens, tree.paths, tree.depth)

    def prune(self, tree: DraftTree, nodes) -> DraftTree:
        if self.on_device:
            return self.automaton.prune(tree, nodes)
        if tree.q is not None:  # as TokenAutomaton.prune: only deterministic drafts
            return tree
        return DraftTree.build(tree.tokens, tree.parents, valid=tree.valid & nodes.alive,
                               max_depth=tree.max_depth)

    def mask_logits(self, logits: jax.Array, nodes) -> jax.Array:
        if self.on_device:
            return self.automaton.mask_logits(logits, nodes)
        bits = (nodes.masks[..., None] >> jnp.arange(32, dtype=jnp.uint32)) & 1
        allowed = bits.reshape(*nodes.masks.shape[:-1], -1).astype(bool)
        v = logits.shape[-1]
        if allowed.shape[-1] < v:
            allowed = jnp.pad(allowed, [(0, 0)] * (allowed.ndim - 1) + [(0, v - allowed.shape[-1])])
        return jnp.where(allowed[..., :v], logits, -jnp.inf)

    def advance(self, nodes, end: jax.Array, token: jax.Array, active: jax.Array) -> Grammar:
        if self.on_device:
            return dataclasses.replace(self, automaton=self.automaton.advance(nodes, end, token, active))
        path = row_gather(nodes.paths, end)[:, 1:]  # [B, D]: the accepted nodes below the root
        depth = row_gather(nodes.depth, end)
        took = jnp.take_along_axis(nodes.tokens, path, axis=1)
        d = jnp.arange(path.shape[1])[None, :]
        tokens = jnp.concatenate([jnp.where(d < depth[:, None], took, 0), jnp.zeros_like(depth)[:, None]], 1)
        tokens = tokens.at[jnp.arange(tokens.shape[0]), depth].set(token)
        return self._consume(tokens, jnp.where(active, depth + 1, 0))

    def forced_tokens(self, n: int, batch: int) -> tuple[jax.Array, jax.Array, Grammar]:
        if self.on_device:
            tokens, k, automaton = self.automaton.forced_tokens(n, batch)
            return tokens, k, dataclasses.replace(self, automaton=automaton)
        shapes = (jax.ShapeDtypeStruct((batch, n), jnp.int32), jax.ShapeDtypeStruct((batch,), jnp.int32))

        def host(handle, consumed, count):
            return matchers.lookup(handle).forced(consumed, count, n)

        tokens, k = jax.pure_callback(host, shapes, self.handle, self.consumed, self.count,
                                      vmap_method="sequential")
        return tokens, k, self._consume(tokens, k)

    # ---- host mode ------------------------------------------------------------------------------

    def _host_masks(self, tree: DraftTree) -> tuple[jax.Array, jax.Array]:
        b, n = tree.tokens.shape
        words = -(-self.vocab_size // 32)
        shapes = (jax.ShapeDtypeStruct((b, n, words), jnp.uint32), jax.ShapeDtypeStruct((b, n), jnp.bool_))

        def host(handle, consumed, count, tokens, paths, depth, valid):
            return matchers.lookup(handle).tree_masks(consumed, count, tokens, paths, depth, valid)

        return jax.pure_callback(host, shapes, self.handle, self.consumed, self.count, tree.tokens,
                                 tree.paths, tree.depth, tree.valid, vmap_method="sequential")

    def _consume(self, tokens: jax.Array, k: jax.Array) -> Grammar:
        """This grammar with each row's first k[b] of tokens[b] appended to what it consumed."""
        j = jnp.arange(tokens.shape[1])[None, :]
        at = jnp.where(j < k[:, None], self.count[:, None] + j, self.consumed.shape[1])
        consumed = self.consumed.at[jnp.arange(tokens.shape[0])[:, None], at].set(tokens, mode="drop")
        return dataclasses.replace(self, consumed=consumed, count=self.count + k)


def host_grammar(matchers_: matchers.Matchers, vocab_size: int, eos: tuple[int, ...],
                 automaton: TokenAutomaton | None = None) -> Grammar:
    """The Grammar of live `matchers_` (kept alive by the returned object)."""
    g = Grammar(jnp.asarray(matchers_.handle, jnp.int32), automaton, vocab_size, tuple(eos))
    object.__setattr__(g, "_matchers", matchers_)  # the registry holds it weakly: this keeps it
    return g
