"""The Medusa drafter: K parallel heads (`specjax.heads.medusa`) on the target's last hidden
state draft Medusa's static sparse tree (`sparse_tree`). Trees are deterministic top-k
expansions (q = None): Greedy is exact at temperature 0 and TopK when sampling; Medusa's typical
acceptance (`sj.verify.Typical`) is opt-in and lossy. Checkpoints: `specjax.convert.heads`."""

from __future__ import annotations

import dataclasses
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from specjax.convert import heads as ckpt
from specjax.drafters.base import Context, Drafter
from specjax.drafters.blocks import feature_cache
from specjax.heads import medusa as medusa_head
from specjax.heads import vocab
from specjax.models import Model, float_lm_head
from specjax.pytrees import register_dataclass
from specjax.tree import DraftTree, Template, row_gather
from specjax.tree.sparse import checked_accuracy, geometric_prior, sparse_tree


class MedusaState(NamedTuple):
    hidden: jax.Array  # float32[B, E]: the target's final normed hidden of the last accepted token


@register_dataclass
@dataclasses.dataclass(frozen=True)
class Medusa(Drafter):
    """Medusa heads (see `specjax.heads.medusa`) drafting a static sparse tree of `tree_size`
    nodes built from the per-head per-rank accuracies `accuracy` ([K][R], measured on held-out
    text by the trainer; a geometric prior when None). State: the target's final normed hidden
    of the last accepted token, whose heads propose the tokens after the root."""

    params: dict
    num_layers: int = dataclasses.field(default=1, metadata=dict(static=True))
    tree_size: int = dataclasses.field(default=16, metadata=dict(static=True))
    accuracy: tuple | None = dataclasses.field(default=None, metadata=dict(static=True))

    name = "medusa"

    def __post_init__(self):
        object.__setattr__(self, "accuracy", checked_accuracy(self.tree_size, self.accuracy))

    @property
    def template(self) -> Template:
        return sparse_tree(self.accuracy or geometric_prior(medusa_head.num_heads(self.params), 0.6),
                           self.tree_size)

    num_nodes = property(lambda self: self.tree_size)
    max_depth = property(lambda self: self.template.max_depth)

    def check(self, target: Model) -> None:
        k, e = self.params["b1"].shape
        c = target.config
        vocab.check_ids(self.params, c.vocab_size, "Medusa")
        want = len(self.params["d2t"]) if "d2t" in self.params else c.vocab_size  # its W2's columns
        v = self.params["w2"].shape[2] if "w2" in self.params else want
        if (e, v) != (c.hidden_size, want):
            raise ValueError(f"Medusa heads are for hidden size {e} and vocabulary {v}, but the target "
                             f"has hidden size {c.hidden_size} and vocabulary {c.vocab_size}")
        if self.accuracy is not None and len(self.accuracy) != k:
            raise ValueError(f"accuracy has {len(self.accuracy)} rows for {k} heads")

    def init(self, target, prompts, lengths, cache_len, prefill=None):
        if prefill is None:
            return MedusaState(jnp.zeros((prompts.shape[0], target.config.hidden_size), jnp.float32))
        return MedusaState(feature_cache.last_feature(prefill.hidden, lengths).astype(jnp.float32))

    def propose(self, state, ctx: Context, key):
        t = self.template
        # heads without their own LM head share the target's
        head = None if "w2" in self.params else float_lm_head(ctx.model.config, ctx.model.params)
        logits = medusa_head.apply(self.params, state.hidden, self.num_layers, head)  # [B,K,V]
        top = vocab.target_ids(self.params, jax.lax.top_k(logits, min(t.num_ranks, logits.shape[-1]))[1])
        rank_c = np.minimum(t.rank, top.shape[-1] - 1)
        drafted = top[:, np.maximum(t.depth[1:] - 1, 0), rank_c[1:]]  # [B, N-1]
        tokens = jnp.concatenate([ctx.root[:, None], drafted.astype(jnp.int32)], axis=1)
        return DraftTree.build(tokens, t.parents, max_depth=self.max_depth), state

    def update(self, state, ctx, tree, verdict, target_out):
        return MedusaState(row_gather(target_out.hidden, verdict.last_node).astype(jnp.float32))

    # ---- checkpoints ---------------------------------------------------------------------------

    def save(self, folder, target: Model | None = None) -> None:
        """Write the specjax format: head.json + head.safetensors (with `target`, the shape of
        the target it drafts for, by which the named drafter finds a shipped head)."""
        k, e = self.params["b1"].shape
        v = self.params["w2"].shape[2] if "w2" in self.params else None
        meta = {"num_heads": k, "hidden_size": e, "vocab_size": v, "num_layers": self.num_layers,
                "tree_size": self.tree_size, "accuracy": self.accuracy}
        if target is not None:
            meta["target"] = ckpt.target_signature(target.config)
        ckpt.save_head(folder, "medusa", self.params, meta)

    @classmethod
    def load(cls, path, *, allow_pickle: bool = False, **settings) -> "Medusa":
        """A specjax head folder, 'tiny', or Medusa's published `medusa_lm_head.safetensors`
        (a file or a folder holding it; head count and layers inferred from the keys)."""
        params, stored = ckpt.read_medusa(path, allow_pickle)
        return cls(params, **{**stored, **settings})
