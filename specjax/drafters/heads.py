"""Head drafters: Medusa (a static sparse tree from K parallel heads) and EAGLE (EAGLE-2's
dynamic tree from an EAGLE-1 or EAGLE-3 draft layer). Both read what the target computes anyway:
its hidden states, handed over by the engine after the prefill (`init_from_prefill`) and after
every verification (`update`).

Trees are deterministic top-k expansions (q = None), so Greedy is exact at temperature 0 and
TopK when sampling; Medusa's typical acceptance (`sj.verify.Typical`) is available, opt-in and
lossy.

Checkpoints: the specjax format is a folder with `head.json` (kind, shapes, settings) and
`head.safetensors`. `.load` also reads the published layouts: Medusa's
`medusa_lm_head.safetensors` and EAGLE-1/EAGLE-3 folders (`config.json` + `model.safetensors`);
pickles (`.pt`/`.bin`) only with `allow_pickle=True`. `.load('tiny')` loads the heads shipped
for the tiny target.
"""

from __future__ import annotations

import dataclasses
import functools
import heapq
import json
import re
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

from specjax import verify
from specjax.drafters.base import Context, Drafter, template_depth
from specjax.heads import eagle as eagle_head
from specjax.heads import medusa as medusa_head
from specjax.heads.eagle import EagleConfig
from specjax.models import Model, lm_head_weight
from specjax.tree import DraftTree

ASSETS = Path(__file__).resolve().parent.parent / "assets"
HEAD_JSON, HEAD_WEIGHTS = "head.json", "head.safetensors"


# ---- checkpoint helpers --------------------------------------------------------------------------

def _flatten(params: dict, prefix: str = "") -> dict:
    out = {}
    for k, v in params.items():
        if isinstance(v, dict):
            out.update(_flatten(v, f"{prefix}{k}."))
        else:
            out[f"{prefix}{k}"] = np.asarray(v)
    return out


def _unflatten(flat: dict) -> dict:
    out: dict = {}
    for k, v in flat.items():
        *path, leaf = k.split(".")
        d = out
        for p in path:
            d = d.setdefault(p, {})
        d[leaf] = jnp.asarray(v)
    return out


def _save(folder, kind: str, params: dict, meta: dict) -> None:
    from safetensors.numpy import save_file

    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    flat = {k: np.ascontiguousarray(v) for k, v in _flatten(params).items()}
    save_file(flat, str(folder / HEAD_WEIGHTS))
    (folder / HEAD_JSON).write_text(json.dumps({"kind": kind, **meta}, indent=2) + "\n")


def _read_tensors(path: Path, allow_pickle: bool) -> dict:
    """{name: float32/int numpy array} from a safetensors file, or a torch pickle if allowed."""
    if path.suffix == ".safetensors":
        from safetensors.numpy import load_file
        try:
            return load_file(str(path))
        except Exception:  # bfloat16 has no numpy dtype: read through torch
            from safetensors.torch import load_file as load_torch
            return {k: v.float().numpy() if v.is_floating_point() else v.numpy()
                    for k, v in load_torch(str(path)).items()}
    if path.suffix in (".pt", ".bin", ".pth"):
        if not allow_pickle:
            raise ValueError(f"{path} is a pickle, which can run arbitrary code when loaded; pass "
                             f"allow_pickle=True if you trust it (or convert it to safetensors)")
        import torch
        sd = torch.load(str(path), map_location="cpu", weights_only=False)
        return {k: v.float().numpy() if v.is_floating_point() else v.numpy() for k, v in sd.items()}
    raise ValueError(f"{path}: unknown checkpoint format (expected .safetensors, or .pt/.bin with "
                     f"allow_pickle=True)")


def _resolve(path, shipped: str) -> Path:
    if str(path) == "tiny":
        folder = ASSETS / shipped
        if not (folder / HEAD_JSON).is_file():
            raise FileNotFoundError(f"the shipped heads {folder} are not there (not built yet? see "
                                    f"train/make_heads.sh)")
        return folder
    p = Path(path)
    if not p.exists():
        raise FileNotFoundError(f"no head checkpoint at {str(path)!r}")
    return p


