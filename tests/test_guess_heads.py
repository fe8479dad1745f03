"""PPD and Hidden Transfer: guesses drafted inside the verify pass. The guess layout and its
injection against a direct computation, training, greedy equality, sampling exactness."""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import specjax as sj
from specjax.drafters import PPD, HiddenTransfer
from specjax.heads import hidden_transfer as hh
from specjax.heads import ppd as ph
from specjax.heads.guesses import GuessLayout, allocate
from specjax.sampling import SamplingParams
from tests.exactness import chi_square_pvalue, exact_joint, sampled_joint, sharp_model
from tests.test_heads import RAGGED, _config, check_saved_head_is_lossless, head_config


@pytest.fixture(scope="module")
def target():
    return sj.Model.init(_config(), jax.random.key(0))


def drafters(target, seed=1):
    c = target.config
    pp = ph.init(jax.random.key(seed), 3, 2, target.params["embed"])
    hp = hh.init(3, c.hidden_size)
    hp["w"] = 0.3 * jax.random.normal(jax.random.key(seed + 1), hp["w"].shape)
    return {"ppd": PPD(pp, tree_size=6, guess_budget=8),
            "hidden-transfer": HiddenTransfer(hp, tree_size=6, guess_budget=6, transfer_layer=1)}


def test_layout_and_allocation():
    lay = GuessLayout.build([2, 0, 1], num_guesses=2, members=2)
    # (node, j, member) in order; member e of guess j sees members e of guesses j' <= j only
    assert lay.node.tolist() == [0, 0, 0, 0, 2, 2] and lay.offset.tolist() == [1, 1, 2, 2, 1, 1]
    assert lay.index[0].tolist() == [[0, 1], [2, 3]] and (lay.index[1] == -1).all()
    assert lay.mask[2].tolist() == [True, False, True, False, False, False]
    with pytest.raises(ValueError, match=r"guess counts must be in \[0, 2\]"):
        GuessLayout.build([3], num_guesses=2)
    # a chain whose guesses are always right: only the last node is ever the last accepted
    parents, rank = np.array([-1, 0, 1]), np.array([-1, 0, 0])
    counts = allocate(parents, rank, ((1.0,), (1.0,)), budget=3, num_guesses=2)
    assert counts.tolist() == [0, 0, 2]


def test_injection_matches_a_direct_forward(target):
    """The root's guesses in a verify pass equal the same positions run as plain tokens/states:
    PPD's prompt tokens are embeddings appended after the context (checked with one member)."""
    pp = ph.init(jax.random.key(3), 2, 1, target.params["embed"])
    ctx = jnp.asarray([RAGGED[0]])
    t = ctx.shape[1]
    anc = jnp.tril(jnp.ones((1, t, t), bool))
    pos = jnp.arange(t)[None]
    lay = GuessLayout.build([0] * (t - 1) + [2], 2)
    out = target(ctx, inject=lay.injection(0, ph.make(pp, lay), anc, pos))
    # direct: the context's embeddings, then the two prompt embeddings, causally
    emb = jnp.concatenate([target.params["embed"][ctx[0]], pp["prompt"][:, 0]])[None]
    params = {**target.params, "embed": emb[0]}
    direct = sj.Model(params, target.config)(jnp.arange(t + 2)[None])
    np.testing.assert_allclose(out.logits[0, t:], direct.logits[0, t:], atol=1e-5)
    np.testing.assert_allclose(out.logits[0, :t], target(ctx).logits[0], atol=1e-5)


@pytest.mark.parametrize("name", ["ppd", "hidden-transfer"])
def test_greedy_equals_autoregressive(name, target, tmp_path):
    check_saved_head_is_lossless(target, drafters(target)[name], tmp_path)
    with pytest.raises(ValueError, match="holds a"):
        (PPD if name != "ppd" else HiddenTransfer).load(tmp_path)


@pytest.mark.parametrize("name", ["ppd", "hidden-transfer"])
def test_sampling_keeps_the_autoregressive_law(name):
    target = sharp_model(3)
    params = SamplingParams(temperature=0.9, top_p=0.95)
    drafter = drafters(target, seed=5)[name]
    counts = sampled_joint(target, drafter, sj.verify.TopK(), params, n=3)
    assert chi_square_pvalue(counts, exact_joint(target, params, n=3)) > 1e-4, name


def test_bad_settings_fail_clearly(target):
    d = drafters(target)
    with pytest.raises(ValueError, match="transfer_layer=4 must be below the target's 4 layers"):
        sj.generate(target, [[1, 2]], drafter=HiddenTransfer(d["hidden-transfer"].params, transfer_layer=4))
    with pytest.raises(ValueError, match="cannot hold one guess of 2 ensemble members"):
        sj.generate(target, [[1, 2]], drafter=PPD(d["ppd"].params, guess_budget=1))
    other = sj.Model.init(target.config.__class__(**{**target.config.__dict__, "hidden_size": 16,
                                                     "head_dim": 4}), jax.random.key(0))
    with pytest.raises(ValueError, match="for hidden size 32"):
        sj.generate(other, [[1, 2]], drafter=d["ppd"])


@pytest.mark.parametrize("objective", ["ppd", "hidden-transfer"])
def test_training_lowers_the_loss(code_corpus, objective):
    """Held-out KL to the target's future distributions, on fixed windows, before and after 30
    steps (the random target is near-uniform, so the KL starts small)."""
    from specjax.train.token_windows import eval_windows, load_streams
    from specjax.train.export import export
    from specjax.train.loop import train
    from specjax.train.objectives import make_objective
    from specjax.train.target import load_target

    cfg = head_config(code_corpus, objective, steps=30)
    cfg = dataclasses.replace(cfg, heads=dataclasses.replace(cfg.heads, ensemble=2))
    obj, target = make_objective(cfg), load_target(cfg)
    batch = {"tokens": jnp.asarray(eval_windows(load_streams(cfg.data)[1], 17, 16))}
    kl = lambda params: sum(float(v) for k, v in obj.loss(params, batch, jax.random.key(0), target)[1].items()
                            if k.endswith("_kl"))
    before = kl(obj.init(jax.random.key(0), target))
    result = train(cfg, progress=False)
    assert kl(result["params"]) < 0.85 * before, (before, result["train"])
    assert len(result["val"]["top1"]) == cfg.heads.num_guesses
    export(cfg, code_corpus / f"export-{objective}")
    loaded = (PPD if objective == "ppd" else HiddenTransfer).load(code_corpus / f"export-{objective}")
    assert len(loaded.accuracy) == cfg.heads.num_guesses and loaded.tree_size == cfg.heads.tree_size
    assert loaded.members == (2 if objective == "ppd" else 1)
