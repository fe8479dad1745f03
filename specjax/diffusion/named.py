"""The named dLLM samplers: one registry for `python -m specjax generate` on a masked-diffusion
model and for `python -m specjax bench --dllm`."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import jax

from specjax.diffusion.blocks import AdaBlock
from specjax.diffusion.canvas import Canvas
from specjax.diffusion.freedave import freedave
from specjax.diffusion.rules import Credit, Entropy, Factor, Learn2PD, LocalLeap, RandomK, Rule, Threshold, TopK
from specjax.diffusion.sampler import DiffusionOutput, generate
from specjax.models import Model

FILTER_FILE = "learn2pd.npz"
"""A Learn2PD filter shipped beside a model's weights (`learn2pd.save_filter`)."""


@dataclasses.dataclass(frozen=True)
class Sampler:
    """A decoding method: a selection rule over fixed blocks (`adablock`: AdaBlock's blocks;
    `learn2pd`: the model folder's filter at its own block length), or FreeDave with `drafts`
    drafts; `caches`: the caches it is measured with. `eos_exit`: once a row commits EOS, every
    slot after it is EOS (Learn2PD's end-of-text prediction)."""

    description: str
    rule: Rule | None = None
    caches: tuple[str | None, ...] = (None,)
    adablock: bool = False
    learn2pd: bool = False
    drafts: int = 0
    eos_exit: bool = False

    def block_length(self, block: int, filter_params=None) -> int:
        """The block it decodes with: `block`, or the Learn2PD filter's width."""
        return filter_params[0][0].shape[0] if self.learn2pd else block

    def run(self, model: Model, canvas: Canvas, *, gen_length: int, block: int, eos_id: int | None = None,
            delimiters: tuple[int, ...] = (), filter_params=None, cache: str | None = None,
            temperature: float = 0.0, key: jax.Array | None = None) -> DiffusionOutput:
        """Decode `canvas`. `delimiters`: where AdaBlock may end a block; `filter_params`: the
        Learn2PD filter (`learn2pd.load_filter`)."""
        if self.learn2pd and filter_params is None:
            raise ValueError(f"the learn2pd sampler needs a filter ({FILTER_FILE} beside the model)")
        fill = eos_id if self.eos_exit else None
        block = self.block_length(block, filter_params)
        if self.drafts:
            return freedave(model, canvas, gen_length=gen_length, block_length=block, drafts=self.drafts,
                            fill_after_eos=fill)
        rule = Learn2PD(filter_params, block_length=block) if self.learn2pd else self.rule
        blocks = AdaBlock(block, delimiters=delimiters) if self.adablock else block
        return generate(model, canvas, gen_length=gen_length, blocks=blocks, rule=rule, cache=cache,
                        temperature=temperature, key=key, fill_after_eos=fill)


SAMPLERS: dict[str, Sampler] = {
    "static": Sampler("LLaDA low-confidence remasking, 1 token per forward (the baseline)", TopK(1)),
    **{f"topk-{k}": Sampler(f"LLaDA low-confidence remasking, {k} tokens per forward (forced)", TopK(k))
       for k in (2, 4, 8)},
    **{f"random-{k}": Sampler(f"LLaDA random remasking, {k} tokens per forward at positions drawn at random",
                              RandomK(k)) for k in (1, 2, 4, 8)},
    **{f"threshold-{tau}": Sampler(f"Fast-dLLM: the most confident and every one with confidence >= {tau}",
                                   Threshold(tau), caches=(None, "dual")) for tau in (0.9, 0.7, 0.5)},
    "factor-1": Sampler("Fast-dLLM's factor rule, f = 1", Factor(1.0)),
    "localleap": Sampler("LocalLeap: threshold 0.9, relaxed to 0.75 within 4 slots of an anchor", LocalLeap()),
    "credit": Sampler("CreditDecoding: threshold 0.9 on logits fused with decayed trace credits", Credit()),
    "entropy-0.5": Sampler("dParallel's decoding: the lowest-entropy one and every one with entropy < 0.5",
                           Entropy(0.5)),
    "adablock": Sampler("AdaBlock-dLLM over threshold 0.9: a block ends after the most confident delimiter "
                        "(probability >= 0.3) within the next quarter of the slots", Threshold(0.9), adablock=True),
    "learn2pd": Sampler(f"Learn2PD: the filter MLP of MODEL/{FILTER_FILE} (its own block length), "
                        f"with end-of-text prediction", learn2pd=True, eos_exit=True),
    **{f"freedave-{d}": Sampler(f"FreeDave: {d} drafts of static decoding verified per forward (lossless)",
                                drafts=d) for d in (4, 8)},
}


def find(name: str) -> Sampler:
    if name not in SAMPLERS:
        raise ValueError(f"unknown sampler {name!r}; choose from {', '.join(SAMPLERS)}")
    return SAMPLERS[name]


def filter_of(folder: Path) -> tuple | None:
    """The Learn2PD filter shipped in a model folder, or None."""
    from specjax.diffusion.learn2pd import load_filter
    return load_filter(folder / FILTER_FILE) if (folder / FILTER_FILE).is_file() else None
