"""Grammar constraints on llguidance's host matchers: greedy speculation equal to constrained AR
with valid outputs, the sampled law against the exact constrained law (with a negative
control), one constraint a row, the engine chosen by size, bounded compiles, and `--grammar`."""

from __future__ import annotations

import json
import re
import subprocess
import sys

import jax.numpy as jnp
import numpy as np
import pytest

import specjax as sj
from specjax.constraints import UnsupportedSchema, matchers
from specjax.sampling import SamplingParams, probs
from tests.exactness import PROMPT, V, chi_square_pvalue, sampled_joint, sharp_model

PERSON = {"type": "object", "properties": {
    "name": {"type": "string", "maxLength": 8}, "age": {"type": "integer", "minimum": 0, "maximum": 120},
    "role": {"enum": ["admin", "user"]}}, "required": ["name", "age", "role"], "additionalProperties": False}
RECORD = r'\{"id": [0-9]{1,3}, "name": "(ab|cd)[a-z]{2,5}"\}'


@pytest.fixture(scope="module")
def tiny():
    return sj.load("tiny"), sj.load_tokenizer("tiny")


def test_greedy_speculation_equals_constrained_ar_and_every_output_validates(tiny):
    import jsonschema

    model, tok = tiny
    constraint = sj.constraints.json_schema(PERSON, tok)
    assert not constraint.on_device  # free strings: llguidance on the host
    prompts = [tok.encode("The user:"), tok.encode("def main():\n    return")]
    ar = sj.generate(model, prompts, max_new_tokens=48, constraint=constraint)
    for row, n in zip(ar.tokens, ar.num_tokens):
        assert row[n - 1] in tok.eos_token_ids, tok.decode(row[:n])
        jsonschema.validate(json.loads(tok.decode(row[: n - 1])), PERSON)
    for drafter in (sj.drafters.Forced(sj.drafters.PromptLookup()),
                    sj.drafters.Forced(sj.drafters.DraftModel(sj.load("tiny-draft"), k=3))):
        spec = sj.generate(model, prompts, max_new_tokens=48, constraint=constraint, drafter=drafter)
        np.testing.assert_array_equal(spec.tokens, ar.tokens)
        assert spec.stats.target_calls < ar.stats.target_calls  # forced text: `{"name": "` in one step


# ---- the sampled law on a 6-token vocabulary ----------------------------------------------------