def _pick(folder: Path, names: tuple[str, ...], allow_pickle: bool) -> Path:
    for n in names:
        if (folder / n).is_file():
            return folder / n
    raise FileNotFoundError(f"{folder}: no head checkpoint found (looked for {HEAD_JSON} and "
                            f"{', '.join(names)})")


def _require(sd: dict, keys, what: str) -> None:
    missing = [k for k in keys if k not in sd]
    if missing:
        raise KeyError(f"{what} checkpoint is missing key(s): {', '.join(missing)}")


# ---- Medusa --------------------------------------------------------------------------------------

DEFAULT_RANKS = 10


def _default_accuracy(num_heads: int, ranks: int = DEFAULT_RANKS) -> tuple[tuple[float, ...], ...]:
    """A Medusa-like prior when nothing was measured: a_k(r) = 0.6 * 0.6^k * 0.5^r."""
    return tuple(tuple(0.6 * 0.6 ** k * 0.5 ** r for r in range(ranks)) for k in range(num_heads))


@functools.lru_cache(maxsize=64)
def medusa_tree(accuracy: tuple[tuple[float, ...], ...], num_nodes: int) -> tuple[np.ndarray, np.ndarray]:
    """Medusa's sparse tree: the num_nodes - 1 paths (r_1..r_d) of highest value
    prod_j accuracy[j][r_j] (r_j = rank of the token head j-1 proposes), taken greedily (the value
    only drops along a path, so they form a tree), breadth-first with siblings in rank order.
    Returns (parents int32[N], rank int32[N]) (the root has rank -1)."""
    heads, ranks = len(accuracy), len(accuracy[0])
    heap = [(-accuracy[0][r], (r,)) for r in range(ranks)]
    heapq.heapify(heap)
    chosen = []
    while heap and len(chosen) < num_nodes - 1:
        neg, path = heapq.heappop(heap)
        chosen.append(path)
        if len(path) < heads:
            for r in range(ranks):
                heapq.heappush(heap, (neg * accuracy[len(path)][r], path + (r,)))
    if len(chosen) < num_nodes - 1:
        raise ValueError(f"a Medusa tree of {num_nodes} nodes needs more than {heads} heads x {ranks} ranks")
    chosen.sort(key=lambda p: (len(p), p))
    index = {p: i + 1 for i, p in enumerate(chosen)}
    parents = [-1] + [index[p[:-1]] if len(p) > 1 else 0 for p in chosen]
    rank = [-1] + [p[-1] for p in chosen]
    return np.asarray(parents, np.int32), np.asarray(rank, np.int32)


