"""The EAGLE drafter: an EAGLE-1 or EAGLE-3 draft layer (`specjax.heads.eagle`) growing a
dynamic tree from the target's features, one of two kinds (`tree`):
- "topk": EAGLE-2's tree (`specjax.tree.growth.eagle2`), deterministic top-k expansions
  reranked by path probability (q = None): Greedy is exact at temperature 0 and TopK when
  sampling;
- "dyspec": DySpec's dynamic tree (`specjax.tree.growth.dyspec`) over the head's processed
  distribution, children drawn without replacement when sampling (q set: RSD is exact, where
  TopK would treat the drafts as point masses); at temperature 0 the head's top tokens (Greedy).
Checkpoints, including the published EAGLE-1 / EAGLE-3 layouts: `specjax.convert.heads`."""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp

from pallas_kernels import QuantizedWeight
from specjax import sampling, verify
from specjax.convert import heads as ckpt
from specjax.drafters.base import Context, Drafter
from specjax.drafters.blocks import feature_cache
from specjax.heads import eagle as eagle_head
from specjax.heads.eagle import EagleConfig
from specjax.models import Model, float_lm_head
from specjax.pytrees import register_dataclass
from specjax.tree import DraftTree, growth, row_gather

TREES = ("topk", "dyspec")


@register_dataclass
@dataclasses.dataclass(frozen=True)
class Eagle(Drafter):
    """An EAGLE-1 or EAGLE-3 head (see `specjax.heads.eagle`) drafting EAGLE-2's dynamic tree:
    `depth` expansion steps of the `top_k` best beams (top_k children each), then the
    `total_tokens - 1` nodes of highest cumulative draft log-probability, parents first.

    Trees sized by the draft's confidence (off by default): nodes whose path probability is
    below `min_prob` are dropped, the kept ones come first, and the target verifies the
    smallest of `verify_sizes` (and `total_tokens`) that holds them, so an unsure step costs a
    small forward; pick the sizes from the hardware's verify cost (on a CPU: 4 and 8 nodes).

    tree="dyspec" grows DySpec's tree instead (exact under sampling with RSD): `depth` rounds,
    one head step each, that add `widths` nodes in all, the total_tokens - 1 spread evenly,
    earlier rounds first (total_tokens=8, depth=3: (3, 2, 2)); top_k is unused. Its nodes are
    never dropped (min_prob must be 0: dropping a node by its own draft probability breaks
    RSD's exactness), so verify_sizes only matter where the head's support runs out.

    The head keeps its own one-layer KV cache: entry j reads the target's feature at position j
    and the token j+1; each propose first feeds the entries committed since the last one (the
    accepted path's features, handed over by `update`), then grows the tree."""

    params: dict
    config: EagleConfig = dataclasses.field(metadata=dict(static=True))
    top_k: int = dataclasses.field(default=6, metadata=dict(static=True))
    depth: int = dataclasses.field(default=5, metadata=dict(static=True))
    total_tokens: int = dataclasses.field(default=32, metadata=dict(static=True))
    min_prob: float = dataclasses.field(default=0.0, metadata=dict(static=True))
    verify_sizes: tuple[int, ...] = dataclasses.field(default=(), metadata=dict(static=True))
    tree: str = dataclasses.field(default="topk", metadata=dict(static=True))

    def __post_init__(self):
        if self.tree not in TREES:
            raise ValueError(f"unknown EAGLE tree {self.tree!r}; choose from {TREES}")
        for n in ("top_k", "depth", "total_tokens"):
            if not isinstance(getattr(self, n), int) or getattr(self, n) < 1:
                raise ValueError(f"{n} must be an integer >= 1, got {getattr(self, n)!r}")
        cands = self.top_k + (self.depth - 1) * self.top_k ** 2
        if self.tree == "dyspec":
            if not 1 <= self.depth <= self.total_tokens - 1:
                raise ValueError(f"tree='dyspec' adds at least one node per round: depth={self.depth} must be "
                                 f"in [1, total_tokens - 1 = {self.total_tokens - 1}]")
            if self.min_prob != 0.0:
                raise ValueError(f"tree='dyspec' needs min_prob=0 (got {self.min_prob!r}): dropping nodes by "
                                 f"their own draft probability breaks RSD's exactness")
        elif not 2 <= self.total_tokens <= cands + 1:
            raise ValueError(f"total_tokens={self.total_tokens} must be in [2, {cands + 1}] for "
                             f"top_k={self.top_k}, depth={self.depth} ({cands} candidate nodes)")
        if not 0.0 <= self.min_prob < 1.0:
            raise ValueError(f"min_prob must be in [0, 1), got {self.min_prob!r}")
        object.__setattr__(self, "verify_sizes", tuple(self.verify_sizes))
        if any(not isinstance(n, int) or not 1 <= n <= self.total_tokens for n in self.verify_sizes):
            raise ValueError(f"verify_sizes must be node counts in [1, total_tokens={self.total_tokens}], "
                             f"got {self.verify_sizes}")

    @property
    def name(self) -> str:
        return "eagle" if self.config.version == 1 else "eagle3"

    @property
    def num_nodes(self) -> int:
        return self.total_tokens

    @property
    def widths(self) -> tuple[int, ...]:
        """tree="dyspec": nodes added per round, total_tokens - 1 over `depth` rounds."""
        per, extra = divmod(self.total_tokens - 1, self.depth)
        return tuple(per + (r < extra) for r in range(self.depth))

    @property
    def max_depth(self) -> int:
        return min(self.depth, self.total_tokens - 1)

    @property
    def tree_sizes(self) -> tuple[int, ...]:
        return tuple(sorted({*self.verify_sizes, self.total_tokens}))

    @property
    def target_layers(self) -> tuple[int, ...]:
        return self.config.target_layers

    def default_verifier(self, params: sampling.SamplingParams) -> verify.Verifier:
        if params.greedy:
            return verify.Greedy()
        return verify.RSD() if self.tree == "dyspec" else verify.TopK()

    def check(self, target: Model) -> None:
        c, h = target.config, self.config
        if c.hidden_size != h.target_hidden_size:
            raise ValueError(f"EAGLE head is for a target of hidden size {h.target_hidden_size}, but "
                             f"the target has hidden size {c.hidden_size}")
        if c.vocab_size != h.vocab_size:
            raise ValueError(f"EAGLE head is for a vocabulary of {h.vocab_size}, but the target's "
                             f"vocabulary has {c.vocab_size}")
        if "embed" not in self.params and h.hidden_size != c.hidden_size:
            raise ValueError(f"EAGLE head of hidden size {h.hidden_size} has no embedding of its own "
                             f"and the target's has size {c.hidden_size}")
        bad = [i for i in h.target_layers if not 0 <= i < c.num_layers]
        if bad:
            raise ValueError(f"EAGLE-3 target_layers {h.target_layers} out of range for a "
                             f"{c.num_layers}-layer target")

    # ---- state ---------------------------------------------------------------------------------

    def _feature(self, hidden, layer_hidden):
        return eagle_head.target_feature(self.config, self.params, hidden, layer_hidden)

    def init(self, target, prompts, lengths, cache_len, prefill=None):
        f = None if prefill is None else self._feature(prefill.hidden, prefill.layer_hidden)  # [B, T-1, E]
        cache = eagle_head.init_cache(self.config, prompts.shape[0], cache_len)
        return feature_cache.start(functools.partial(self._entries, target), cache,
                                   (self.depth + 1, self.config.hidden_size), f, prompts, lengths)

    def update(self, state, ctx, tree, verdict, target_out):
        hidden = row_gather(target_out.hidden, verdict.path)  # [B, D+1, E]
        lh = target_out.layer_hidden
        layers = None if lh is None else jax.vmap(row_gather, (0, None))(lh, verdict.path)
        return state._replace(feats=self._feature(hidden, layers))

    def _entries(self, target: Model, feats, tokens, pos, mask, cache):
        """The draft layer on new cache entries (a `feature_cache.Run`, given the target)."""
        emb = eagle_head.embed(self.params, target.params["embed"], tokens)
        h, k, v = eagle_head.step(self.config, self.params, emb, feats, pos, cache, mask)
        return h, eagle_head.write(cache, k, v)

    # ---- propose -------------------------------------------------------------------------------

    def propose(self, state, ctx: Context, key):
        cfg, params = self.config, self.params
        head_w = float_lm_head(ctx.model.config, ctx.model.params) if cfg.version == 1 else None
        logits = lambda h: eagle_head.logits(cfg, params, h, head_w)

        # 1. catch up: entries [dc, length - 1) read the features of the accepted path.
        run = functools.partial(self._entries, ctx.model)
        cache, h_root = feature_cache.catch_up(run, state.cache, state.feats, ctx.tokens, ctx.length)

        # 2. grow the tree, one head step per round over its non-root nodes so far.
        b, e = ctx.tokens.shape[0], cfg.hidden_size
        size = self.total_tokens if self.tree == "dyspec" else 1 + (self.depth - 1) * self.top_k
        outs = jnp.zeros((b, size, e), jnp.float32).at[:, 0].set(h_root[:, 0])
        after = functools.partial(self._outputs_after, ctx, cache)
        if self.tree == "dyspec":  # q: the head's processed distribution over the target's vocabulary
            # (an EAGLE-3 draft vocabulary maps through d2t: q is zero outside it, as exact rules allow)
            dist = lambda h: sampling.draft_probs(logits(h), ctx.sampling)
            tree, _ = growth.dyspec(ctx.root, dist(h_root[:, 0]), _mapped(after, dist), outs, key,
                                    widths=self.widths, greedy=ctx.sampling.greedy)
        else:
            logp = lambda h: jnp.maximum(jax.nn.log_softmax(logits(h), -1), -1e4)
            tree, _ = growth.eagle2(ctx.root, logp(h_root)[:, 0], _mapped(after, logp), outs, top_k=self.top_k,
                                    depth=self.depth, num_nodes=self.total_tokens, min_prob=self.min_prob)
        return tree, state._replace(cache=cache)

    def _outputs_after(self, ctx: Context, cache, tree: DraftTree, new: slice, outs):
        """The head's outputs [B, n_new, E] at the `new` nodes of a growing tree, and `outs`
        [B, N, E] (the root's first) with them: one head step over the non-root nodes so far
        (node i reads its parent's output and its own token at entry position root_entry +
        depth(i), seeing its ancestors)."""
        m = new.stop
        feat = row_gather(outs, jnp.maximum(tree.parents[:, 1:m], 0))
        emb = eagle_head.embed(self.params, ctx.model.params["embed"], tree.tokens[:, 1:m])
        pos = tree.positions(feature_cache.root_entry(ctx.length))[:, 1:m]
        out, _, _ = eagle_head.step(self.config, self.params, emb, feat, pos, cache, tree.ancestors[:, 1:m, 1:m])
        out = out[:, new.start - 1:]
        return out, outs.at[:, new].set(out)

    # ---- checkpoints ---------------------------------------------------------------------------

    def save(self, folder, target: Model | None = None) -> None:
        """Write the specjax format: head.json + head.safetensors (with `target`, the shape of
        the target it drafts for, by which the named drafter finds a shipped head). A head
        loaded with quantized weights is not saved: its folder keeps the float ones."""
        if any(map(_is_quantized, jax.tree.leaves(self.params, is_leaf=_is_quantized))):
            raise ValueError("this head drafts with quantized weights: save the float head (load it with "
                             "weights='float') and set `weights` in its head.json to quantize it on load")
        meta = {"config": self.config.to_dict(), "top_k": self.top_k, "depth": self.depth,
                "total_tokens": self.total_tokens, "min_prob": self.min_prob, "verify_sizes": self.verify_sizes,
                "tree": self.tree}
        if target is not None:
            meta["target"] = ckpt.target_signature(target.config)
        ckpt.save_head(folder, "eagle", self.params, meta)

    @classmethod
    def load(cls, path, *, target: Model | None = None, target_layers=None, allow_pickle: bool = False,
             weights: str | None = None, **settings) -> "Eagle":
        """A specjax head folder, 'tiny', or a published EAGLE-1 / EAGLE-3 folder (`config.json`
        + `model.safetensors`, or `pytorch_model.bin` with allow_pickle=True). EAGLE-3
        checkpoints do not record which target layers they fuse: pass `target_layers` or the
        `target` (EAGLE-3's default taps). With `target`, the head is checked against it.
        `weights`: "float", or "int8" / "int4" to draft with the head's matmuls quantized
        (`specjax.heads.eagle.quantize`); default: the folder's head.json `weights`, else float."""
        params, cfg, stored = ckpt.read_eagle(path, target, target_layers, allow_pickle)
        if settings.get("tree", stored.get("tree")) == "dyspec" and "min_prob" not in settings:
            stored.pop("min_prob", None)  # a stored top-k tree's confidence gate: DySpec keeps every node
        stored_weights = stored.pop("weights", "float")
        weights = stored_weights if weights is None else weights
        if weights != "float":
            params = eagle_head.quantize(params, weights)
        d = cls(params, cfg, **{**stored, **settings})
        if target is not None:
            d.check(target)
        return d


def _is_quantized(x) -> bool:
    return isinstance(x, QuantizedWeight)


def _mapped(after, f):
    """A growth callback: `after`'s head outputs at the new nodes mapped by f (to
    distributions or log-probabilities)."""
    def call(tree, new, outs):
        out, outs = after(tree, new, outs)
        return f(out), outs
    return call