def _six_token_tokenizer():
    """Byte-level tokens EOS, a, b, c, ab, d (ids 0..5: the sharp models' vocabulary)."""
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers

    tok = Tokenizer(models.BPE({"<|endoftext|>": 0, "a": 1, "b": 2, "c": 3, "ab": 4, "d": 5}, merges=[("a", "b")]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens([AddedToken("<|endoftext|>", special=True)])
    return tok


def _exact_constrained_joint(target, constraint, params, n=2):
    """P(first n tokens) under the target masked by fresh llguidance matchers, by enumeration."""
    start = constraint._matchers.grammars[0]
    joint = {(): 1.0}
    for _ in range(n):
        seqs = list(joint)
        logits = np.array(sj.forward(target, jnp.array([PROMPT + list(s) for s in seqs]))[:, -1])
        for i, s in enumerate(seqs):
            if joint[s] == 0:  # a prefix the grammar forbids: its row carries no mass
                continue
            m = start.deep_copy()
            assert m.consume_tokens(list(s)) if s else True
            bits = np.unpackbits(np.frombuffer(m.compute_bitmask(), np.uint8), bitorder="little")[:V]
            logits[i, bits == 0] = -np.inf
        p = np.asarray(probs(jnp.asarray(logits), params), np.float64)
        joint = {s + (x,): joint[s] * p[i, x] for i, s in enumerate(seqs) for x in range(V)}
    table = np.array([joint[s] for s in sorted(joint)])
    return table / table.sum()


def test_sampled_law_is_the_constrained_law_and_masks_off_their_paths_are_caught(monkeypatch):
    target, draft = sharp_model(0), sharp_model(1)
    # the first token's mask is a subset of every later one: masks taken at the wrong place (the
    # negative control) then never let a forbidden token through, they only change the law
    constraint = sj.constraints.regex("(a|c)[abcd]*", _six_token_tokenizer(), engine="llguidance")
    params = SamplingParams(1.0)
    exact = _exact_constrained_joint(target, constraint, params)
    # the host's masks serve every rule alike (the verifiers' exactness is tested without a
    # constraint): one exact rule here, speculative sampling on a chain; the host's matchers cost
    # most of the time, so 2000 draws for each (the negative control's p-value underflows to 0 on
    # 2000)
    drafter = sj.drafters.Forced(sj.drafters.DraftModel(draft, k=2), max_forced=2)
    counts = sampled_joint(target, drafter, None, params, constraint=constraint, samples=2000)
    assert chi_square_pvalue(counts, exact) > 1e-3

    def root_mask_everywhere(self, matcher, tokens, paths, depth, valid, masks, alive):
        matcher.unsafe_compute_mask_ptr(masks[0].ctypes.data, masks[0].nbytes)
        masks[:] = masks[0]

    # the target drafting for itself: every first draft accepted, so the second token is always
    # drawn at a tree node, under the root's mask (a, c, ab) instead of its own
    monkeypatch.setattr(matchers.Matchers, "_walk", root_mask_everywhere)  # runs at call time: no retrace
    itself = sj.drafters.Forced(sj.drafters.DraftModel(target, k=2), max_forced=2)
    counts = sampled_joint(target, itself, None, params, constraint=constraint, samples=2000)
    assert chi_square_pvalue(counts, exact) < 1e-6


# ---- rows, engines, limits, the command line ------------------------------------------------------

def test_one_constraint_a_row(tiny):
    model, tok = tiny
    rows = sj.constraints.per_row([sj.constraints.json_schema(PERSON, tok), None,
                                   sj.constraints.regex(RECORD, tok)])
    prompts = [tok.encode("The user:"), tok.encode("def main():\n    return"), tok.encode("The record:")]
    out = sj.generate(model, prompts, max_new_tokens=40, constraint=rows,
                      drafter=sj.drafters.Forced(sj.drafters.PromptLookup()))
    listed = sj.generate(model, prompts, max_new_tokens=40, constraint=[sj.constraints.json_schema(PERSON, tok)])
    np.testing.assert_array_equal(listed.tokens[0], out.tokens[0])  # a list is per_row's
    free = sj.generate(model, prompts, max_new_tokens=40)
    texts = [tok.decode(row[: n - 1]) for row, n in zip(out.tokens, out.num_tokens)]
    assert json.loads(texts[0]).keys() == {"name", "age", "role"}
    np.testing.assert_array_equal(out.tokens[1], free.tokens[1])  # None: unconstrained
    assert re.fullmatch(RECORD, texts[2]), texts[2]
    with pytest.raises(TypeError, match="per_row takes constraints from sj.constraints"):
        sj.constraints.per_row([sj.constraints.Unconstrained()])


def test_the_engine_is_chosen_by_size_with_the_same_language(tiny):
    model, tok = tiny
    assert sj.constraints.regex(RECORD, tok).on_device  # bounded repetition: the device automaton
    assert sj.constraints.json_schema({"enum": ["red", "green", "blue"]}, tok).on_device
    assert not sj.constraints.regex(r"[a-z]+", tok).on_device  # unbounded: llguidance
    assert not sj.constraints.json_schema({"type": "object"}, tok).on_device  # whitespace written
    prompts = [tok.encode("The record:"), tok.encode("def main():\n    return")]
    for engine in ("automaton", "llguidance"):
        out = sj.generate(model, prompts, max_new_tokens=40, constraint=sj.constraints.regex(RECORD, tok, engine=engine))
        for row, n in zip(out.tokens, out.num_tokens):
            assert re.fullmatch(RECORD, tok.decode(row[: n - 1])), (engine, tok.decode(row[:n]))


COMPILE_WORST = r'''
import json, resource, sys, time
import specjax as sj
tok = sj.load_tokenizer("smollm2" if len(sys.argv) > 1 else "tiny")
wide = {"type": "object", "properties": {f"f{i}": {"type": "string"} for i in range(400)},
        "required": [f"f{i}" for i in range(400)]}
deep = {"type": "string"}
for _ in range(64):
    deep = {"type": "object", "properties": {"x": deep, "y": {"type": "array", "items": {"type": "number"}}}}
tree = {"$defs": {"node": {"type": "object", "properties": {"v": {"type": "integer"},
        "kids": {"type": "array", "items": {"$ref": "#/$defs/node"}}}}}, "$ref": "#/$defs/node"}
enum = {"enum": [f"value-{i}" for i in range(5000)]}
pattern = {"type": "string", "pattern": "^([a-f0-9]{8}-){40}[a-z]{2,64}$"}
before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
for name, schema in [("wide", wide), ("deep", deep), ("recursive", tree), ("enum", enum), ("pattern", pattern)]:
    t = time.perf_counter()
    try:
        sj.constraints.json_schema(schema, tok)
        refused = None
    except sj.constraints.UnsupportedSchema as e:
        refused = str(e)
    print(json.dumps({"name": name, "s": time.perf_counter() - t, "refused": refused}))
print(json.dumps({"rss_mb": (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before) / 1024}))
'''


def test_the_worst_schemas_compile_in_bounded_time_and_memory():
    """Shapes that grew outlines-core's index to GBs (hundreds of free strings, deep nesting) and
    that no automaton holds (recursion), compiled in a fresh process: each compiled or refused
    with its reason in under 2 s, and the process's peak memory grows by less than 1 GB."""
    r = subprocess.run([sys.executable, "-c", COMPILE_WORST], capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-2000:]
    rows = [json.loads(line) for line in r.stdout.splitlines()]
    assert [row["name"] for row in rows[:-1]] == ["wide", "deep", "recursive", "enum", "pattern"]
    assert all(row["s"] < 2 for row in rows[:-1]), rows
    assert [row["name"] for row in rows[:-1] if row["refused"]] == ["deep"], rows  # 64 levels
    assert "recursion limit exceeded" in rows[1]["refused"]
    assert rows[-1]["rss_mb"] < 1024, rows


def test_refused_features_and_limits_are_named(tiny):
    _, tok = tiny
    with pytest.raises(UnsupportedSchema, match=r'cannot compile the JSON schema: Unimplemented keys: \["uniqueItems"\]'):
        sj.constraints.json_schema({"type": "array", "uniqueItems": True}, tok)
    with pytest.raises(UnsupportedSchema, match="cannot compile the JSON schema: .*/nope"):
        sj.constraints.json_schema({"$ref": "#/nope"}, tok)
    with pytest.raises(UnsupportedSchema, match="cannot compile the grammar"):
        sj.constraints.grammar("start: missing_rule", tok)
    with pytest.raises(ValueError, match="engine must be one of"):
        sj.constraints.regex("a", tok, engine="dfa")


def test_cli_grammar_flag(tmp_path, capsys):
    from specjax.__main__ import main

    lark = tmp_path / "answer.lark"
    lark.write_text('start: "Answer: " /(yes|no)/ "."\n')
    assert main(["generate", "--prompt", "Is it?", "--grammar", str(lark), "--drafter", "ar",
                 "--max-new-tokens", "12", "--no-chat"]) == 0
    out, _ = capsys.readouterr()
    assert re.fullmatch(r"Is it\?Answer: (yes|no)\.", out.strip()), out
    lark.write_text("start: missing_rule\n")
    assert main(["generate", "--prompt", "x", "--grammar", str(lark)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("error: --grammar: cannot compile the grammar"), err
