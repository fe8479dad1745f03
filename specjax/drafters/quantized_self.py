"""The quantized self-draft: the target drafts for itself with a weight-only int8 (or int4)
copy of its matmul weights, reading its own KV cache. The plug-and-play quantized draft of
ML-SpecQD (Georganas et al., arXiv 2503.13565: the target's weights cast to MXFP4 draft for
it), with the shared KV cache of QSpec (Zhao et al., arXiv 2410.11305, EMNLP 2025).

`QuantizedSelf.of(target)` quantizes the target's matmul weights once (`sj.quantize`); the
embedding and norms are the target's own arrays, not copies. Each step drafts a chain of up to
`depth` tokens, one quantized forward per token over the target's committed cache and a scratch
block of the draft's own K/V (`specjax.models.layer_skip`, every sublayer kept), stopping
after a token of confidence below `threshold` (`specjax.drafters.blocks.self_draft`). The
target verifies the chain (greedy, or speculative sampling with the draft's distribution as q),
so the output is the target's own. No training, no second tokenizer, no draft prefill.

Why it pays on a CPU: a decode step reads every weight once, and the int8 kernels read a
quarter of float32's bytes (an int8 SmolLM2-135M step costs about a third of a float32 one),
while the copy agrees with the target on almost every greedy token.

Adapted: QSpec drafts with W4A4 (weights and activations quantized) and verifies with W4A16
the same quantized weights; ML-SpecQD keeps a separate MXFP4 draft with its own cache. Here the
target keeps its own weights (float, usually) and the draft is a weight-only copy whose
activations stay float32, which costs the copy's memory (int8: about a quarter of the float32
weights) and reads the target's K/V for the committed tokens, as QSpec does.
"""

from __future__ import annotations

import dataclasses

import jax.numpy as jnp

from specjax.drafters.base import Context, EmptyState
from specjax.drafters.blocks import self_draft
from specjax.models import Model
from specjax.pytrees import register_dataclass
from specjax.quantize import is_quantized, quantize


@register_dataclass
@dataclasses.dataclass(frozen=True)
class QuantizedSelf(self_draft.SelfDrafter):
    """Draft with `draft`, the target quantized (build it with `QuantizedSelf.of`): chains of up
    to `depth` tokens, each row stopping after a token the draft gives less than `threshold`."""

    draft: Model
    depth: int = dataclasses.field(default=6, metadata=dict(static=True))
    threshold: float = dataclasses.field(default=0.3, metadata=dict(static=True))

    name = "quantized-self"

    def __post_init__(self):
        self_draft.check_positive_ints(self, "depth")
        if not 0.0 <= self.threshold <= 1.0:
            raise ValueError(f"threshold must be in [0, 1], got {self.threshold}")

    @classmethod
    def of(cls, target: Model, mode: str = "int8", **settings) -> "QuantizedSelf":
        """The quantized self-draft of a float `target`: its matmul weights quantized to `mode`
        ("int8" or "int4"; see `sj.quantize`)."""
        if not isinstance(target, Model):
            raise ValueError(f"quantized-self quantizes an sj.Model's weights; got {type(target).__name__}")
        if is_quantized(target):
            raise ValueError("quantized-self needs a target with float weights to quantize, and this "
                             "one is already quantized (load the float model, or use another drafter)")
        return cls(quantize(target, mode), **settings)

    def check(self, target: Model) -> None:
        if self.draft.config != target.config:
            raise ValueError("the quantized self-draft was built from another model: build it with "
                             "QuantizedSelf.of(target) for the target you decode")

    @property
    def supports_chain(self) -> bool:
        return True

    def chain(self, k: int) -> "QuantizedSelf":
        """A chain of up to k drafts; there is no state to keep between steps."""
        return dataclasses.replace(self, depth=k)

    def init(self, target, prompts, lengths, cache_len, prefill=None):
        return EmptyState()

    def propose(self, state, ctx: Context, key):
        b, num_layers = ctx.tokens.shape[0], self.draft.config.num_layers
        keep = jnp.ones((b, num_layers), bool)
        tree = self_draft.draft_chain(ctx, key, keep, keep, self.depth, self.threshold,
                                      jnp.full((b,), self.depth, jnp.int32), params=self.draft.params)
        return tree, state
