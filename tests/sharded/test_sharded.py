"""specjax on a device mesh, on 8 virtual CPU devices: sharded greedy generation equals one
device token for token (with and without drafters: a draft model, prompt lookup, an EAGLE
head with its own cache, Hidden Transfer's guesses in the verify pass; ragged batches), sharded training steps
equal one device's, and sharded checkpoints restore onto another mesh shape.

These need XLA_FLAGS=--xla_force_host_platform_device_count=8 before JAX starts;
tests/test_sharding.py runs this folder in a subprocess with that flag."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from jax.sharding import PartitionSpec as P

import specjax as sj
from specjax import sharding
from specjax.drafters import DraftModel, Eagle, HiddenTransfer, PromptLookup
from specjax.heads import eagle as eagle_head
from specjax.heads import hidden_transfer as ht_head
from specjax.layout import portable_layout
from specjax.models import KVCache
from specjax.train.export import load_trained_params
from specjax.train.loop import train
from specjax.train.run_config import from_dict
from specjax.train.run_state import Checkpointer
from tests.conftest import tiny_llama_config
from tests.test_train import raw_config

pytestmark = pytest.mark.skipif(jax.device_count() < 8, reason="needs 8 devices: run through "
                                "tests/test_sharding.py (or with XLA_FLAGS=--xla_force_host_platform_device_count=8)")

RAGGED = [[5, 17, 33, 9, 60, 5, 17, 33], [40, 3], [8, 8, 50, 14, 22, 8, 8]]  # 3 rows: padded to 4


def mesh(data, model):
    return jax.make_mesh((data, model), ("data", "model"))


def layout(x):
    """An array's partitioning, one entry per dim."""
    return tuple(x.sharding.spec) + (None,) * (x.ndim - len(x.sharding.spec))


@pytest.fixture(scope="module")
def target():
    return sj.Model.init(tiny_llama_config(), jax.random.key(0))  # 4 query heads, 2 kv heads


@pytest.fixture(scope="module")
def drafters(target):
    rng = np.random.default_rng(7)  # noise on the host: no compilation
    noisy = jax.tree.map(lambda w: w + 0.3 * np.std(w) * rng.standard_normal(w.shape, np.float32),
                         jax.device_get(target.params))
    near = sj.Model(jax.tree.map(jnp.asarray, noisy), target.config)  # agrees often, not always
    ecfg = eagle_head.EagleConfig.for_target(target.config, 1)
    transfer = ht_head.init(3, target.config.hidden_size)
    transfer["w"] = jnp.asarray(0.3 * rng.standard_normal(transfer["w"].shape, np.float32))
    return {"ar": None, "draft-chain": DraftModel(near, mode="chain", k=3),
            "prompt-lookup": PromptLookup(max_ngram=2, num_tokens=4),
            "eagle": Eagle(eagle_head.init(ecfg, jax.random.key(3), target.params), ecfg, top_k=3, depth=3,
                           total_tokens=8),
            "hidden-transfer": HiddenTransfer(transfer, tree_size=6, guess_budget=6, transfer_layer=1)}


@pytest.fixture(scope="module")
def one_device(target, drafters):
    return lambda name: sj.generate(target, RAGGED, max_new_tokens=16, drafter=drafters[name])


def test_parameters_are_split_megatron_style(target, drafters):
    s = jax.tree.map(layout, sj.shard(target, mesh(2, 4)).params)
    assert s["layers"]["wq"] == (None, None, "model") and s["layers"]["wo"] == (None, "model", None)
    assert s["layers"]["w_up"] == (None, None, "model") and s["layers"]["w_down"] == (None, "model", None)
    assert s["layers"]["wk"] == (None, None, None)  # 2 kv heads do not split 4 ways
    assert s["embed"] == ("model", None) and s["lm_head"] == (None, "model")
    assert s["layers"]["attn_norm"] == (None, None) and s["norm"] == (None,)
    sharded = sj.shard(target, mesh(4, 2))
    assert layout(sharded.params["layers"]["wk"]) == (None, None, "model")  # 2 kv heads, 2 ways
    wq = sharded.params["layers"]["wq"]  # [L, E, H hd] = [2, 32, 32]: 2 heads (16 columns) per device
    assert {shard.data.shape for shard in wq.addressable_shards} == {(2, 32, 16)}
    assert wq.sharding.mesh.axis_types == (jax.sharding.AxisType.Auto,) * 2  # from an Explicit mesh
    fsdp = jax.tree.map(layout, sharding.shard(target.params, mesh(4, 2), fsdp=True))
    assert fsdp["layers"]["wq"] == (None, "data", "model") and fsdp["embed"] == ("model", "data")
    draft = sj.shard(drafters["draft-chain"], mesh(2, 4)).draft
    assert layout(draft.params["layers"]["wq"]) == (None, None, "model")


