"""The Clover drafter: a Clover head (`specjax.heads.clover`) drafting a static sparse tree.

The head keeps the Augmenting Block's KV cache: entry j reads the target's last-layer output
at position j and the token j+1. Each propose first feeds the entries committed since the last
one (the accepted path's hidden states, handed over by `update`), as EAGLE does, then drafts
Medusa's sparse tree (`medusa_tree`) from the per-depth per-rank accuracies the trainer
measured: a node at depth d with rank r is the r-th best token of head d-1 at its parent, and
a node's head state comes from its parent's and its own token (one RNN step), one batched step
per depth. Trees are deterministic (q = None): Greedy at temperature 0, TopK when sampling.
A head may draft over a reduced vocabulary (params "d2t", `specjax.heads.vocab`).
"""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np

from specjax.convert import heads as ckpt
from specjax.drafters.base import Context, Drafter
from specjax.drafters.blocks import feature_cache
from specjax.heads import clover as clover_head
from specjax.heads import vocab
from specjax.heads.clover import CloverConfig
from specjax.models import Model, float_lm_head
from specjax.pytrees import register_dataclass
from specjax.tree import DraftTree, Template, row_gather
from specjax.tree.sparse import checked_accuracy, geometric_prior, sparse_tree


@register_dataclass
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
    def template(self) -> Template:
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
        vocab.check_ids(self.params, c.vocab_size, "Clover")
        shapes = lambda tree: {k: tuple(int(i) for i in v) for k, v in ckpt.flatten(tree).items() if k != "d2t"}
        want = shapes(clover_head.param_shapes(cfg))
        got = shapes(jax.tree.map(lambda x: x.shape, self.params))
        bad = [f"{k} {got.get(k, 'missing')} (expected {s})" for k, s in want.items() if got.get(k) != s]
        if bad or set(got) - set(want):
            extra = sorted(set(got) - set(want))
            raise ValueError(f"Clover params do not match its config: {', '.join(bad)}"
                             + (f"; unexpected: {', '.join(extra)}" if extra else ""))

    # ---- state ---------------------------------------------------------------------------------

    def init(self, target, prompts, lengths, cache_len, prefill=None):
        f = None if prefill is None else prefill.layer_hidden[0].astype(jnp.float32)  # [B, T-1, E]
        cache = clover_head.init_cache(self.config, prompts.shape[0], cache_len)
        return feature_cache.start(functools.partial(self._entries, target), cache,
                                   (self.max_depth + 1, self.config.hidden_size), f, prompts, lengths)

    def update(self, state, ctx, tree, verdict, target_out):
        feats = row_gather(target_out.layer_hidden[0], verdict.path)  # [B, D+1, E]
        return state._replace(feats=feats.astype(jnp.float32))

    def _entries(self, target: Model, feats, tokens, pos, mask, cache):
        """The Augmenting Block on new cache entries (a `feature_cache.Run`, given the target)."""
        h, k, v = clover_head.block(self.config, self.params, feats, self._embed(target, tokens), pos, mask, cache)
        return h, cache.write(k, v)

    @staticmethod
    def _embed(target: Model, tokens):
        return target.params["embed"][tokens].astype(jnp.float32)

    # ---- propose -------------------------------------------------------------------------------

    def propose(self, state, ctx: Context, key):
        cfg, params = self.config, self.params
        b, head = ctx.tokens.shape[0], vocab.lm_head(params, float_lm_head(ctx.model.config, ctx.model.params))

        # 1. catch up: entries [dc, length - 1) read the hidden states of the accepted path.
        run = functools.partial(self._entries, ctx.model)
        cache, h_root = feature_cache.catch_up(run, state.cache, state.feats, ctx.tokens, ctx.length)

        # 2. the tree, depth by depth: children are ranked tokens of their parent's head.
        parents, rank, depth = self.template.parents, self.template.rank, self.template.depth
        ranks = min(self.template.num_ranks, head.shape[-1])
        tokens = jnp.zeros((b, self.num_nodes), jnp.int32).at[:, 0].set(ctx.root)
        level, out, hstate = np.array([0]), clover_head.first_head(cfg, params, h_root), h_root
        for d in range(1, self.max_depth + 1):
            nodes = np.flatnonzero(depth == d)
            local = np.searchsorted(level, parents[nodes])  # each node's parent within `level`
            top = jax.lax.top_k(clover_head.logits(out, head), ranks)[1]  # [B, |level|, R]
            drafted = vocab.target_ids(params, top[:, local, np.minimum(rank[nodes], ranks - 1)]).astype(jnp.int32)
            tokens = tokens.at[:, nodes].set(drafted)
            if d < self.max_depth:
                out, hstate = clover_head.next_head(cfg, params, hstate[:, local], self._embed(ctx.model, drafted))
                level = nodes
        tree = DraftTree.build(tokens, parents, max_depth=self.max_depth)
        return tree, state._replace(cache=cache)

    # ---- checkpoints ---------------------------------------------------------------------------

    def save(self, folder, target: Model | None = None) -> None:
        """Write the specjax format: head.json + head.safetensors (with `target`, the shape of
        the target it drafts for, by which the named drafter finds a shipped head)."""
        meta = {"config": self.config.to_dict(), "tree_size": self.tree_size, "accuracy": self.accuracy}
        if target is not None:
            meta["target"] = ckpt.target_signature(target.config)
        ckpt.save_head(folder, "clover", self.params, meta)

    @classmethod
    def load(cls, path, *, target: Model | None = None, **settings) -> Clover:
        """A specjax head folder or 'tiny' (the head shipped for the tiny target). `settings`
        override the saved ones (tree_size, accuracy); with `target`, the head is checked
        against it."""
        params, cfg, stored = ckpt.read_clover(path)
        d = cls(params, cfg, **{**stored, **settings})
        if target is not None:
            d.check(target)
        return d
