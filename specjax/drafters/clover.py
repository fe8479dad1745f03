"""The Clover drafter: a Clover head (`specjax.heads.clover`) drafting a static sparse tree.

The head keeps the Augmenting Block's KV cache: entry j reads the target's last-layer output
at position j and the token j+1. Each propose first feeds the entries committed since the last
one (the accepted path's hidden states, handed over by `update`), as EAGLE does, then drafts
Medusa's sparse tree (`medusa_tree`) from the per-depth per-rank accuracies the trainer
measured: a node at depth d with rank r is the r-th best token of head d-1 at its parent, and
a node's head state comes from its parent's and its own token (one RNN step), one batched step
per depth. Trees are deterministic (q = None): Greedy at temperature 0, TopK when sampling.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np

from specjax.convert import heads as ckpt
from specjax.drafters.base import Context, Drafter
from specjax.drafters.sparse_tree import SparseTree, checked_accuracy, geometric_prior, sparse_tree
from specjax.heads import clover as clover_head
from specjax.heads.clover import CloverConfig
from specjax.models import Model, lm_head_weight
from specjax.tree import DraftTree


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class Clover(Drafter):
    """A Clover head drafting a static sparse tree of `tree_size` nodes from `accuracy`
    ([depth][rank], measured on held-out text by the trainer; a geometric prior over
    `config.num_heads` depths when None)."""

    params: dict
    config: CloverConfig = dataclasses.field(metadata={"static": True})
    tree_size: int = dataclasses.field(default=16, metadata={"static": True})
    accuracy: tuple | None = dataclasses.field(default=None, metadata={"static": True})

    name = "clover"

    def __post_init__(self):
        object.__setattr__(self, "accuracy", checked_accuracy(self.tree_size, self.accuracy))

    @property
    def template(self) -> SparseTree:
        return sparse_tree(self.accuracy or geometric_prior(self.config.num_heads, 0.6), self.tree_size)

    num_nodes = property(lambda self: self.tree_size)
    max_depth = property(lambda self: self.template.max_depth)

    @property
    def target_layers(self) -> tuple[int, ...]:
        return (self.config.target_num_layers - 1,)

    def check(self, target: Model) -> None:
        cfg, c = self.config, target.config
        if (cfg.hidden_size, cfg.vocab_size) != (c.hidden_size, c.vocab_size):
            raise ValueError(f"Clover head is for hidden size {cfg.hidden_size} and vocabulary "
                             f"{cfg.vocab_size}, but the target has hidden size {c.hidden_size} and "
                             f"vocabulary {c.vocab_size}")
        if cfg.target_num_layers != c.num_layers:
            raise ValueError(f"Clover head reads the last layer of a {cfg.target_num_layers}-layer "
                             f"target, but the target has {c.num_layers} layers")
        shapes = lambda tree: {k: tuple(int(i) for i in v) for k, v in ckpt.flatten(tree).items()}
        want = shapes(clover_head.param_shapes(cfg))
        got = shapes(jax.tree.map(lambda x: x.shape, self.params))
        bad = [f"{k} {got.get(k, 'missing')} (expected {s})" for k, s in want.items() if got.get(k) != s]
        if bad or set(got) - set(want):
            extra = sorted(set(got) - set(want))
            raise ValueError(f"Clover params do not match its config: {', '.join(bad)}"
                             + (f"; unexpected: {', '.join(extra)}" if extra else ""))

    # ---- state ---------------------------------------------------------------------------------

    def init(self, target, prompts, lengths, cache_len):
        return self.init_from_prefill(target, prompts, lengths, cache_len, None)

    def init_from_prefill(self, target, prompts, lengths, cache_len, prefill):
        cfg, b = self.config, prompts.shape[0]
        p = target.params
        state = {"cache": clover_head.init_cache(cfg, b, cache_len),
                 "feats": jnp.zeros((b, self.max_depth + 1, cfg.hidden_size), jnp.float32),
                 "embed": p["embed"], "head": lm_head_weight(target.config, p)}
        if prefill is None:
            return state
        f = prefill.layer_hidden[0].astype(jnp.float32)  # [B, T-1, E], positions 0..T-2
        t, cache = f.shape[1], state["cache"]
        if t > 1:  # commit entries 0..length-3: (l_j, x_{j+1})
            pos = jnp.broadcast_to(jnp.arange(t - 1, dtype=jnp.int32), (b, t - 1))
            mask = jnp.broadcast_to(jnp.tril(jnp.ones((t - 1, t - 1), bool)), (b, t - 1, t - 1))
            _, k, v = clover_head.block(cfg, self.params, f[:, :-1], self._embed(state, prompts[:, 1:t]), pos,
                                        mask, cache)
            cache = cache.write(k, v)
        last = jnp.take_along_axis(f, jnp.maximum(lengths - 2, 0)[:, None, None], axis=1)[:, 0]
        return {**state, "cache": cache._replace(lengths=jnp.maximum(lengths - 2, 0)),
                "feats": state["feats"].at[:, 0].set(jnp.where((lengths >= 2)[:, None], last, 0.0))}

    def update(self, state, ctx, tree, verdict, target_out):
        rows = jnp.arange(verdict.path.shape[0])[:, None]
        return {**state, "feats": target_out.layer_hidden[0][rows, verdict.path].astype(jnp.float32)}

    @staticmethod
    def _embed(state, tokens):
        return state["embed"][tokens].astype(jnp.float32)

    # ---- propose -------------------------------------------------------------------------------

    def propose(self, state, ctx: Context, key):
        cfg, params, cache = self.config, self.params, state["cache"]
        b, width = ctx.tokens.shape[0], self.max_depth + 1

        # 1. catch up: entries [dc, length - 1) read the hidden states of the accepted path.
        dc = cache.lengths
        pos = dc[:, None] + jnp.arange(width, dtype=jnp.int32)[None, :]
        tok = jnp.take_along_axis(ctx.tokens, jnp.minimum(pos + 1, ctx.tokens.shape[1] - 1), axis=1)
        causal = jnp.broadcast_to(jnp.tril(jnp.ones((width, width), bool)), (b, width, width))
        h, k, v = clover_head.block(cfg, params, state["feats"], self._embed(state, tok), pos, causal, cache)
        cache = cache.write(k, v)._replace(lengths=jnp.maximum(ctx.length - 1, 0))
        r = jnp.clip(ctx.length - 2 - dc, 0, width - 1)
        h_root = jnp.take_along_axis(h, r[:, None, None], axis=1)  # [B, 1, E]: the entry reading the root

        # 2. the tree, depth by depth: children are ranked tokens of their parent's head.
        parents, rank, depth = self.template.parents, self.template.rank, self.template.depth
        ranks = min(self.template.num_ranks, cfg.vocab_size)
        tokens = jnp.zeros((b, self.num_nodes), jnp.int32).at[:, 0].set(ctx.root)
        level, out, hstate = np.array([0]), clover_head.first_head(cfg, params, h_root), h_root
        for d in range(1, self.max_depth + 1):
            nodes = np.flatnonzero(depth == d)
            local = np.searchsorted(level, parents[nodes])  # each node's parent within `level`
            top = jax.lax.top_k(clover_head.logits(out, state["head"]), ranks)[1]  # [B, |level|, R]
            drafted = top[:, local, np.minimum(rank[nodes], ranks - 1)].astype(jnp.int32)
            tokens = tokens.at[:, nodes].set(drafted)
            if d < self.max_depth:
                out, hstate = clover_head.next_head(cfg, params, hstate[:, local], self._embed(state, drafted))
                level = nodes
        tree = DraftTree.build(tokens, parents, max_depth=self.max_depth)
        return tree, {**state, "cache": cache}

    # ---- checkpoints ---------------------------------------------------------------------------

    def save(self, folder) -> None:
        """Write the specjax format: head.json + head.safetensors."""
        meta = {"config": self.config.to_dict(), "tree_size": self.tree_size, "accuracy": self.accuracy}
        ckpt.save_head(folder, "clover", self.params, meta)

    @classmethod
    def load(cls, path, *, target: Model | None = None, **settings) -> Clover:
        """A specjax head folder or 'tiny' (the head shipped for the tiny target). `settings`
        override the saved ones (tree_size, accuracy); with `target`, the head is checked
        against it."""
        params, meta = ckpt.read_head(ckpt.resolve_head(path, "tiny-clover"), "clover", "Clover")
        kw = {"tree_size": meta.get("tree_size", 16), "accuracy": ckpt.accuracy_table(meta)}
        d = cls(params, CloverConfig.from_dict(meta["config"]), **{**kw, **settings})
        if target is not None:
            d.check(target)
        return d
