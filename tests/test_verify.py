"""Acceptance rules: statistical exactness on a toy target LM, negative controls, invariants."""

import dataclasses
import functools

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from scipy import stats

import specjax.verify as sv
from specjax.sampling import SamplingParams, probs
from specjax.tree import DraftTree, chain

V = 4
SAMPLES = 100_000
P_OK = 1e-4  # a correct rule passes (fixed seeds, so this is deterministic)
P_WRONG = 1e-8  # a wrong rule is rejected far below this

CHAIN = np.array([-1, 0, 1])  # depth 2
STAR = np.array([-1, 0, 0, 0])  # root with 3 children
TREE = np.array([-1, 0, 0, 0, 1, 1, 2, 2, 3, 3])  # 3 children, 2 grandchildren each

# Which draft-tree sampler each rule is exact for.
DRAW = {sv.SpeculativeSampling: "iid", sv.SpecInfer: "iid", sv.SpecTr: "iid", sv.RSD: "wor",
        sv.TopK: "fixed"}


def toy_lm(seed, alpha=1.0):
    """A toy LM over V tokens: tables[d][prefix] = p(. | prefix) for prefixes of length d < 3."""
    rng = np.random.default_rng(seed)
    return [jnp.asarray(rng.dirichlet(alpha * np.ones(V), size=(V,) * d), jnp.float32)
            for d in range(3)]


TARGET = toy_lm(0, alpha=2.0)
DRAFT = toy_lm(1, alpha=1.0)


def key(seed):
    """A PRNG key with the rbg implementation: statistically fine and much cheaper to compile on
    CPU than threefry, which keeps the suite fast."""
    return jax.random.key(seed, impl="rbg")


def keys(seed):
    """16 rbg keys, split outside jit (an rbg split compiles to threefry)."""
    return jax.random.split(key(seed), 16)


def draw_trees(ks, parents, mode, target, draft, batch, with_q=True):
    """A batch of draft trees with the given template: children drawn i.i.d. from the draft
    ("iid"), without replacement in Gumbel-top-k order ("wor"), or the draft's top-k ("fixed").
    Uses keys ks[:N]. Returns (DraftTree [batch], target_probs [batch, N, V])."""
    n = len(parents)
    tokens, prefix = [jnp.zeros((batch,), jnp.int32)] * n, {0: ()}
    for c in range(n):
        kids = [i for i in range(n) if parents[i] == c]
        if not kids:
            continue
        qd = jnp.broadcast_to(draft[len(prefix[c])][prefix[c]], (batch, V))
        if mode == "iid":
            xs = [jax.random.categorical(ks[i], jnp.log(qd)) for i in kids]
        elif mode == "wor":
            g = jnp.log(qd) + jax.random.gumbel(ks[c], qd.shape)
            xs = list(jax.lax.top_k(g, len(kids))[1].T)
        else:
            xs = list(jnp.argsort(-qd, axis=-1)[:, : len(kids)].T)
        for i, x in zip(kids, xs):
            tokens[i], prefix[i] = x.astype(jnp.int32), prefix[c] + (x,)

    def table(lm, i):
        return jnp.broadcast_to(lm[len(prefix[i])][prefix[i]], (batch, V))

    tp = jnp.stack([table(target, i) for i in range(n)], axis=1)
    q = jnp.stack([jnp.zeros((batch, V))] + [table(draft, parents[i]) for i in range(1, n)], axis=1)
    return DraftTree.build(jnp.stack(tokens, axis=1), parents, q if with_q else None), tp


@functools.partial(jax.jit, static_argnums=(0, 1, 2, 3))
def _simulate(rule, parents_t, mode, with_q, target, draft, ks):
    tree, tp = draw_trees(ks, np.array(parents_t), mode, target, draft, SAMPLES, with_q)
    v = rule(tree, tp, ks[-1])
    e = jnp.pad(v.emitted(tree), ((0, 0), (0, 2)), constant_values=-1)
    a = v.num_accepted
    # Complete the first three tokens with fresh target draws (what the next step would emit).
    t1 = e[:, 0]
    t2 = jnp.where(a >= 1, e[:, 1], jax.random.categorical(ks[-2], jnp.log(target[1][t1])))
    t3 = jnp.where(a >= 2, e[:, 2], jax.random.categorical(ks[-3], jnp.log(target[2][t1, t2])))
    return jnp.stack([t1, t2, t3], axis=1), a