class SparseTree:
    """For drafters of Medusa's static sparse tree (Medusa, Clover, PPD, Hidden Transfer):
    `tree_size` nodes from the per-depth per-rank `accuracy` table (dataclass fields), or from
    the `_prior` table (by default a geometric prior over `_prior_depth` depths) when accuracy
    is None."""

    def __post_init__(self):
        if not isinstance(self.tree_size, int) or self.tree_size < 2:
            raise ValueError(f"tree_size must be an integer >= 2, got {self.tree_size!r}")
        if self.accuracy is not None:
            acc = tuple(tuple(float(a) for a in row) for row in self.accuracy)
            if not acc or not acc[0] or len({len(row) for row in acc}) != 1:
                raise ValueError("accuracy must be a non-empty [depth][rank] table with rows of equal length")
            object.__setattr__(self, "accuracy", acc)

    @property
    def _prior_depth(self) -> int:
        raise NotImplementedError

    @property
    def _prior(self) -> tuple[tuple[float, ...], ...]:
        return _default_accuracy(self._prior_depth)

    @property
    def _accuracy(self) -> tuple[tuple[float, ...], ...]:
        return self.accuracy if self.accuracy is not None else self._prior

    @property
    def _template(self) -> tuple[np.ndarray, np.ndarray]:
        return medusa_tree(self._accuracy, self.tree_size)

    @property
    def num_nodes(self) -> int:
        return self.tree_size

    @property
    def max_depth(self) -> int:
        return int(template_depth(self._template[0]).max())


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class Medusa(SparseTree, Drafter):
    """Medusa heads (see `specjax.heads.medusa`) drafting a static sparse tree of `tree_size`
    nodes built from the per-head per-rank accuracies `accuracy` ([K][R], measured on held-out
    text by the trainer; a geometric prior when None). State: the target's final normed hidden
    of the last accepted token, whose heads propose the tokens after the root."""

    params: dict
    num_layers: int = dataclasses.field(default=1, metadata=dict(static=True))
    tree_size: int = dataclasses.field(default=16, metadata=dict(static=True))
    accuracy: tuple | None = dataclasses.field(default=None, metadata=dict(static=True))

    name = "medusa"

    @property
    def _prior_depth(self) -> int:
        return medusa_head.num_heads(self.params)

    def default_verifier(self, sampling):
        return verify.Greedy() if sampling.greedy else verify.TopK()

    def check(self, target: Model) -> None:
        k, e = self.params["b1"].shape
        v = self.params["w2"].shape[2] if "w2" in self.params else target.config.vocab_size
        c = target.config
        if (e, v) != (c.hidden_size, c.vocab_size):
            raise ValueError(f"Medusa heads are for hidden size {e} and vocabulary {v}, but the target "
                             f"has hidden size {c.hidden_size} and vocabulary {c.vocab_size}")
        if self.accuracy is not None and len(self.accuracy) != k:
            raise ValueError(f"accuracy has {len(self.accuracy)} rows for {k} heads")

    def init_from_prefill(self, target, prompts, lengths, cache_len, prefill):
        b, e = prompts.shape[0], target.config.hidden_size
        state = {"hidden": jnp.zeros((b, e), jnp.float32)}
        if "w2" not in self.params:  # heads that share the target's LM head carry it
            p = target.params
            state["head"] = lm_head_weight(target.config, p)
        if prefill is not None:
            h = jnp.take_along_axis(prefill.hidden, jnp.maximum(lengths - 2, 0)[:, None, None], axis=1)[:, 0]
            state["hidden"] = jnp.where((lengths >= 2)[:, None], h.astype(jnp.float32), 0.0)
        return state

    def init(self, target, prompts, lengths, cache_len):
        return self.init_from_prefill(target, prompts, lengths, cache_len, None)

    def propose(self, state, ctx: Context, key):
        parents, rank = self._template
        depth = template_depth(parents)
        logits = medusa_head.apply(self.params, state["hidden"], self.num_layers, state.get("head"))  # [B,K,V]
        top = jax.lax.top_k(logits, min(int(rank.max()) + 1, logits.shape[-1]))[1]  # [B, K, R]
        rank_c = np.minimum(rank, top.shape[-1] - 1)
        drafted = top[:, np.maximum(depth[1:] - 1, 0), rank_c[1:]]  # [B, N-1]
        tokens = jnp.concatenate([ctx.root[:, None], drafted.astype(jnp.int32)], axis=1)
        return DraftTree.build(tokens, parents, max_depth=self.max_depth), state

    def update(self, state, ctx, tree, verdict, target_out):
        last = jnp.take_along_axis(verdict.path, verdict.num_accepted[:, None], axis=1)  # [B, 1]
        h = jnp.take_along_axis(target_out.hidden, last[:, :, None], axis=1)[:, 0].astype(jnp.float32)
        return {**state, "hidden": h}

    # ---- checkpoints ---------------------------------------------------------------------------

    def save(self, folder) -> None:
        """Write the specjax format: head.json + head.safetensors."""
        k, e = self.params["b1"].shape
        v = self.params["w2"].shape[2] if "w2" in self.params else None
        _save(folder, "medusa", self.params, {"num_heads": k, "hidden_size": e, "vocab_size": v,
                                              "num_layers": self.num_layers, "tree_size": self.tree_size,
                                              "accuracy": self.accuracy})

    @classmethod
    def load(cls, path, *, allow_pickle: bool = False, **settings) -> "Medusa":
        """A specjax head folder, 'tiny', or Medusa's published `medusa_lm_head.safetensors`
        (a file or a folder holding it; head count and layers inferred from the keys)."""
        p = _resolve(path, "tiny-medusa")
        if p.is_dir() and (p / HEAD_JSON).is_file():
            meta = json.loads((p / HEAD_JSON).read_text())
            if meta.get("kind") != "medusa":
                raise ValueError(f"{p} holds a {meta.get('kind')!r} head, not Medusa")
            params = _unflatten(_read_tensors(p / HEAD_WEIGHTS, False))
            kw = dict(num_layers=meta.get("num_layers", 1), tree_size=meta.get("tree_size", 16),
                      accuracy=tuple(map(tuple, meta["accuracy"])) if meta.get("accuracy") else None)
            return cls(params, **{**kw, **settings})
        if p.is_dir():
            p = _pick(p, ("medusa_lm_head.safetensors", "model.safetensors", "medusa_lm_head.pt"), allow_pickle)
        params, layers = medusa_from_state_dict(_read_tensors(p, allow_pickle))
        return cls(params, **{"num_layers": layers, **settings})