def test_batches_pad_to_the_data_axis_or_fail_clearly():
    m = mesh(2, 4)
    rows, lens = sharding.pad_batch(m, np.arange(6).reshape(3, 2), np.array([2, 1, 2]))
    np.testing.assert_array_equal(rows, [[0, 1], [2, 3], [4, 5], [4, 5]])  # the last row repeated
    np.testing.assert_array_equal(lens, [2, 1, 2, 2])
    assert layout(sharding.shard_batch(m, rows)) == ("data", None)
    with pytest.raises(ValueError, match="a batch of 3 rows does not split over the mesh's 2-way 'data'"):
        sharding.shard_batch(m, rows[:3])


def test_kv_caches_are_pinned_under_a_mesh():
    m = mesh(4, 2)
    make = jax.jit(lambda: sharding.constrain_caches(KVCache.init(tiny_llama_config(), 4, 16)))
    with sharding.use_mesh(m):
        cache = make()
    assert layout(cache.k) == (None, "data", None, "model", None)
    assert layout(cache.lengths) == ("data",)
    assert len(make().k.sharding.device_set) == 1  # no mesh set: left alone


@pytest.mark.parametrize("name, shape", [("ar", (2, 4)), ("draft-chain", (4, 2)), ("prompt-lookup", (2, 4)),
                                         ("eagle", (4, 2)),
                                         ("hidden-transfer", (2, 4))])
def test_sharded_greedy_generation_equals_one_device(name, shape, target, drafters, one_device):
    """2 x 4: 2 kv heads replicated over 'model'; 4 x 2: kv heads split too (weights and
    caches). The drafter is left unsharded: generate lays it out on the target's mesh."""
    want = one_device(name)
    got = sj.generate(sj.shard(target, mesh(*shape)), RAGGED, max_new_tokens=16, drafter=drafters[name])
    np.testing.assert_array_equal(got.tokens, want.tokens)
    np.testing.assert_array_equal(got.num_tokens, want.num_tokens)
    assert got.stats.tau == want.stats.tau
    if name in ("draft-chain", "prompt-lookup"):  # the random heads' drafts are rarely right
        assert want.stats.tau > 1.0  # the drafter's tokens were accepted, not only bonus tokens


def test_sharded_stream_equals_one_device(target, one_device):
    want = one_device("ar")
    got = [t for chunk in sj.stream(sj.shard(target, mesh(4, 2)), RAGGED[0], max_new_tokens=16) for t in chunk]
    assert got == want.tokens[0, : want.num_tokens[0]].tolist()


def test_sharded_adaptive_equals_one_device(target, drafters, one_device):
    """The adaptive loop lays the batch and its variants out on the model's mesh as generate
    does (3 ragged rows padded to 4 over 'data'); greedy output is AR's."""
    from specjax.adaptive import Calibration
    cal = Calibration(np.array([1.0, 0.5, 0.5, 0.5]), np.full(4, 0.9))  # predicts a win
    ad = sj.Adaptive(drafters["prompt-lookup"], calibration=cal)
    want = one_device("ar")
    got = sj.generate(sj.shard(target, mesh(4, 2)), RAGGED, max_new_tokens=16, drafter=ad)
    assert got.stats.speculated
    np.testing.assert_array_equal(got.tokens, want.tokens)
    np.testing.assert_array_equal(got.num_tokens, want.num_tokens)


