"""Draft-head objectives for `python -m specjax.train` (objective = medusa1 | medusa2 | eagle |
eagle3 | clover | ppd | hidden-transfer). [model] is the target's config and [heads] the head settings (config.HeadsConfig).
The target is loaded once (`heads.target`: a folder, a shipped name such as "tiny", or
"random" for a random target from [model] and the seed) and stays frozen except in Medusa-2.

- medusa1: frozen target, loss sum_k 0.8^k CE(head k at t, token t+2+k).
- medusa2: joint: LM loss + heads_coefficient * sum_k 0.8^(k+1) CE_k; the heads' learning rate
  is `lr_multiplier` times the target's (by reparametrisation: the heads are stored divided by
  the multiplier, and Adam's step is scale-free).
- eagle (EAGLE-1): SmoothL1(f^_{t+1}, f_{t+1}) + 0.1 CE(p_target(t+1), draft logits), input
  features with uniform noise U(-noise, noise) (drawn from a key folded from the batch, since
  the loop's loss has no key); `ttt_steps` > 1 also unrolls the draft on its own features.
- eagle3 (EAGLE-3): fused 3-layer features, training-time test over `ttt_steps` (>= 3) steps,
  loss sum_i 0.8^i CE(p_target, draft logits at step i).
- clover (Clover-2): head i at position t (reading e(x_{t+1..t+1+i}), teacher-forced) predicts
  x_{t+2+i}; loss sum_i decay^i (feature_weight SmoothL1(o_i, f_{t+1+i}) + ce_weight
  CE(p_target(t+1+i), head i)), Clover-2's weights 10 and 1 and decay 0.7 in configs/clover.toml.
- ppd / hidden-transfer: frozen target; K guesses per position inside the target's own forward,
  loss sum_j 0.8^(j-1) KL(p_target(t+j) || p_guess(t, j)) / K.

`evaluate` gives per-head (Medusa, Clover), per-step (EAGLE) or per-guess (PPD, Hidden Transfer)
top-1/top-5 accuracy on held-out windows: against the text's tokens for Medusa (as trained),
against the target's greedy token for the others (what decides acceptance).
"""

from __future__ import annotations

from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

from specjax.heads import clover as clover_head
from specjax.heads import eagle as eagle_head
from specjax.heads import hidden_transfer as ht_head
from specjax.heads import medusa as medusa_head
from specjax.heads import ppd as ppd_head
from specjax.heads.clover import CloverConfig
from specjax.heads.guesses import GuessLayout
from specjax.models import Model, forward, init_params, lm_head_weight

RANKS = 10


def _soft_ce(target_logits, logits):
    """Mean over positions of -sum_v p_target(v) log q(v)."""
    p = jax.nn.softmax(target_logits.astype(jnp.float32), -1)
    return -(p * jax.nn.log_softmax(logits, -1)).sum(-1).mean()


def _entropy(logits):
    logp = jax.nn.log_softmax(logits.astype(jnp.float32), -1)
    return -(jnp.exp(logp) * logp).sum(-1).mean()


def _hard_ce(logits, labels):
    logp = jax.nn.log_softmax(logits, -1)
    return -jnp.take_along_axis(logp, labels[..., None], -1)[..., 0].mean()


def _topk_hits(logits, labels, k):
    """float [...]: whether labels are among the top-k of logits."""
    top = jax.lax.top_k(logits, k)[1]
    return (top == labels[..., None]).any(-1).astype(jnp.float32)


def _rank_metrics(pairs) -> dict:
    """Per (logits, labels) pair: top-1, top-5 and the per-rank hit rates [RANKS] of the labels."""
    top1, top5, rank = [], [], []
    for logits, labels in pairs:
        hit = (jax.lax.top_k(logits, RANKS)[1] == labels[..., None]).astype(jnp.float32)  # [B, T', R]
        rank.append(hit.mean((0, 1)))
        top1.append(hit[..., 0].mean())
        top5.append(hit[..., :5].sum(-1).mean())
    return {"top1": jnp.stack(top1), "top5": jnp.stack(top5), "rank_accuracy": jnp.stack(rank)}


