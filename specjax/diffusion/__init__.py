"""Masked-diffusion decoding: a bidirectional model (`ModelConfig.mask_token_id`) fills a canvas
of MASK slots, several per forward, by the rules of the parallel-decoding literature.

    canvas = make_canvas(prompts, gen_length=32, mask_id=model.config.mask_token_id)
    out = generate(model, canvas, gen_length=32, blocks=8, rule=Threshold(0.9), cache="dual")
    out.tokens, out.nfe   # int32[B, 32], forwards per row
"""

from specjax.diffusion.blocks import AdaBlock, Blocks
from specjax.diffusion.canvas import Canvas, key_mask, make_canvas
from specjax.diffusion.freedave import freedave
from specjax.diffusion.rules import (Credit, Entropy, Factor, Learn2PD, LocalLeap, Prediction, RandomK, Rule,
                                     Threshold, TopK, predict)
from specjax.diffusion.sampler import CACHES, DiffusionOutput, generate

__all__ = ["AdaBlock", "Blocks", "CACHES", "Canvas", "Credit", "DiffusionOutput", "Entropy", "Factor", "Learn2PD",
           "LocalLeap", "Prediction", "RandomK", "Rule", "Threshold", "TopK", "freedave", "generate", "key_mask",
           "make_canvas", "predict"]
