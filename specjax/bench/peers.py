"""Peer rows for the benchmark: Hugging Face transformers' own decoding on the same weights.

The peer methods are registered in `specjax.methods` (runner "peer"), each with the keywords
it adds to `generate` (greedy `generate`, assisted generation with the shipped draft, prompt
lookup). All load the same
weights as specjax (an HF folder, or a GGUF that transformers dequantizes) with
AutoModelForCausalLM in float32, decode ragged batches left-padded with an attention mask,
greedily with no EOS (so, like the specjax rows, every prompt gets exactly max_new_tokens
tokens), and count the target's forward calls with a hook, so tau = new tokens / target
forwards (the prefill forward, which makes the first token, counts as one; plain AR gives
1.0). transformers' assisted generation and prompt lookup take batch 1 only; those rows are
skipped at larger batches.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

import numpy as np

from specjax import methods
from specjax.stats import Stats


def torch_threads() -> int:
    """Set torch to one thread per core of this machine (what `machine()` reports)."""
    import torch
    n = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    torch.set_num_threads(n)
    return n


def _source(path: str | Path) -> tuple[str, dict]:
    """from_pretrained's folder and keywords for a model path: an HF folder, or a .gguf file (or
    a folder holding one and no config.json), which transformers dequantizes."""
    p = Path(path)
    gguf = p if p.suffix == ".gguf" else None
    if gguf is None and p.is_dir() and not (p / "config.json").exists():
        gguf = next(iter(sorted(p.glob("*.gguf"))), None)
    return (str(p), {}) if gguf is None else (str(gguf.parent), {"gguf_file": gguf.name})


class Peers:
    """transformers models for the peer rows; `decode(method, prompts)` -> (tokens, stats)."""

    def __init__(self, target: str | Path, draft: str | Path | None):
        import torch
        import transformers
        from transformers import AutoModelForCausalLM
        transformers.logging.set_verbosity_error()  # generation-config notices, not problems
        self.torch = torch
        self.threads = torch_threads()

        def load(path):
            folder, kw = _source(path)
            model = AutoModelForCausalLM.from_pretrained(folder, **kw, dtype=torch.float32).eval()
            # No EOS: generate neither stops at it nor, as min_new_tokens would, masks it out of
            # the argmax, so the output stays the greedy one that specjax's rows decode.
            model.generation_config.eos_token_id = None
            return model

        self.model = load(target)
        self.draft = load(draft) if draft is not None else None
        self.calls = 0

        def count(module, args, kwargs, output):
            self.calls += 1
        self.model.register_forward_hook(count, with_kwargs=True)

    def supports(self, method: str, batch: int) -> bool:
        m, _ = methods.find(method)
        if "draft model" in m.needs and self.draft is None:
            return False
        return m.max_batch is None or batch <= m.max_batch

    def _kwargs(self, method: str, max_new_tokens: int) -> dict:
        from transformers import GenerationConfig
        cfg = GenerationConfig(do_sample=False, max_new_tokens=max_new_tokens, eos_token_id=None, pad_token_id=0,
                               num_beams=1)
        return {"generation_config": cfg, **methods.find(method)[0].make(self.model, self.draft)}

    def decode(self, method: str, prompts, max_new_tokens: int) -> tuple[np.ndarray, Stats]:
        """Greedy-decode a batch of token-id lists (ragged allowed); returns int32[B,
        max_new_tokens] and stats (the step counts of transformers' forwards; its wall time
        includes any compiling)."""
        torch = self.torch
        width = max(len(p) for p in prompts)
        ids = torch.zeros((len(prompts), width), dtype=torch.long)
        mask = torch.zeros_like(ids)
        for i, p in enumerate(prompts):  # left padding: every row's last prompt token is at the end
            ids[i, width - len(p):] = torch.as_tensor(np.asarray(p), dtype=torch.long)
            mask[i, width - len(p):] = 1
        self.calls, start = 0, time.perf_counter()
        with torch.inference_mode():
            out = self.model.generate(ids, attention_mask=mask, **self._kwargs(method, max_new_tokens))
        wall = time.perf_counter() - start
        new = out[:, ids.shape[1]:].numpy().astype(np.int32)
        if new.shape[1] != max_new_tokens:
            raise RuntimeError(f"{method} produced {new.shape[1]} tokens, expected {max_new_tokens}")
        n, steps = int(new.size), max(self.calls, 1)
        return new, Stats(method, "transformers greedy", new.shape[1] / steps, self.calls, new.shape[1], self.calls,
                          (), n, wall, 0.0, n / wall)
