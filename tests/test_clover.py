"""Clover heads: training and export, greedy equality and sampling exactness in the engine, the
drafter's first draft against the head computed directly, and clear errors."""

from __future__ import annotations

import dataclasses
import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import specjax as sj
from specjax.drafters import Clover, Medusa
from specjax.drafters.base import Context
from specjax.heads import clover as ch
from specjax.sampling import SamplingParams
from tests.exactness import chi_square_pvalue, exact_joint, sampled_joint, sharp_model
from tests.test_heads import RAGGED, _config, check_saved_head_is_lossless, head_config


@pytest.fixture(scope="module")
def target():
    return sj.Model.init(_config(), jax.random.key(0))


def clover_drafter(target, tree_size=8, num_layers=1):
    """A Clover head initialised from `target` as Clover-2 does, then perturbed so that the RNN
    steps matter."""
    cfg = ch.CloverConfig.for_target(target.config, num_layers=num_layers, num_heads=3)
    params = ch.init(cfg, jax.random.key(1), target.params)
    leaves, treedef = jax.tree.flatten(params)
    keys = jax.random.split(jax.random.key(2), len(leaves))
    leaves = [a + 0.05 * jax.random.normal(k, a.shape) for a, k in zip(leaves, keys)]
    return Clover(jax.tree.unflatten(treedef, leaves), cfg, tree_size=tree_size)


def test_greedy_equals_autoregressive(target, tmp_path):
    loaded = check_saved_head_is_lossless(target, clover_drafter(target), tmp_path)
    assert loaded.target_layers == (3,) and loaded.num_nodes == 8
    assert loaded.default_verifier(SamplingParams(0.8)) == sj.verify.TopK()


def test_sampling_keeps_the_autoregressive_law():
    target = sharp_model(3)
    params = SamplingParams(temperature=0.9, top_p=0.95)
    counts = sampled_joint(target, clover_drafter(target), sj.verify.TopK(), params)
    assert chi_square_pvalue(counts, exact_joint(target, params)) > 1e-4


def test_clover_drafts_what_its_head_predicts(target):
    """The catch-up bookkeeping: after the prefill, the root's rank-0 child is head 0's argmax
    at the entry that reads the root, and that child's rank-0 child is head 1's argmax after one
    RNN step on it, both computed here in one causal pass over the prompt."""
    drafter = clover_drafter(target, num_layers=2)
    cfg, params, embed, head = drafter.config, drafter.params, target.params["embed"], target.params["lm_head"]
    prompt = jnp.asarray([RAGGED[0]])
    t = prompt.shape[1]
    parents, rank = drafter.template.parents, drafter.template.rank
    child = int(np.flatnonzero((parents == 1) & (rank == 0))[0])
    assert (parents[1], rank[1]) == (0, 0)

    @jax.jit  # one compilation instead of many eager ops
    def drafted_and_predicted(prompt):
        last = target(prompt, return_layers=drafter.target_layers).layer_hidden[0]
        causal = jnp.tril(jnp.ones((t - 1, t - 1), bool))[None]
        h, _, _ = ch.block(cfg, params, last[:, :-1], embed[prompt[:, 1:]], jnp.arange(t - 1)[None], causal)
        first = jnp.argmax(ch.logits(ch.first_head(cfg, params, h[:, -1]), head), -1)
        second = jnp.argmax(ch.logits(ch.next_head(cfg, params, h[:, -1], embed[first])[0], head), -1)

        pre = target(prompt[:, :-1], compute_logits=False, return_layers=drafter.target_layers)
        length = jnp.asarray([t])
        state = drafter.init(target, prompt, length, 32, pre)
        tokens = jnp.zeros((1, 32), jnp.int32).at[:, :t].set(prompt)
        tree = drafter.propose(state, Context(tokens, length, SamplingParams(), target), jax.random.key(0))[0]
        return tree.tokens[0, jnp.asarray([1, child])], jnp.concatenate([first, second])

    drafted, predicted = drafted_and_predicted(prompt)
    np.testing.assert_array_equal(drafted, predicted)


def test_bad_heads_fail_clearly(target, tmp_path):
    drafter = clover_drafter(target)
    shallow = sj.Model.init(_config(layers=2), jax.random.key(0))
    with pytest.raises(ValueError, match="last layer of a 4-layer target, but the target has 2 layers"):
        sj.generate(shallow, [[1, 2, 3]], max_new_tokens=2, drafter=drafter)
    wide = sj.Model.init(dataclasses.replace(_config(), hidden_size=48, head_dim=12), jax.random.key(0))
    with pytest.raises(ValueError, match="hidden size 32 and vocabulary 64, but the target has hidden size 48"):
        drafter.check(wide)
    bad = dict(drafter.params, w_mlp2=drafter.params["w_mlp2"][:40])
    with pytest.raises(ValueError, match=r"w_mlp2 \(40, 32\) \(expected \(64, 32\)\)"):
        Clover(bad, drafter.config).check(target)
    with pytest.raises(ValueError, match="tree_size"):
        Clover(drafter.params, drafter.config, tree_size=1)
    with pytest.raises(ValueError, match="multiple of num_heads"):
        ch.CloverConfig.for_target(dataclasses.replace(_config(), num_heads=3, num_kv_heads=1))
    Medusa({"w1": jnp.zeros((2, 32, 32)), "b1": jnp.zeros((2, 32))}).save(tmp_path / "medusa")
    with pytest.raises(ValueError, match="holds a 'medusa' head, not Clover"):
        Clover.load(tmp_path / "medusa")
    with pytest.raises(FileNotFoundError, match="no head checkpoint"):
        Clover.load(tmp_path / "nowhere")


def test_training_lowers_the_loss_and_raises_accuracy(code_corpus):
    from specjax.train.token_windows import eval_windows, load_streams
    from specjax.train.export import export
    from specjax.train.loop import train
    from specjax.train.loop import held_out, score_function
    from specjax.train.objectives import make_objective
    from specjax.train.target import load_target

    cfg = head_config(code_corpus, "clover", steps=30)
    cfg = dataclasses.replace(cfg, heads=dataclasses.replace(cfg.heads, feature_weight=10.0, ce_weight=1.0,
                                                             decay=0.7, block_layers=1))
    obj, target = make_objective(cfg), load_target(cfg)
    _, val = load_streams(cfg.data)
    before = held_out(score_function(obj, 0), obj.init(jax.random.PRNGKey(0), target), eval_windows(val, 17, 16), 4,
                      target)
    result = train(cfg, progress=False)
    records = [json.loads(line) for line in (code_corpus / "run-clover" / "metrics.jsonl").read_text().splitlines()]
    first = next(r["step0_kl"] for r in records if r["split"] == "train")
    assert result["train"]["step0_kl"] < 0.7 * first, (first, result["train"])
    after = result["val"]
    assert len(after["top1"]) == len(after["top5"]) == len(after["rank_accuracy"]) == 2
    # The init already copies the target's last layer, so the heads start well above chance.
    assert sum(after["top5"]) > sum(before["top5"]) + 0.15, (before, after)
    export(cfg, code_corpus / "export-clover")
    loaded = Clover.load(code_corpus / "export-clover", target=target)
    assert len(loaded.accuracy) == 2 and loaded.tree_size == 6 and loaded.config.num_heads == 2