class _HeadObjective:
    """Shared pieces: the target, held-out evaluation, the no-tokenizer export."""

    has_tokenizer = False

    def __init__(self, config):
        self.config, self.heads = config, config.heads
        name = self.heads.target
        if name == "random":  # a random target with peaked distributions (std 0.1), for tests
            self.target = Model(init_params(config.model, jax.random.key(config.train.seed + 12345), std=0.1),
                                config.model)
        else:
            from specjax.convert import load

            self.target = load(name)
            if self.target.config.hidden_size != config.model.hidden_size or \
                    self.target.config.vocab_size != config.model.vocab_size or \
                    self.target.config.num_layers != config.model.num_layers:
                raise ValueError(f"[model] in the config does not describe the target {name!r}: "
                                 f"{config.model} vs {self.target.config}")
        self.tc = self.target.config
        self._eval = jax.jit(self._metrics)

    def _target(self, params):
        return self.target.params

    def evaluate(self, params, windows, batch_size):
        """Held-out accuracies (means over every window)."""
        sums, n = {}, 0
        for i in range(0, len(windows), batch_size):
            chunk = windows[i:i + batch_size]
            m = jax.device_get(self._eval(params, jnp.asarray(chunk)))
            for k, v in m.items():
                sums[k] = sums.get(k, 0.0) + np.asarray(v) * len(chunk)
            n += len(chunk)
        return {k: (v / n).tolist() for k, v in sums.items()}

    def _measured_accuracy(self, params) -> tuple:
        """The held-out per-rank accuracies [K][RANKS] (floored at 1e-4) that build a tree."""
        from specjax.train.data import eval_windows, load_streams

        _, val = load_streams(self.config.data)
        windows = eval_windows(val, self.config.data.seq_len + 1, 8 * self.config.train.batch_size)
        acc = self.evaluate(params, windows, self.config.train.batch_size)["rank_accuracy"]
        return tuple(tuple(round(max(a, 1e-4), 4) for a in row) for row in acc)


# ---- Medusa ------------------------------------------------------------------------------------

class Medusa1Objective(_HeadObjective):
    joint = False

    def init(self, key):
        h, c = self.heads, self.tc
        head = lm_head_weight(c, self.target.params)
        params = medusa_head.init(key, h.num_heads, c.hidden_size, c.vocab_size, lm_head=head,
                                  own_lm_head=h.own_lm_head)
        if self.joint:
            params = {"target": self.target.params,
                      "heads": jax.tree.map(lambda x: x / self.heads.lr_multiplier, params)}
        return params

    def _split(self, params):
        if self.joint:
            return params["target"], jax.tree.map(lambda x: x * self.heads.lr_multiplier, params["heads"])
        return self.target.params, params

    def _head_logits(self, params, batch):
        tp, hp = self._split(params)
        out = forward(self.tc, tp, batch[:, :-1], compute_logits=self.joint)
        hidden = out.hidden if self.joint else jax.lax.stop_gradient(out.hidden)
        head_w = lm_head_weight(self.tc, tp)
        return out, medusa_head.apply(hp, hidden, self.heads.num_layers, head_w)  # [B,T,K,V]

    def _per_head(self, logits, batch):
        """[(logits of head k at the valid t, labels t+2+k)] for each head."""
        t = batch.shape[1] - 1
        return [(logits[:, : t - 1 - k, k], batch[:, 2 + k:]) for k in range(logits.shape[2])]

    def loss_fn(self, params, batch):
        out, logits = self._head_logits(params, batch)
        metrics, loss = {}, 0.0
        for k, (lg, lab) in enumerate(self._per_head(logits, batch)):
            ce = _hard_ce(lg, lab)
            w = self.heads.decay ** k
            if self.joint:
                w = self.heads.heads_coefficient * self.heads.decay ** (k + 1)
            loss = loss + w * ce
            metrics[f"head{k}_loss"] = ce
            metrics[f"head{k}_top1"] = _topk_hits(lg, lab, 1).mean()
        if self.joint:
            lm = _hard_ce(out.logits, batch[:, 1:])
            metrics["lm_loss"] = lm
            loss = loss + lm
        metrics["loss"] = loss
        return loss, metrics

    def _metrics(self, params, batch):
        _, logits = self._head_logits(params, batch)
        return _rank_metrics(self._per_head(logits, batch))

    def export(self, params, out_dir):
        """Heads (and, for Medusa-2, the tuned target under target/) with the per-rank held-out
        accuracies that build the drafter's tree."""
        from specjax.drafters.medusa import Medusa

        acc = self._measured_accuracy(params)
        tp, hp = self._split(params)
        Medusa(jax.tree.map(np.asarray, hp), num_layers=self.heads.num_layers,
               tree_size=self.heads.tree_size, accuracy=acc).save(out_dir)
        if self.joint:
            import specjax

            specjax.save(Model(tp, self.tc), str(Path(out_dir) / "target"), format="hf")


