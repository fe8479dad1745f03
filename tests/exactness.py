"""Sampling exactness, shared by the engine and head tests: the exact law of the first n new
tokens by enumeration with `sj.forward`, the law `sj.generate` samples with a drafter and a
verifier, and a chi-square test between them (with enough samples that a wrong rule fails:
tests/test_engine.py's wrong pairing and child-scored DySpec are the negative controls, at
p < 1e-99 with SAMPLES; EAGLE's DySpec in tests/test_heads.py needs 24000)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from scipy import stats as scipy_stats

import specjax as sj
from specjax.models import init_params
from specjax.sampling import SamplingParams, probs
from tests.conftest import tiny_llama_config

V = 6
PROMPT = [1, 4, 2]
SAMPLES = 6000  # 1 call (key 100)


def sharp_model(seed: int) -> sj.Model:
    """A random model with a tiny vocabulary and peaked distributions."""
    cfg = tiny_llama_config(V, max_pos=32)
    return sj.Model(init_params(cfg, jax.random.key(seed), std=0.6), cfg)


def exact_joint(target, params: SamplingParams, n=2, prompt=PROMPT):
    """P(first n new tokens) by enumeration with sj.forward."""
    seqs = [()]
    table = {}
    for depth in range(n):
        batch = jnp.array([list(prompt) + list(s) for s in seqs])
        p = np.asarray(probs(sj.forward(target, batch)[:, -1], params), np.float64)
        for s, row in zip(seqs, p):
            table[s] = row
        seqs = [s + (x,) for s in seqs for x in range(V)]
    joint = np.array([np.prod([table[s[:i]][s[i]] for i in range(n)]) for s in seqs])
    return joint / joint.sum()


def sampled_joint(target, drafter, verifier, params, n=2, calls=1, prompt=PROMPT, samples=SAMPLES,
                  **generate_kwargs):
    """Counts of the first n new tokens over `samples` generations from `prompt` (generate_kwargs:
    e.g. a constraint)."""
    counts = np.zeros(V ** n)
    per_call = samples // calls
    for c in range(calls):
        out = sj.generate(target, np.tile(prompt, (per_call, 1)), max_new_tokens=n, drafter=drafter,
                          verifier=verifier, temperature=params.temperature, top_k=params.top_k,
                          top_p=params.top_p, key=jax.random.key(100 + c), **generate_kwargs)
        idx = np.ravel_multi_index(out.tokens.T, [V] * n)
        counts += np.bincount(idx, minlength=V ** n)
    return counts


def top_k_first_two_law(model, prompt, params: SamplingParams) -> dict:
    """The exact law {(a, b): P} of the first two new tokens on a real vocabulary, enumerated over
    the support that `params` leaves (a small top_k keeps it to a few pairs)."""
    p1 = np.asarray(probs(sj.forward(model, jnp.array([prompt]))[:, -1], params)[0], np.float64)
    support = np.flatnonzero(p1)
    p2 = np.asarray(probs(sj.forward(model, jnp.array([prompt + [int(t)] for t in support]))[:, -1], params),
                    np.float64)
    return {(int(a), int(b)): p1[a] * p2[i, b] for i, a in enumerate(support) for b in np.flatnonzero(p2[i])}


def sampled_pairs(model, prompt, drafter, params: SamplingParams, cells: list, *, batch: int, calls: int,
                  verifier=None) -> np.ndarray:
    """Counts of the first two new tokens over calls x batch generations from `prompt`, one slot
    per pair in `cells` and a last one for any other pair (to test against top_k_first_two_law)."""
    index = {c: i for i, c in enumerate(cells)}
    counts = np.zeros(len(cells) + 1)
    for call in range(calls):
        out = sj.generate(model, [prompt] * batch, max_new_tokens=2, drafter=drafter, verifier=verifier,
                          temperature=params.temperature, top_k=params.top_k, top_p=params.top_p,
                          key=jax.random.key(call))
        for a, b in out.tokens.tolist():
            counts[index.get((a, b), len(cells))] += 1
    return counts


def chi_square_pvalue(counts, p):
    p = np.asarray(p, np.float64) / np.sum(p)  # a law from float32 probabilities sums to 1 +- 1e-7
    keep = p * counts.sum() >= 5  # pool cells with tiny expectations
    obs = np.append(counts[keep], counts[~keep].sum())
    exp = np.append(p[keep], p[~keep].sum()) * counts.sum()
    if exp[-1] == 0:
        assert obs[-1] == 0, "tokens of zero probability were emitted"
        obs, exp = obs[:-1], exp[:-1]
    pvalue = scipy_stats.chisquare(obs, exp).pvalue
    print(f"chi-square p-value {pvalue:.3g} ({int(counts.sum())} samples)")  # shown when a test fails
    return pvalue