def medusa_from_state_dict(sd: dict) -> tuple[dict, int]:
    """Medusa's published keys `{i}.{j}.linear.weight/bias` (j < L) and `{i}.{L}.weight` (torch
    [out, in]) -> (params, L)."""
    heads = sorted({int(m.group(1)) for k in sd if (m := re.match(r"(\d+)\.\d+\.", k))})
    if not heads:
        raise KeyError(f"no Medusa head keys ('{{i}}.0.linear.weight', ...) among: {sorted(sd)[:8]}")
    layers = len({int(m.group(1)) for k in sd if (m := re.match(r"0\.(\d+)\.linear\.weight$", k))})
    if layers == 0:
        raise KeyError("Medusa checkpoint is missing key(s): 0.0.linear.weight")
    k = max(heads) + 1
    need = [f"{i}.{j}.linear.{w}" for i in range(k) for j in range(layers) for w in ("weight", "bias")]
    need += [f"{i}.{layers}.weight" for i in range(k)]
    _require(sd, need, "Medusa")
    w1, b1, w2 = [], [], []
    for i in range(k):
        for j in range(1, layers):
            if not np.array_equal(sd[f"{i}.{j}.linear.weight"], sd[f"{i}.0.linear.weight"]):
                raise ValueError("Medusa ResBlocks with distinct weights per layer are not supported "
                                 "(Medusa's own heads share one ResBlock across layers)")
        w1.append(np.asarray(sd[f"{i}.0.linear.weight"], np.float32).T)
        b1.append(np.asarray(sd[f"{i}.0.linear.bias"], np.float32))
        w2.append(np.asarray(sd[f"{i}.{layers}.weight"], np.float32).T)
    e = w1[0].shape[0]
    for i in range(k):
        if w1[i].shape != (e, e) or b1[i].shape != (e,) or w2[i].shape[0] != e or w2[i].shape != w2[0].shape:
            raise ValueError(f"Medusa head {i} has inconsistent shapes: linear {w1[i].shape[::-1]}, "
                             f"bias {b1[i].shape}, lm head {w2[i].shape[::-1]} (hidden size {e})")
    return {"w1": jnp.asarray(np.stack(w1)), "b1": jnp.asarray(np.stack(b1)),
            "w2": jnp.asarray(np.stack(w2))}, layers


# ---- EAGLE ---------------------------------------------------------------------------------------