class Medusa2Objective(Medusa1Objective):
    joint = True


# ---- EAGLE -------------------------------------------------------------------------------------

class EagleObjective(_HeadObjective):
    version = 1
    regress_features = True  # the loss adds feature_weight * SmoothL1 to the target's features

    def __init__(self, config):
        super().__init__(config)
        self.head_config = self._head_config()

    def _head_config(self):
        h = self.heads
        if self.version == 3 and h.ttt_steps < 1:
            raise ValueError("ttt_steps must be >= 1")
        return eagle_head.EagleConfig.for_target(self.tc, self.version, h.target_layers or None,
                                                 intermediate_size=h.intermediate_size or None)

    def init(self, key):
        return eagle_head.init(self.head_config, key, self.target.params)

    def _run(self, params, batch, noise: bool):
        """(list of draft logits per step [B,T',V], target logits per step [B,T',V])."""
        cfg, n = self.head_config, self.heads.ttt_steps
        tp = self.target.params
        out = forward(self.tc, tp, batch[:, :-1], return_layers=cfg.target_layers)
        out = jax.tree.map(jax.lax.stop_gradient, out)
        t = batch.shape[1] - 1 - n  # positions 0..t-1 have targets for every step
        feat = eagle_head.target_feature(cfg, params, out.hidden[:, :t],
                                         None if out.layer_hidden is None else out.layer_hidden[:, :, :t])
        if noise and cfg.version == 1 and self.heads.noise > 0:
            key = jax.random.fold_in(jax.random.key(self.config.train.seed), jnp.sum(batch))
            feat = feat + jax.random.uniform(key, feat.shape, minval=-self.heads.noise, maxval=self.heads.noise)
        emb = eagle_head.embed(params, tp["embed"], batch[:, 1: t + n])
        hs = eagle_head.unroll(cfg, params, emb, feat, n)
        head_w = lm_head_weight(self.tc, tp)
        return (hs, [eagle_head.logits(cfg, params, h, head_w) for h in hs], *_step_targets(out, n, t))

    def loss_fn(self, params, batch):
        hs, draft, target, feats = self._run(params, batch, noise=True)
        h, loss, metrics = self.heads, 0.0, {}
        for i, (d, tl) in enumerate(zip(draft, target)):
            ce = _soft_ce(tl, d)
            step_loss = ce
            if self.regress_features:
                reg = jnp.mean(_smooth_l1(hs[i] - feats[i]))
                step_loss = h.feature_weight * reg + h.ce_weight * ce
                metrics[f"step{i}_feature_loss"] = reg
            loss = loss + h.decay ** i * step_loss
            metrics[f"step{i}_ce"] = ce
            metrics[f"step{i}_kl"] = ce - _entropy(tl)  # KL(target || draft): 0 at a perfect draft
            metrics[f"step{i}_top1"] = (jnp.argmax(d, -1) == jnp.argmax(tl, -1)).mean()
        metrics["loss"] = loss
        return loss, metrics

    def _metrics(self, params, batch):
        """Per step: top-1/top-5 and per-rank hit rates against the target's greedy token."""
        _, draft, target, _ = self._run(params, batch, noise=False)
        return _rank_metrics([(d, jnp.argmax(tl, -1)) for d, tl in zip(draft, target)])

    def export(self, params, out_dir):
        from specjax.drafters.eagle import Eagle

        h = self.heads
        Eagle(jax.tree.map(np.asarray, params), self.head_config, top_k=h.top_k, depth=h.depth,
              total_tokens=h.total_tokens).save(out_dir)