def simulate(rule, parents, mode, target=TARGET, draft=DRAFT, seed=0):
    """One verification step on SAMPLES independent trees, in one compiled call: (the first
    three tokens int[S, 3], completed with fresh target draws where the step emitted fewer,
    num_accepted int[S])."""
    parents = tuple(int(x) for x in parents)
    t, a = _simulate(rule, parents, mode, rule.needs_q, target, draft, keys(seed))
    return np.asarray(t), np.asarray(a)


def pvalue(samples, expected_probs):
    """Chi-square p-value of integer samples against a distribution over range(len(probs))."""
    expected_probs = np.asarray(expected_probs, np.float64).ravel()
    assert expected_probs.min() * len(samples) >= 5, "too few expected counts for chi-square"
    counts = np.bincount(samples, minlength=len(expected_probs))
    expected = expected_probs / expected_probs.sum() * len(samples)
    return stats.chisquare(counts, expected).pvalue


def joint(lm):
    """float64[V**3]: p(t1) p(t2 | t1) p(t3 | t1, t2) of a toy LM."""
    p1, p2, p3 = (np.asarray(t, np.float64) for t in lm)
    return (p1[:, None, None] * p2[:, :, None] * p3).ravel()


# ---- exactness ----------------------------------------------------------------------------------

CASES = [(sv.SpeculativeSampling(), CHAIN)] + [
    (rule, shape) for rule in (sv.SpecInfer(), sv.RSD(), sv.SpecTr(), sv.TopK())
    for shape in (CHAIN, STAR, TREE)]


@pytest.mark.parametrize("rule,parents", CASES,
                         ids=[f"{type(r).__name__}-{len(s)}nodes" for r, s in CASES])
def test_exact(rule, parents):
    """First emitted token ~ p, and the first three tokens ~ the target's sequence law (the
    tree's accepted tokens, then the bonus or correction token, then fresh draws)."""
    toks, accepted = simulate(rule, parents, DRAW[type(rule)])
    assert pvalue(toks[:, 0], TARGET[0]) > P_OK
    assert pvalue(toks @ np.array([V * V, V, 1]), joint(TARGET)) > P_OK
    assert accepted.mean() > 0.1  # drafts do get accepted: the test exercises acceptance


# ---- negative controls: the same test rejects deliberately wrong rules -------------------------

@dataclasses.dataclass(frozen=True)
class _UnnormalisedResidual(sv.SpecInfer):
    def _residual(self, p, q):
        return jnp.maximum(p - q, 0.0)


@dataclasses.dataclass(frozen=True)
class _RhoOne(sv.SpecTr):
    def _rho(self, p, q, k):
        return jnp.ones_like(k)


PEAKED = toy_lm(3, alpha=0.3)  # a peaked draft far from the target makes each error large


@pytest.mark.parametrize("rule,mode", [
    (_UnnormalisedResidual(), "iid"),  # residual not renormalised
    (sv.SpecInfer(), "wor"),  # without-replacement siblings treated as i.i.d.
    (_RhoOne(), "iid"),  # SpecTr with rho = 1
], ids=["unnormalised-residual", "specinfer-on-wor", "spectr-rho-1"])
def test_negative_controls_fail(rule, mode):
    toks, _ = simulate(rule, STAR, mode, draft=PEAKED)
    assert pvalue(toks[:, 0], TARGET[0]) < P_WRONG


@pytest.mark.parametrize("rule", [sv.SpecInfer(), sv.RSD(), sv.SpecTr()],
                         ids=lambda r: type(r).__name__)
def test_exact_with_peaked_draft(rule):
    """The correct rules pass on the draft that exposes the negative controls."""
    toks, _ = simulate(rule, STAR, DRAW[type(rule)], draft=PEAKED)
    assert pvalue(toks[:, 0], TARGET[0]) > P_OK


# ---- invariants ---------------------------------------------------------------------------------

@pytest.mark.parametrize("rule", [sv.SpeculativeSampling(), sv.SpecInfer(), sv.RSD(), sv.SpecTr()],
                         ids=lambda r: type(r).__name__)
