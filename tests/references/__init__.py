"""What transformers computes on the real GGUFs the suite tests (SmolLM2-135M-Instruct, Gemma 3
270M): loading them through transformers' GGUF reader takes a minute a model (it dequantizes
every tensor in Python), so its outputs are stored here, next to the sha256 of the file and the
inputs they came from. A test reads them with `transformers_reference`; when the installed file or
the inputs differ from those stored, it computes them afresh with transformers instead.
`python -m tests.references` rewrites the stored ones."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any, Callable

import numpy as np
from scipy.special import logsumexp

HERE = Path(__file__).parent
TOP = 16  # each position's highest logits kept, beside SPREAD fixed vocabulary ids
SPREAD = 64


def sha256(path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 24), b""):
            digest.update(block)
    return digest.hexdigest()


def transformers_reference(name: str, gguf_path, inputs: dict, compute: Callable[[Path, dict], dict]) -> dict:
    """`compute(gguf_path, inputs)` (transformers' outputs, JSON-able) as stored in `<name>.json` for
    this file and these inputs, else computed now."""
    digest = sha256(gguf_path)
    stored = HERE / f"{name}.json"
    if stored.exists():
        saved = json.loads(stored.read_text())
        if saved["gguf_sha256"] == digest and saved["inputs"] == json.loads(json.dumps(inputs)):
            return saved["outputs"]
    return compute(Path(gguf_path), inputs)


def store(name: str, gguf_path, inputs: dict, compute: Callable[[Path, dict], dict]) -> Path:
    """Compute the reference with transformers and write it to `<name>.json`."""
    out = HERE / f"{name}.json"
    record = {"gguf_sha256": sha256(gguf_path), "inputs": inputs, "outputs": compute(Path(gguf_path), inputs)}
    out.write_text(json.dumps(record, ensure_ascii=False, separators=(",", ":")) + "\n")
    return out


def hf_logits(model, tokens) -> np.ndarray:
    """A transformers model's logits for a batch of token ids."""
    import torch

    with torch.no_grad():
        return model(torch.tensor(np.asarray(tokens))).logits.numpy()


def logit_sample(logits: np.ndarray) -> dict[str, Any]:
    """A row of logits [T, V] kept as each position's TOP highest and SPREAD fixed ids (values to 7
    digits), and each position's log-sum-exp over the whole vocabulary."""
    logits = np.asarray(logits, np.float64)
    spread = np.random.default_rng(0).choice(logits.shape[-1], SPREAD, replace=False)
    ids = [sorted(set(np.argsort(-row)[:TOP].tolist()) | set(spread.tolist())) for row in logits]
    return {"ids": ids, "values": [[float(f"{row[i]:.7g}") for i in r] for row, r in zip(logits, ids)],
            "logsumexp": [float(f"{v:.7g}") for v in logsumexp(logits, axis=-1)]}


def assert_logits_match(logits, sample: dict, *, atol: float, rtol: float = 0.0) -> None:
    """specjax's logits [T, V] against a `logit_sample` of transformers': the kept values and each
    position's log-sum-exp (where every logit counts)."""
    logits = np.asarray(logits, np.float64)
    got = np.take_along_axis(logits, np.array(sample["ids"]), axis=-1)
    np.testing.assert_allclose(got, np.array(sample["values"]), atol=atol, rtol=rtol)
    np.testing.assert_allclose(logsumexp(logits, axis=-1), sample["logsumexp"], atol=atol, rtol=rtol)
