"""Masked-diffusion decoding: a bidirectional model (`ModelConfig.mask_token_id`) fills a canvas
of MASK slots, several per forward, by the rules of the parallel-decoding literature."""

from specjax.diffusion.canvas import Canvas, key_mask, make_canvas

__all__ = ["Canvas", "key_mask", "make_canvas"]