def test_draft_equal_to_target_accepts_everything(rule):
    rng = np.random.default_rng(5)
    logits = [jnp.asarray(rng.normal(size=(V,) * (d + 1)) * 2, jnp.float32) for d in range(3)]
    parents = CHAIN if isinstance(rule, sv.SpeculativeSampling) else TREE
    for temperature in (0.0, 0.7, 1.0):
        lm = [probs(x, SamplingParams(temperature)) for x in logits]
        _, accepted = simulate(rule, parents, DRAW[type(rule)], target=lm, draft=lm)
        np.testing.assert_array_equal(accepted, 2, err_msg=f"temperature {temperature}")


@pytest.mark.parametrize("rule", [sv.Greedy(), sv.SpeculativeSampling(), sv.SpecInfer(), sv.RSD(),
                                  sv.SpecTr(), sv.TopK()], ids=lambda r: type(r).__name__)
def test_disjoint_support_never_accepts(rule):
    """A draft with no target mass is never accepted, and the next token is still ~ p."""
    p_root = jnp.array([0.0, 0.0, 0.3, 0.7])
    q_root = jnp.array([0.6, 0.4, 0.0, 0.0])
    mode = "fixed" if isinstance(rule, sv.Greedy) else DRAW[type(rule)]
    toks, accepted = simulate(rule, CHAIN, mode, [p_root] + TARGET[1:], [q_root] + DRAFT[1:])
    assert np.all(accepted == 0)
    if isinstance(rule, sv.Greedy):
        assert np.all(toks[:, 0] == 3)
    else:
        assert np.all(toks[:, 0] >= 2)
        assert pvalue(toks[:, 0] - 2, p_root[2:]) > P_OK


@functools.partial(jax.jit, static_argnums=(0, 1))
def _greedy_and_vmapped(rules, parents_t, target, draft, ks, row_keys):
    """Greedy on a batch of trees, and every rule vmapped over its rows (B = 1 each)."""
    tree, tp = draw_trees(ks, np.array(parents_t), "wor", target, draft, row_keys.shape[0])
    one = lambda t, p, k: [rule(jax.tree.map(lambda x: x[None], t), p[None], k) for rule in rules]
    vmapped = jax.tree.map(lambda x: x[:, 0], jax.vmap(one)(tree, tp, row_keys))
    return tree, sv.Greedy()(tree, tp, None), vmapped


def test_exact_rules_reduce_to_greedy_at_temperature_zero():
    """With one-hot targets every exact rule (and Typical) returns Greedy's verdict; the rules
    run vmapped over rows, so this also checks that they vmap."""
    rng = np.random.default_rng(7)
    one_hot = [probs(jnp.asarray(rng.normal(size=(V,) * (d + 1)), jnp.float32), SamplingParams(0.0))
               for d in range(3)]
    row_keys = jax.random.split(key(1), 2000)
    for parents, rules in ((TREE, (sv.SpecInfer(), sv.RSD(), sv.SpecTr(), sv.TopK(), sv.Typical())),
                           (CHAIN, (sv.SpeculativeSampling(),))):
        tree, want, got = _greedy_and_vmapped(
            rules, tuple(int(x) for x in parents), one_hot, DRAFT, keys(8), row_keys)
        assert 0 < want.num_accepted.mean() < tree.max_depth  # both accepts and rejects happen
        for rule, verdict in zip(rules, got):
            for g, w in zip(verdict, want):
                np.testing.assert_array_equal(g, w, err_msg=type(rule).__name__)


# ---- greedy and typical -------------------------------------------------------------------------

def _one_hot_targets(argmax_at):
    """target_probs [1, N, V], a point mass on argmax_at[i] at node i."""
    return jax.nn.one_hot(jnp.asarray(argmax_at)[None], V)