def test_sharded_checkpoints_restore_onto_another_mesh(target, tmp_path):
    sj.save(sj.shard(target, mesh(2, 4)), tmp_path / "model")
    moved = sj.load(tmp_path / "model", mesh=mesh(4, 2))
    assert layout(moved.params["layers"]["wk"]) == (None, None, "model")
    assert dict(moved.params["layers"]["wk"].sharding.mesh.shape) == {"data": 4, "model": 2}
    single = sj.load(tmp_path / "model")
    assert all(len(leaf.sharding.device_set) == 1 for leaf in jax.tree.leaves(single.params["layers"]["wq"]))
    for a, b, c in zip(*(jax.tree.leaves(portable_layout(m.params)) for m in (target, moved, single))):
        np.testing.assert_array_equal(np.asarray(b), np.asarray(a))
        np.testing.assert_array_equal(np.asarray(c), np.asarray(a))

    # the training state: FSDP x TP on 2 x 4, restored as 8 x 1
    opt_state = optax.adam(1e-3).init(target.params)
    state = {"params": target.params, "opt_state": opt_state}
    ckpt = Checkpointer(tmp_path / "train")
    ckpt.save(1, sharding.shard(state, mesh(2, 4), fsdp=True), {"step": 1})
    into = sharding.shard(jax.tree.map(jnp.zeros_like, state), mesh(8, 1), fsdp=True)
    restored, meta = ckpt.restore(into)
    ckpt.close()
    assert meta == {"step": 1}
    assert restored["params"]["layers"]["wq"].sharding == into["params"]["layers"]["wq"].sharding
    assert layout(restored["params"]["layers"]["wq"]) == (None, "data", None)
    for a, b in zip(jax.tree.leaves(state), jax.tree.leaves(restored)):
        np.testing.assert_array_equal(np.asarray(b), np.asarray(a))


def test_sharded_training_equals_one_device(code_corpus, tmp_path):
    """`[train] mesh = [4, 2]`: FSDP x tensor parallel training steps equal one device's, the
    state keeps its layout, and the run's sharded checkpoint exports from one device."""
    corpus = (code_corpus, code_corpus / "tok")  # 3 of 4 steps: no final eval, no plot
    want = train(from_dict(raw_config(corpus, tmp_path / "one", steps=4)), progress=False, stop_after=3)
    config = from_dict(raw_config(corpus, tmp_path / "mesh", steps=4, mesh=[4, 2]))
    got = train(config, progress=False, stop_after=3)
    wq = got["params"]["layers"]["wq"]  # [1, 32, 2 heads x 16]: FSDP over 'data', heads over 'model'
    assert layout(wq) == (None, "data", "model") and dict(wq.sharding.mesh.shape) == {"data": 4, "model": 2}
    rules = sharding.specs(got["params"], wq.sharding.mesh, head_dim=16, fsdp=True)
    assert jax.tree.map(layout, got["params"]) == jax.tree.map(tuple, rules, is_leaf=lambda x: isinstance(x, P))
    np.testing.assert_allclose(got["train"]["loss"], want["train"]["loss"], rtol=1e-5)
    exported, step = load_trained_params(config)
    assert step == 3 and len(exported["layers"]["wq"].sharding.device_set) == 1
    for a, b, c in zip(*(jax.tree.leaves(p) for p in (got["params"], exported, want["params"]))):
        np.testing.assert_array_equal(np.asarray(b), np.asarray(a))
        np.testing.assert_allclose(np.asarray(a), np.asarray(c), rtol=1e-4, atol=1e-6)


def test_sharded_grammar_constraint_equals_one_device():
    """A host grammar (llguidance through a callback) under a mesh: the batch split over 'data',
    the same tokens as on one device, every row in the language."""
    import re

    model, tok = sj.load("tiny"), sj.load_tokenizer("tiny")
    record = r'\{"id": [0-9]{1,3}, "name": "[a-z]+"\}'  # unbounded: the host engine
    constraint = sj.constraints.regex(record, tok)
    assert not constraint.on_device
    prompts = [tok.encode("The record:"), tok.encode("x = "), tok.encode("def f():")]
    drafter = sj.drafters.Forced(PromptLookup())
    want = sj.generate(model, prompts, max_new_tokens=24, constraint=constraint, drafter=drafter)
    got = sj.generate(sj.shard(model, mesh(8, 1)), prompts, max_new_tokens=24, constraint=constraint, drafter=drafter)
    np.testing.assert_array_equal(got.tokens, want.tokens)
    ended = [(row, n) for row, n in zip(got.tokens, got.num_tokens) if row[n - 1] in tok.eos_token_ids]
    assert ended  # the short record ends within 24 tokens
    for row, n in ended:
        assert re.fullmatch(record, tok.decode(row[: n - 1])), tok.decode(row[:n])
