"""DEL: context-aware dynamic exit layer (Entezari Zarch et al., arXiv 2504.05598, COLM 2025;
code hoenza/DEL): the draft is the target's first l layers read through its own final norm and
LM head (early exit, as LayerSkip), with l and the draft length chosen per row, each step,
from tracked per-layer acceptance.

- Shadow tokens: the verify forward also returns the outputs of the candidate exit layers
  (`target_layers`); `update` reads them through the LM head at the accepted path, where the
  target's own argmax is known, and compares. An exit-l draft at a position is exactly this
  shadow token (its first l layers see the same tokens and the same cached K/V as the
  target's), so each step measures every candidate exit at once. alpha_l per row is an
  exponential moving average of the agreement rate (weight 1 - `decay` on the newest step),
  started from the prompt's last `window` positions (the prefill's layer outputs).
- Token-per-layer: each row takes the exit l and length d (0..`depth`) maximising
  TPL(l, d) = (1 - alpha_l^(d+1)) / (1 - alpha_l) / (d (l + h) + L + h), expected tokens per
  layer read. h is the LM head's cost in layers (vocab x hidden over a layer's weights: about
  8 layers on SmolLM2-135M, where the paper's 7B models make it under 1 and leave it out).
  d = 0 (no draft: an AR step) wins when no exit agrees enough.
- Dynamic draft exiting: a row also stops after a token drafted with confidence below
  `threshold` (`specjax.drafters.blocks.self_draft`).

Adapted: exits are a static set (`exits`, layer counts), since each is an extra LM-head read
in `update` (the paper decodes every layer); rows of a batch share one forward, which runs the
deepest exit any row chose (a row's stream stops at its own); the model need not be trained
with LayerSkip's early-exit loss, which the paper's models are (an untrained intermediate
layer agrees less, and TPL then picks d = 0).
"""

from __future__ import annotations

import dataclasses
from typing import NamedTuple

import jax
import jax.numpy as jnp

from pallas_kernels import argmax
from specjax.drafters.blocks import self_draft
from specjax.drafters.base import Context
from specjax.models import Model, ModelConfig, lm_head
from specjax.models.layer_skip import exit_logits
from specjax.pytrees import register_dataclass