def test_greedy_longest_path_ties_to_lowest_index():
    #        0
    #     /  |  \
    #    1   2   3        argmax at the root: 1 (nodes 1 and 3 match, 2 does not)
    #    |   |   |
    #    4   5   6        argmax at 1 -> 2 (node 4 matches); at 3 -> 2 (node 6 matches)
    #    |       |
    #    7       8        argmax at 4 -> 0 (node 7 fails); at 6 -> 3 (node 8 matches)
    parents = np.array([-1, 0, 0, 0, 1, 2, 3, 4, 6])
    tokens = np.array([0, 1, 0, 1, 2, 3, 2, 3, 3])
    argmax_at = [1, 2, 0, 2, 0, 0, 3, 0, 1]
    tree = DraftTree.build(tokens[None], parents)
    v = sv.Greedy()(tree, _one_hot_targets(argmax_at), jax.random.PRNGKey(0))
    np.testing.assert_array_equal(v.path, [[0, 3, 6, 8]])  # the deepest matching path
    assert int(v.num_accepted[0]) == 3 and int(v.next_token[0]) == 1
    # Cut node 8: paths 0-1-4 and 0-3-6 tie at depth 2 -> lowest index (node 4) wins.
    tree = DraftTree.build(tokens[None], parents, valid=np.arange(9)[None] != 8)
    v = sv.Greedy()(tree, _one_hot_targets(argmax_at), jax.random.PRNGKey(0))
    np.testing.assert_array_equal(v.path, [[0, 1, 4, 4]])  # padded with the last accepted node
    assert int(v.num_accepted[0]) == 2 and int(v.next_token[0]) == 0
    np.testing.assert_array_equal(v.emitted(tree), [[1, 2, 0, -1]])


def test_greedy_argmax_ties_to_lowest_token():
    tree = chain(np.array([[0, 1]]))
    tp = jnp.array([[[0.4, 0.4, 0.2, 0.0], [0.1, 0.3, 0.3, 0.3]]])
    v = sv.Greedy()(tree, tp, jax.random.PRNGKey(0))
    assert int(v.num_accepted[0]) == 0 and int(v.next_token[0]) == 0


class TestInvalidNodes(chex.TestCase):
    """Each rule under jit and eagerly (chex.variants): the same verdict, and never an invalid node."""

    @chex.variants(with_jit=True, without_jit=True)
    def test_invalid_nodes_are_never_accepted(self):
        tree = DraftTree.build(np.array([[0, 1, 2, 3]]), np.array([-1, 0, 1, 0]),
                               q=jnp.full((1, 4, V), 1.0 / V), valid=np.array([[True, False, True, True]]))
        tp = _one_hot_targets([1, 2, 0, 0])  # node 1 and its child 2 would match
        for rule in (sv.Greedy(), sv.SpeculativeSampling(), sv.SpecInfer(), sv.RSD(), sv.SpecTr(),
                     sv.TopK(), sv.Typical()):
            v = self.variant(rule)(tree, tp, key(0))
            chex.assert_shape((v.path, v.num_accepted, v.next_token), [(1, tree.max_depth + 1), (1,), (1,)])
            assert int(v.num_accepted[0]) == 0 and int(v.next_token[0]) == 1, type(rule).__name__


def test_typical_accepts_likely_tokens_and_is_labelled_lossy():
    assert not sv.Typical().exact and sv.RSD().exact
    tree = chain(np.array([[0, 2, 1]]))
    flat = jnp.full((V,), 1.0 / V)
    peaked = jnp.array([0.05, 0.05, 0.85, 0.05])
    # The uniform root: threshold min(0.09, 0.3 * exp(-H)) = 0.075 < 0.25, so token 2 passes;
    # at node 1 p(1) = 0.05 is below the threshold.
    v = jax.jit(sv.Typical())(tree, jnp.stack([flat, peaked, flat])[None], key(0))
    assert int(v.num_accepted[0]) == 1
    with pytest.raises(ValueError, match="epsilon"):
        sv.Typical(epsilon=-1.0)


# ---- errors ------------------------------------------------------------------------------------

def test_errors():
    tree = chain(np.zeros((2, 3), np.int32))
    tp = jnp.full((2, 3, V), 1.0 / V)
    with pytest.raises(ValueError, match="needs the draft distributions"):
        sv.SpecInfer()(tree, tp, jax.random.PRNGKey(0))
    with pytest.raises(ValueError, match="target_probs must be"):
        sv.Greedy()(tree, tp[:, :2], jax.random.PRNGKey(0))
    qtree = chain(np.zeros((2, 3), np.int32), q=jnp.full((2, 3, V + 1), 1.0 / (V + 1)))
    with pytest.raises(ValueError, match="vocabulary mismatch"):
        sv.RSD()(qtree, tp, jax.random.PRNGKey(0))
    with pytest.raises(TypeError, match="DraftTree"):
        sv.TopK()(tp, tp, jax.random.PRNGKey(0))
    with pytest.raises(ValueError, match="iters"):
        sv.SpecTr(iters=0)