class Eagle3Objective(EagleObjective):
    version = 3
    regress_features = False


def _step_targets(out, n: int, t: int) -> tuple[list, list]:
    """For draft steps i < n at positions 0..t-1: the target's logits and final normed hidden
    at position t+1+i (what step i predicts)."""
    return ([out.logits[:, 1 + i: 1 + i + t] for i in range(n)],
            [out.hidden[:, 1 + i: 1 + i + t] for i in range(n)])


def _smooth_l1(x):
    ax = jnp.abs(x)
    return jnp.where(ax < 1.0, 0.5 * x * x, ax - 0.5)


# ---- Clover ------------------------------------------------------------------------------------

class CloverObjective(EagleObjective):
    """Clover-2 (`specjax.heads.clover`), as its `main_clover2.py`: head i at position t reads
    h_t and e(x_{t+1..t+1+i}) (the text's tokens: teacher forcing) and is trained toward the
    target at t+1+i with EAGLE-1's loss shape, weighted decay^i. Clover-2's "correctness mask"
    (drop positions whose earlier tokens fall outside the target's top-p set) is not applied.
    The held-out accuracies are against the target's greedy token, as for EAGLE."""

    def _head_config(self):
        return CloverConfig.for_target(self.tc, self.heads.block_layers, self.heads.num_heads)

    def init(self, key):
        return clover_head.init(self.head_config, key, self.target.params)

    def _run(self, params, batch, noise: bool):
        """(head outputs, head logits, target logits, target features), each a list over heads of
        [B, T', ...] (Clover-2 trains without feature noise: `noise` is ignored)."""
        cfg, n, tp = self.head_config, self.heads.num_heads, self.target.params
        out = forward(self.tc, tp, batch[:, :-1], return_layers=(self.tc.num_layers - 1,))
        out = jax.tree.map(jax.lax.stop_gradient, out)
        b, t = batch.shape[0], batch.shape[1] - 1 - n  # positions 0..t-1 have targets for every head
        emb = tp["embed"][batch[:, 1: t + n]].astype(jnp.float32)  # emb[:, j] = e(x_{j+1})
        pos = jnp.broadcast_to(jnp.arange(t, dtype=jnp.int32), (b, t))
        causal = jnp.broadcast_to(jnp.tril(jnp.ones((t, t), bool)), (b, t, t))
        h, _, _ = clover_head.block(cfg, params, out.layer_hidden[0][:, :t], emb[:, :t], pos, causal)
        outs = clover_head.unroll(cfg, params, h, emb, n)
        head_w = lm_head_weight(self.tc, tp)
        return (outs, [clover_head.logits(o, head_w) for o in outs], *_step_targets(out, n, t))

    def export(self, params, out_dir):
        """The head with the per-rank held-out accuracies that build the drafter's tree."""
        from specjax.drafters.clover import Clover

        Clover(jax.tree.map(np.asarray, params), self.head_config, tree_size=self.heads.tree_size,
               accuracy=self._measured_accuracy(params)).save(out_dir)


# ---- PPD and Hidden Transfer ---------------------------------------------------------------------