def spread_exits(num_layers: int, count: int = 4) -> tuple[int, ...]:
    """`count` exit layers spread over the upper half of the model: l = L/2 .. L - L/8."""
    top = max(1, num_layers - max(1, num_layers // 8))
    return tuple(sorted({max(1, min(num_layers - 1, round(num_layers / 2 + i * (top - num_layers / 2)
                                                             / max(count - 1, 1))))
                         for i in range(count)}))


def head_layers(config: ModelConfig) -> float:
    """The LM head's weights in units of one decoder layer's."""
    c = config
    attention = c.hidden_size * (2 * c.num_heads + 2 * c.num_kv_heads) * c.head_dim
    return c.vocab_size * c.hidden_size / (attention + 3 * c.hidden_size * c.intermediate_size)


class DELState(NamedTuple):
    alpha: jax.Array  # float32[B, len(exits)]: tracked agreement of each exit with the target


@register_dataclass
@dataclasses.dataclass(frozen=True)
class DEL(self_draft.SelfDrafter):
    """DEL over the candidate exit layers `exits` (layer counts in 1..L-1; see spread_exits)."""

    exits: tuple[int, ...] = dataclasses.field(metadata=dict(static=True))
    depth: int = dataclasses.field(default=6, metadata=dict(static=True))
    threshold: float = dataclasses.field(default=0.5, metadata=dict(static=True))
    decay: float = dataclasses.field(default=0.8, metadata=dict(static=True))
    window: int = dataclasses.field(default=8, metadata=dict(static=True))

    name = "del"

    def __post_init__(self):
        if not self.exits or list(self.exits) != sorted(set(self.exits)) or self.exits[0] < 1:
            raise ValueError(f"exits must be ascending layer counts >= 1, got {self.exits}")
        self_draft.check_positive_ints(self, "depth", "window")
        if not 0.0 <= self.decay < 1.0:
            raise ValueError(f"decay must be in [0, 1), got {self.decay}")

    @property
    def target_layers(self) -> tuple[int, ...]:
        return tuple(e - 1 for e in self.exits)  # exit after l layers = decoder layer l - 1's output

    def check(self, target: Model) -> None:
        if self.exits[-1] >= target.config.num_layers:
            raise ValueError(f"exits must be below the target's {target.config.num_layers} layers, "
                             f"got {self.exits}")

    def init(self, target, prompts, lengths, cache_len, prefill=None):
        """alpha from the prompt's last `window` positions: each exit's argmax against the
        target's (the prefill's final hidden state)."""
        b = prompts.shape[0]
        if prefill is None:
            return DELState(jnp.zeros((b, len(self.exits)), jnp.float32))
        pos = lengths[:, None] - 2 - jnp.arange(self.window)[None, :]  # predicting prompt tokens
        seen = pos >= 0
        at = lambda x: jnp.take_along_axis(x, jnp.maximum(pos, 0)[:, :, None], axis=1)
        want = argmax(lm_head(target.config, target.params, at(prefill.hidden)))
        return DELState(self._agreement(target, jax.vmap(at)(prefill.layer_hidden), want, seen))

    def _agreement(self, target: Model, layer_hidden: jax.Array, want: jax.Array, seen: jax.Array) -> jax.Array:
        """float32[B, exits]: the share of the `seen` positions (bool[B, P]) where each exit's
        argmax (layer_hidden [exits, B, P, E]) equals `want` int[B, P]; 0 where none is seen."""
        shadow = argmax(exit_logits(target.config, target.params, layer_hidden))
        hits = jnp.sum((shadow == want[None]) & seen[None], -1).T
        return hits / jnp.maximum(seen.sum(-1), 1)[:, None]

    def choose(self, alpha: jax.Array, config: ModelConfig) -> tuple[jax.Array, jax.Array]:
        """Per row, the exit (layer count) and draft length maximising TPL."""
        d = jnp.arange(self.depth + 1, dtype=jnp.float32)
        exits = jnp.asarray(self.exits, jnp.float32)
        a = jnp.clip(alpha, 0.0, 0.999)[:, :, None]  # [B, E, 1]
        tokens = (1 - a ** (d + 1)) / (1 - a)
        h, layers = head_layers(config), config.num_layers
        tpl = tokens / (d * (exits[:, None] + h) + layers + h)  # [B, E, D+1]
        best = jnp.argmax(tpl.reshape(alpha.shape[0], -1), -1)
        return jnp.asarray(self.exits, jnp.int32)[best // (self.depth + 1)], (best % (self.depth + 1)).astype(jnp.int32)

    def propose(self, state: DELState, ctx: Context, key):
        cfg = ctx.model.config
        exit_layer, length = self.choose(state.alpha, cfg)
        keep = jnp.arange(cfg.num_layers)[None, :] < exit_layer[:, None]
        return self_draft.draft_chain(ctx, key, keep, keep, self.depth, self.threshold, length), state

    def update(self, state: DELState, ctx: Context, tree, verdict, target_out):
        """Shadow tokens at the accepted path against the target's argmax there."""
        path = verdict.path
        seen = jnp.arange(path.shape[1])[None, :] <= verdict.num_accepted[:, None]
        want = argmax(jnp.take_along_axis(target_out.logits, path[:, :, None], axis=1))
        at_path = jax.vmap(lambda x: jnp.take_along_axis(x, path[:, :, None], axis=1))(target_out.layer_hidden)
        rate = self._agreement(ctx.model, at_path, want, seen)
        return DELState(self.decay * state.alpha + (1 - self.decay) * rate)