@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class Eagle(Drafter):
    """An EAGLE-1 or EAGLE-3 head (see `specjax.heads.eagle`) drafting EAGLE-2's dynamic tree:
    `depth` expansion steps of the `top_k` best beams (top_k children each), then the
    `total_tokens - 1` nodes of highest cumulative draft log-probability, parents first.

    The head keeps its own one-layer KV cache: entry j reads the target's feature at position j
    and the token j+1; each propose first feeds the entries committed since the last one (the
    accepted path's features, handed over by `update`), then grows the tree."""

    params: dict
    config: EagleConfig = dataclasses.field(metadata=dict(static=True))
    top_k: int = dataclasses.field(default=6, metadata=dict(static=True))
    depth: int = dataclasses.field(default=5, metadata=dict(static=True))
    total_tokens: int = dataclasses.field(default=32, metadata=dict(static=True))

    def __post_init__(self):
        for n in ("top_k", "depth", "total_tokens"):
            if not isinstance(getattr(self, n), int) or getattr(self, n) < 1:
                raise ValueError(f"{n} must be an integer >= 1, got {getattr(self, n)!r}")
        cands = self.top_k + (self.depth - 1) * self.top_k ** 2
        if not 2 <= self.total_tokens <= cands + 1:
            raise ValueError(f"total_tokens={self.total_tokens} must be in [2, {cands + 1}] for "
                             f"top_k={self.top_k}, depth={self.depth} ({cands} candidate nodes)")

    @property
    def name(self) -> str:
        return "eagle" if self.config.version == 1 else "eagle3"

    @property
    def num_nodes(self) -> int:
        return self.total_tokens

    @property
    def max_depth(self) -> int:
        return self.depth

    @property
    def target_layers(self) -> tuple[int, ...]:
        return self.config.target_layers

    def default_verifier(self, sampling):
        return verify.Greedy() if sampling.greedy else verify.TopK()

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

    def _target_weights(self, target: Model) -> dict:
        p = target.params
        out = {"embed": p["embed"]}
        if self.config.version == 1:
            out["head"] = lm_head_weight(target.config, p)
        return out

    def _feature(self, hidden, layer_hidden):
        return eagle_head.target_feature(self.config, self.params, hidden, layer_hidden)

    def init(self, target, prompts, lengths, cache_len):
        return self.init_from_prefill(target, prompts, lengths, cache_len, None)

    def init_from_prefill(self, target, prompts, lengths, cache_len, prefill):
        cfg, b = self.config, prompts.shape[0]
        weights = self._target_weights(target)
        cache = eagle_head.init_cache(cfg, b, cache_len)
        feats = jnp.zeros((b, self.depth + 1, cfg.hidden_size), jnp.float32)
        if prefill is None:
            return {"cache": cache, "feats": feats, **weights}
        f = self._feature(prefill.hidden, prefill.layer_hidden)  # [B, T-1, E], positions 0..T-2
        t = f.shape[1]
        if t > 1:  # commit entries 0..length-3: (f_j, x_{j+1})
            emb = eagle_head.embed(self.params, weights["embed"], prompts[:, 1:t])
            pos = jnp.broadcast_to(jnp.arange(t - 1, dtype=jnp.int32), (b, t - 1))
            mask = jnp.broadcast_to(jnp.tril(jnp.ones((t - 1, t - 1), bool)), (b, t - 1, t - 1))
            _, k, v = eagle_head.step(cfg, self.params, emb, f[:, :-1], pos, cache, mask)
            cache = eagle_head.write(cache, k, v)
        cache = cache._replace(lengths=jnp.maximum(lengths - 2, 0))
        last = jnp.take_along_axis(f, jnp.maximum(lengths - 2, 0)[:, None, None], axis=1)[:, 0]
        feats = feats.at[:, 0].set(jnp.where((lengths >= 2)[:, None], last, 0.0))
        return {"cache": cache, "feats": feats, **weights}

    def update(self, state, ctx, tree, verdict, target_out):
        rows = jnp.arange(verdict.path.shape[0])[:, None]
        hidden = target_out.hidden[rows, verdict.path]  # [B, D+1, E]
        layers = None if target_out.layer_hidden is None else target_out.layer_hidden[:, rows, verdict.path]
        return {**state, "feats": self._feature(hidden, layers)}

    # ---- propose -------------------------------------------------------------------------------

    def propose(self, state, ctx: Context, key):
        cfg, params = self.config, self.params
        cache, embed_w = state["cache"], state["embed"]
        head_w = state.get("head")
        b, width = ctx.tokens.shape[0], self.depth + 1
        k, depth, n = self.top_k, self.depth, self.total_tokens
        emb = lambda tok: eagle_head.embed(params, embed_w, tok)
        draft_logp = lambda h: jnp.maximum(jax.nn.log_softmax(eagle_head.logits(cfg, params, h, head_w), -1), -1e4)

        # 1. catch up: entries [dc, length - 1) read the features of the accepted path.
        dc = cache.lengths
        pos = dc[:, None] + jnp.arange(width, dtype=jnp.int32)[None, :]
        tok = jnp.take_along_axis(ctx.tokens, jnp.minimum(pos + 1, ctx.tokens.shape[1] - 1), axis=1)
        causal = jnp.broadcast_to(jnp.tril(jnp.ones((width, width), bool)), (b, width, width))
        h, kk, vv = eagle_head.step(cfg, params, emb(tok), state["feats"], pos, cache, causal)
        cache = eagle_head.write(cache, kk, vv)._replace(lengths=jnp.maximum(ctx.length - 1, 0))
        r = jnp.clip(ctx.length - 2 - dc, 0, width - 1)
        h_root = jnp.take_along_axis(h, r[:, None, None], axis=1)  # [B, 1, E]

        # 2. expand: the top_k beams, top_k children each, for `depth` levels.
        lp, tk = jax.lax.top_k(draft_logp(h_root)[:, 0], k)  # [B, k]
        cand_tok, cand_par, cand_score = [tk], [jnp.full((b, k), -1, jnp.int32)], [lp]
        beam_tok, beam_score, beam_cand = tk, lp, jnp.broadcast_to(jnp.arange(k, dtype=jnp.int32), (b, k))
        beam_feat = jnp.broadcast_to(h_root, (b, k, cfg.hidden_size))
        m = (depth - 1) * k
        ent_tok = jnp.zeros((b, max(m, 1)), jnp.int32)
        ent_feat = jnp.zeros((b, max(m, 1), cfg.hidden_size), jnp.float32)
        ent_anc = jnp.zeros((b, max(m, 1), max(m, 1)), bool)
        beam_entry = jnp.full((b, k), -1, jnp.int32)  # the entry that produced each beam (-1: root)
        rows = jnp.arange(b)[:, None]
        offset = k
        for s in range(1, depth):
            new = np.arange((s - 1) * k, s * k)
            own = jax.nn.one_hot(jnp.asarray(new), max(m, 1), dtype=bool)[None]  # [1, k, M]
            parent_anc = jnp.where((beam_entry >= 0)[:, :, None],
                                   ent_anc[rows, jnp.maximum(beam_entry, 0)], False)
            ent_anc = ent_anc.at[:, new].set(parent_anc | own)
            ent_tok = ent_tok.at[:, new].set(beam_tok)
            ent_feat = ent_feat.at[:, new].set(beam_feat)
            e = s * k
            ent_depth = jnp.asarray(np.repeat(np.arange(1, s + 1), k), jnp.int32)
            pos = (ctx.length - 2)[:, None] + ent_depth[None, :]
            out, _, _ = eagle_head.step(cfg, params, emb(ent_tok[:, :e]), ent_feat[:, :e], pos, cache,
                                        ent_anc[:, :e, :e])
            out = out[:, (s - 1) * k: e]  # [B, k, E]
            clp, ctok = jax.lax.top_k(draft_logp(out), k)  # [B, k, k]
            score = (beam_score[:, :, None] + clp).reshape(b, k * k)
            cand_tok.append(ctok.reshape(b, k * k))
            cand_par.append(jnp.repeat(beam_cand, k, axis=1))
            cand_score.append(score)
            beam_score, best = jax.lax.top_k(score, k)
            beam_tok = jnp.take_along_axis(ctok.reshape(b, k * k), best, axis=1)
            beam_cand = offset + best.astype(jnp.int32)
            beam_entry = (s - 1) * k + (best // k).astype(jnp.int32)
            beam_feat = jnp.take_along_axis(out, (best // k)[:, :, None], axis=1)
            offset += k * k

        # 3. rerank: the n - 1 best candidates (parents score strictly higher or tie at a lower
        #    index, and top_k prefers lower indices), sorted so that parents come first.
        cand_tok, cand_par = jnp.concatenate(cand_tok, 1), jnp.concatenate(cand_par, 1)
        cand_score = jnp.concatenate(cand_score, 1)
        sel = jnp.sort(jax.lax.top_k(cand_score, n - 1)[1], axis=1)  # [B, n-1]
        node_of = jnp.zeros((b, cand_tok.shape[1]), jnp.int32).at[rows, sel].set(
            jnp.arange(1, n, dtype=jnp.int32)[None, :])
        par_cand = jnp.take_along_axis(cand_par, sel, axis=1)
        parents = jnp.where(par_cand < 0, 0, jnp.take_along_axis(node_of, jnp.maximum(par_cand, 0), axis=1))
        tokens = jnp.concatenate([ctx.root[:, None], jnp.take_along_axis(cand_tok, sel, axis=1)], 1)
        parents = jnp.concatenate([jnp.full((b, 1), -1, jnp.int32), parents], 1)
        tree = DraftTree.build(tokens, parents, max_depth=depth)
        return tree, {**state, "cache": cache}

    # ---- checkpoints ---------------------------------------------------------------------------

    def save(self, folder) -> None:
        """Write the specjax format: head.json + head.safetensors."""
        _save(folder, "eagle", self.params, {"config": self.config.to_dict(), "top_k": self.top_k,
                                             "depth": self.depth, "total_tokens": self.total_tokens})

    @classmethod
    def load(cls, path, *, target: Model | None = None, target_layers=None, allow_pickle: bool = False,
             **settings) -> "Eagle":
        """A specjax head folder, 'tiny', or a published EAGLE-1 / EAGLE-3 folder (`config.json`
        + `model.safetensors`, or `pytorch_model.bin` with allow_pickle=True). EAGLE-3
        checkpoints do not record which target layers they fuse: pass `target_layers` or the
        `target` (EAGLE-3's default taps). With `target`, the head is checked against it."""
        p = _resolve(path, "tiny-eagle")
        if p.is_dir() and (p / HEAD_JSON).is_file():
            meta = json.loads((p / HEAD_JSON).read_text())
            if meta.get("kind") != "eagle":
                raise ValueError(f"{p} holds a {meta.get('kind')!r} head, not EAGLE")
            cfg = EagleConfig.from_dict(meta["config"])
            kw = {k: meta[k] for k in ("top_k", "depth", "total_tokens") if k in meta}
            d = cls(_unflatten(_read_tensors(p / HEAD_WEIGHTS, False)), cfg, **{**kw, **settings})
        else:
            folder = p if p.is_dir() else p.parent
            file = _pick(p, ("model.safetensors", "pytorch_model.bin"), allow_pickle) if p.is_dir() else p
            if not (folder / "config.json").is_file():
                raise FileNotFoundError(f"{folder}: a published EAGLE head needs its config.json")
            hf = json.loads((folder / "config.json").read_text())
            params, cfg = eagle_from_state_dict(_read_tensors(file, allow_pickle), hf, target, target_layers)
            d = cls(params, cfg, **settings)
        if target is not None:
            d.check(target)
        return d


_EAGLE_LAYER = {"wq": "self_attn.q_proj", "wk": "self_attn.k_proj", "wv": "self_attn.v_proj",
                "wo": "self_attn.o_proj", "w_gate": "mlp.gate_proj", "w_up": "mlp.up_proj",
                "w_down": "mlp.down_proj"}


def eagle_from_state_dict(sd: dict, hf: dict, target: Model | None = None,
                          target_layers=None) -> tuple[dict, EagleConfig]:
    """EAGLE-1 keys (`fc.weight`, `fc.bias`, `layers.0.*` without input_layernorm,
    `embed_tokens.weight`) or EAGLE-3 keys (`fc.weight`, `midlayer.*`, `norm.weight`,
    `lm_head.weight`, optional `d2t` offsets) + the head's HF config -> (params, EagleConfig)."""
    version = 3 if any(k.startswith("midlayer.") for k in sd) else 1
    pre = "midlayer." if version == 3 else "layers.0."
    need = ["fc.weight"] + [f"{pre}{v}.weight" for v in _EAGLE_LAYER.values()]
    need.append(f"{pre}post_attention_layernorm.weight")
    need += ["fc.bias"] if version == 1 else [f"{pre}input_layernorm.weight", f"{pre}hidden_norm.weight",
                                              "norm.weight", "lm_head.weight"]
    _require(sd, need, f"EAGLE-{version}")
    f32 = lambda k: np.asarray(sd[k], np.float32)
    e = f32("fc.weight").shape[0]
    heads = hf.get("num_attention_heads")
    if heads is None:
        raise KeyError("the EAGLE config.json has no num_attention_heads")
    hd = hf.get("head_dim") or e // heads
    vocab = int(hf.get("vocab_size", sd.get("embed_tokens.weight", np.zeros((0, 0))).shape[0]))
    if version == 3:
        layers = target_layers
        if layers is None and target is not None:
            layers = EagleConfig.for_target(target.config, 3).target_layers
        if layers is None:
            raise ValueError("EAGLE-3 checkpoints do not say which target layers they fuse: pass "
                             "target_layers=(low, mid, high) or target=... to Eagle.load")
    else:
        layers = ()
    cfg = EagleConfig(version=version, hidden_size=e, intermediate_size=f32(f"{pre}mlp.gate_proj.weight").shape[0],
                      num_heads=heads, num_kv_heads=hf.get("num_key_value_heads") or heads, head_dim=hd,
                      vocab_size=vocab, draft_vocab_size=hf.get("draft_vocab_size") or None,
                      target_hidden_size=hf.get("target_hidden_size") or None, target_layers=tuple(layers),
                      rope_theta=float(hf.get("rope_theta", 10000.0)), rms_norm_eps=float(hf.get("rms_norm_eps", 1e-6)),
                      max_position_embeddings=int(hf.get("max_position_embeddings", 2048)))
    width = e if version == 1 else 2 * e
    fc_in = 2 * e if version == 1 else 3 * cfg.target_hidden_size
    if f32("fc.weight").shape != (e, fc_in):
        raise ValueError(f"EAGLE-{version} fc.weight has shape {f32('fc.weight').shape}, expected "
                         f"{(e, fc_in)} (hidden size {e}, target hidden size {cfg.target_hidden_size})")
    layer = {ours: f32(f"{pre}{theirs}.weight").T for ours, theirs in _EAGLE_LAYER.items()}
    expect = {"wq": (width, heads * hd), "wk": (width, cfg.num_kv_heads * hd), "wv": (width, cfg.num_kv_heads * hd),
              "wo": (heads * hd, e), "w_gate": (e, cfg.intermediate_size), "w_up": (e, cfg.intermediate_size),
              "w_down": (cfg.intermediate_size, e)}
    for name, shape in expect.items():
        if layer[name].shape != shape:
            raise ValueError(f"EAGLE-{version} {pre}{_EAGLE_LAYER[name]}.weight has shape "
                             f"{layer[name].shape[::-1]}, expected {shape[::-1]} for hidden size {e}")
    layer["mlp_norm"] = f32(f"{pre}post_attention_layernorm.weight")
    params = {"fc_w": f32("fc.weight").T, "layer": layer}
    if version == 1:
        params["fc_b"] = f32("fc.bias")
    else:
        layer["attn_norm"] = f32(f"{pre}input_layernorm.weight")
        layer["hidden_norm"] = f32(f"{pre}hidden_norm.weight")
        params["norm"] = f32("norm.weight")
        params["lm_head"] = f32("lm_head.weight").T
        if params["lm_head"].shape != (e, cfg.draft_vocab_size):
            raise ValueError(f"EAGLE-3 lm_head.weight has shape {params['lm_head'].shape[::-1]}, expected "
                             f"{(cfg.draft_vocab_size, e)}")
        if "d2t" in sd:
            ids = np.arange(cfg.draft_vocab_size) + np.asarray(sd["d2t"], np.int64)
            if cfg.draft_vocab_size != cfg.vocab_size or np.any(ids != np.arange(cfg.vocab_size)):
                if ids.min() < 0 or ids.max() >= cfg.vocab_size:
                    raise ValueError(f"d2t maps draft ids outside the target vocabulary [0, {cfg.vocab_size})")
                params["d2t"] = ids.astype(np.int32)
        elif cfg.draft_vocab_size != cfg.vocab_size:
            raise KeyError(f"EAGLE-3 checkpoint is missing key(s): d2t (draft vocabulary "
                           f"{cfg.draft_vocab_size} != target vocabulary {cfg.vocab_size})")
    if "embed_tokens.weight" in sd:
        emb = f32("embed_tokens.weight")
        if emb.shape != (vocab, e):
            raise ValueError(f"embed_tokens.weight has shape {emb.shape}, expected {(vocab, e)}")
        params["embed"] = emb
    return jax.tree.map(jnp.asarray, params), cfg
