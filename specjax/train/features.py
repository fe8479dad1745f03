"""The target's features for head training, computed once so that training never runs the
target: at every position of every (prompt + answer) sequence, the outputs of the decoder layers
the heads read (EAGLE-3's three fused layers, and the last layer, from which Medusa, Clover and
EAGLE-1 get the final normed hidden) in float16, and the target's top-k next-token ids and
probabilities (the soft targets, instead of all V logits). The prompt positions are kept as
the draft's attention context; losses belong on positions >= answer_start - 1. Then the draft
vocabulary from the answers' token counts (`train.draft_vocab`).

`features/` holds one shard per answer shard (same index): `tokens`, `offsets`, `answer_start`
(as in the answers), `hidden` float16 [N, len(layers), E] over the N packed positions,
`topk_ids` [N, k] (uint16 when the vocabulary fits) and `topk_probs` float16 [N, k]; and
`counts.npy`, `d2t.npy`, `vocab.json` (size and coverage)."""

from __future__ import annotations

import functools
import json
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
from tqdm import tqdm

from specjax.decoding import bucket
from specjax.heads.eagle import EagleConfig
from specjax.models import ModelConfig, forward
from specjax.models.llama import lm_head
from specjax.train import shards
from specjax.train.draft_vocab import coverage, draft_vocabulary, token_counts
from specjax.train.selfdistill import sequences

COVERAGE_SIZES = (4096, 8192, 16384, 32768)


def default_layers(config: ModelConfig) -> tuple[int, ...]:
    """EAGLE-3's default taps for this target and its last layer."""
    return tuple(sorted({*EagleConfig.for_target(config, 3).target_layers, config.num_layers - 1}))


@functools.partial(jax.jit, static_argnames=("config", "layers", "top_k"))
def target_features(config: ModelConfig, params: dict, tokens: jax.Array, *, layers: tuple[int, ...],
                    top_k: int):
    """tokens int[B, T] (T a multiple of min(T, 256)) -> (layer outputs float16 [len(layers), B, T, E],
    top-k next-token ids int32 [B, T, k] and probabilities float16 [B, T, k]). The LM head runs
    over chunks of 256 positions, so the [B, T, V] logits never exist at once."""
    out = forward(config, params, tokens, return_layers=layers, compute_logits=False)
    b, t, e = out.hidden.shape
    chunk = min(t, 256)

    def top(h):
        logp = jax.nn.log_softmax(lm_head(config, params, h), -1)
        vals, ids = jax.lax.top_k(logp, top_k)
        return ids, jnp.exp(vals).astype(jnp.float16)

    ids, probs = jax.lax.map(top, out.hidden.reshape(b * t // chunk, chunk, e))
    return (out.layer_hidden.astype(jnp.float16), ids.reshape(b, t, top_k), probs.reshape(b, t, top_k))


def _groups(lengths: list[int], max_tokens: int) -> list[list[int]]:
    """Indices (ascending length) in groups whose padded size rows x bucket(longest) fits."""
    order = sorted(range(len(lengths)), key=lambda i: lengths[i])
    groups, cur = [], []
    for i in order:
        if cur and (len(cur) + 1) * bucket(lengths[i]) > max_tokens:
            groups.append(cur)
            cur = []
        cur.append(i)
    return groups + [cur] if cur else groups


def shard_features(model, seqs: list[np.ndarray], layers: tuple[int, ...], top_k: int,
                   max_tokens: int = 4096) -> dict:
    """Packed features of one shard's sequences (see the module docstring)."""
    c = model.config
    hidden, ids, probs = [None] * len(seqs), [None] * len(seqs), [None] * len(seqs)
    for group in _groups([len(s) for s in seqs], max_tokens):
        t = bucket(max(len(seqs[i]) for i in group))
        rows = max(len(group), max_tokens // t)  # a fixed row count per width: few compilations
        batch = np.zeros((rows, t), np.int32)
        for r, i in enumerate(group):
            batch[r, : len(seqs[i])] = seqs[i]
        h, k_ids, k_probs = jax.device_get(target_features(c, model.params, batch, layers=layers, top_k=top_k))
        if not np.isfinite(h).all():
            raise ValueError("a layer output overflows float16; this target needs a wider feature cache")
        for r, i in enumerate(group):
            n = len(seqs[i])
            hidden[i], ids[i], probs[i] = h[:, r, :n].transpose(1, 0, 2), k_ids[r, :n], k_probs[r, :n]
    id_type = np.uint16 if c.vocab_size <= 1 << 16 else np.int32
    tokens, offsets = shards.pack(seqs)
    return {"tokens": tokens, "offsets": offsets, "hidden": np.concatenate(hidden),
            "topk_ids": np.concatenate(ids).astype(id_type), "topk_probs": np.concatenate(probs)}


def cache_features(model, answers: str | Path, out: str | Path, *, layers=None, top_k: int = 16,
                   draft_vocab: int = 16384, progress: bool = True) -> Path:
    """Write the feature shard of every finished answer shard that lacks one, then the draft
    vocabulary; returns the features folder."""
    c = model.config
    layers = default_layers(c) if layers is None else tuple(layers)
    answers_meta = json.loads((Path(answers) / "meta.json").read_text())
    folder = shards.open_run(out, {"layers": list(layers), "top_k": top_k, "answers": answers_meta})
    todo = shards.finished(answers)
    bar = tqdm(total=len(todo), desc="features", unit="shard", disable=not progress, dynamic_ncols=True)
    for i in todo:
        if not shards.is_done(folder, i):
            t0 = time.perf_counter()
            a = shards.read_shard(answers, i)
            seqs = [np.asarray(shards.unpack(a["tokens"], a["offsets"], j)) for j in range(len(a["offsets"]) - 1)]
            shards.write_shard(folder, i, {**shard_features(model, seqs, layers, top_k),
                                           "answer_start": np.asarray(a["answer_start"])})
            bar.set_postfix(tok_s=f"{sum(map(len, seqs)) / (time.perf_counter() - t0):.0f}")
        bar.update()
    bar.close()
    write_vocabulary(answers, folder, c.vocab_size, draft_vocab)
    return folder


def write_vocabulary(answers: str | Path, folder: Path, vocab_size: int, size: int) -> dict:
    """counts.npy, d2t.npy and vocab.json (coverage of the answers' tokens at several sizes)."""
    counts = token_counts(((t, s) for _, t, s in sequences(answers)), vocab_size)
    d2t = draft_vocabulary(counts, size)
    np.save(folder / "counts.npy", counts)
    np.save(folder / "d2t.npy", d2t)
    info = {"draft_vocab": len(d2t), "coverage": coverage(counts, d2t), "answer_tokens": int(counts.sum()),
            "distinct_tokens": int((counts > 0).sum()),
            "coverage_at": {n: coverage(counts, draft_vocabulary(counts, n)) for n in COVERAGE_SIZES if n < vocab_size}}
    (folder / "vocab.json").write_text(json.dumps(info, indent=2) + "\n")
    print(f"draft vocabulary: {len(d2t)} of {vocab_size} ids cover {100 * info['coverage']:.2f}% of "
          f"{info['answer_tokens']} answer tokens")
    return info