class PPDObjective(_HeadObjective):
    """Every position i of the window gets K guesses (as in decoding, see
    specjax.heads.guesses); guess j is distilled toward the target's own distribution at
    position i + j: loss = sum_j 0.8^(j-1) KL(p_target(i+j) || p_guess(i, j)) / K (PPD's KD
    loss). The tokens never see the guesses, so one forward gives the teacher and the student."""

    def __init__(self, config):
        super().__init__(config)
        h = self.heads
        if h.num_guesses < 1:
            raise ValueError(f"num_guesses must be >= 1, got {h.num_guesses}")
        self.members = self._members()
        self.layer = self._layer()

    def _members(self) -> int:
        if self.heads.ensemble < 1:
            raise ValueError(f"ensemble must be >= 1, got {self.heads.ensemble}")
        return self.heads.ensemble

    def _layer(self) -> int:
        return 0

    def init(self, key):
        return ppd_head.init(key, self.heads.num_guesses, self.members, self.target.params["embed"])

    def _make(self, params, layout):
        return ppd_head.make(params, layout)

    def _run(self, params, batch):
        """(teacher logits [B, T, V], guess logits [B, T, K, V]) over the window batch [B, T]."""
        b, t = batch.shape
        k = self.heads.num_guesses
        layout = GuessLayout.build(np.full(t, k), k, self.members)
        causal = jnp.broadcast_to(jnp.tril(jnp.ones((t, t), bool)), (b, t, t))
        positions = jnp.broadcast_to(jnp.arange(t, dtype=jnp.int32), (b, t))
        inject = layout.injection(self.layer, self._make(params, layout), causal, positions)
        out = forward(self.tc, self.target.params, batch, inject=inject)
        guesses = out.logits[:, t:].reshape(b, t, k, self.members, -1).mean(3)
        return jax.lax.stop_gradient(out.logits[:, :t]), guesses

    def _pairs(self, params, batch):
        """[(guess j's logits at the positions i with i + j in the window, the target's there)]."""
        teacher, guesses = self._run(params, batch)
        t = batch.shape[1]
        return [(guesses[:, : t - j, j - 1], teacher[:, j:]) for j in range(1, self.heads.num_guesses + 1)]

    def loss_fn(self, params, batch):
        loss, metrics = 0.0, {}
        pairs = self._pairs(params, batch)
        for j, (g, tl) in enumerate(pairs):
            ce = _soft_ce(tl, g)
            loss = loss + self.heads.decay ** j * ce / len(pairs)
            metrics[f"guess{j}_kl"] = ce - _entropy(tl)
            metrics[f"guess{j}_top1"] = (jnp.argmax(g, -1) == jnp.argmax(tl, -1)).mean()
        metrics["loss"] = loss
        return loss, metrics

    def _metrics(self, params, batch):
        """Per guess, against the target's greedy token (what decides greedy acceptance)."""
        return _rank_metrics([(g, jnp.argmax(tl, -1)) for g, tl in self._pairs(params, batch)])

    def _drafter(self, params, accuracy):
        from specjax.drafters.parallel import PPD

        return PPD(params, tree_size=self.heads.tree_size, guess_budget=self.heads.guess_budget,
                   accuracy=accuracy)

    def export(self, params, out_dir):
        """The weights with the per-rank held-out accuracies that build the drafter's tree."""
        self._drafter(jax.tree.map(np.asarray, params), self._measured_accuracy(params)).save(out_dir)


class HiddenTransferObjective(PPDObjective):
    """The same distillation, through Hidden Transfer's pseudo states made at the transfer
    layer (`heads.transfer_layer`, 0: the middle layer)."""

    def _members(self) -> int:
        return 1

    def _layer(self) -> int:
        layer = self.heads.transfer_layer or self.tc.num_layers // 2
        if not 1 <= layer < self.tc.num_layers:
            raise ValueError(f"transfer_layer must be in [1, {self.tc.num_layers - 1}], got {layer}")
        return layer

    def init(self, key):
        return ht_head.init(self.heads.num_guesses, self.tc.hidden_size)

    def _make(self, params, layout):
        return ht_head.make(params, layout)

    def _drafter(self, params, accuracy):
        from specjax.drafters.parallel import HiddenTransfer

        return HiddenTransfer(params, tree_size=self.heads.tree_size, guess_budget=self.heads.guess_budget,
                              accuracy=accuracy, transfer_layer=self.layer)


HEAD_OBJECTIVES = {"medusa1": Medusa1Objective, "medusa2": Medusa2Objective, "eagle": EagleObjective,
                   "eagle3": Eagle3Objective, "clover": CloverObjective, "ppd": PPDObjective, "hidden-transfer": HiddenTransferObjective}
