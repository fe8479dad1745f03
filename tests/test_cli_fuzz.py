"""Generated command lines for every subcommand of `python -m specjax` and `python -m
specjax.train`, and for `python -m specjax.bench.structured`, made from the parsers' own option
tables: valid, invalid, extreme and mixed values, and files that do not exist, are empty,
truncated, binary or folders. Each runs in this process against the tiny model with tiny
budgets and must end with exit status 0, or 2 and exactly one line on stderr; never a traceback.

Every example runs in a fresh temporary folder, and what a command writes (OUT, DIR, --out) is
a path inside it or inside the fixture's temporary folder, never an absolute path elsewhere or
a way up; hypothesis keeps its caches there too: nothing is written outside the test's tmp_path.

A bounded number of examples per subcommand by default, the same ones each run (the suite's
time: about a minute in all); SPECJAX_FUZZ_EXAMPLES=N runs N random ones per subcommand
(thousands in all: N=200; `pytest -rP` says how many each ran). The last long run:
docs/guide/cli-fuzz.md.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import itertools
import json
import os
import shutil
from pathlib import Path

import pytest
from hypothesis import HealthCheck, configuration, given, settings
from hypothesis import strategies as st

from specjax import __main__ as specjax_cli
from specjax.bench import structured
from specjax.convert import resolve
from specjax.train import __main__ as train_cli

# examples per subcommand by default (a valid generate or bench compiles, a valid run trains)
DEFAULT_EXAMPLES = {"generate": 12, "convert": 5, "bench": 3, "run": 4, "export": 3, "distill": 3,
                    "features": 3, "evaluate": 3, "tokenizer": 3, "structured": 3, "trajectories": 3}
EXAMPLES = int(os.environ.get("SPECJAX_FUZZ_EXAMPLES", "0"))

# The valid values of the options whose valid values are not in the parser (names, files), or
# are but compile a program each (drafters, sampling settings), by dest: a function of the
# files fixture ("command.dest" for one command's own). Other valid values come from the parser
# (choices, ranges); an option with neither must be added here.
VALID = {
    "drafter": lambda f: ["ar", "prompt-lookup"],
    "temperature": lambda f: ["0", "0.7"],
    "top_k": lambda f: ["5"],
    "top_p": lambda f: ["1"],
    "model": lambda f: ["tiny", str(f["tiny"])],
    "draft": lambda f: ["tiny-draft"],
    "json_schema": lambda f: [str(f["schema.json"])],
    "grammar": lambda f: [str(f["answer.lark"])],
    "regex": lambda f: ["[0-9]+", "(ab|c)*d?", "x"],
    "prompt": lambda f: ["x = ", "def f(a):", "é ✓ 日本"],
    "system": lambda f: ["Be brief."],
    "src": lambda f: ["tiny-draft", str(f["tiny"])],
    "out": lambda f: [str(f.fresh())],
    "dir": lambda f: [str(f.fresh())],
    "methods": lambda f: [["ar"], ["prompt-lookup"]],
    "dllm": lambda f: ["tiny"],  # not a masked-diffusion model: refused before it runs (a real one is a long job)
    "tasks": lambda f: [["copy"], ["shuffle", "sudoku"]],
    "samplers": lambda f: [["static"], ["threshold-0.9", "freedave-4"]],
    "sampler": lambda f: ["static", "threshold-0.9"],  # with --model tiny: refused (not a dLLM)
    "structured.methods": lambda f: [["constrained-ar"], ["unconstrained-ar"]],  # the forced rows compile ~20 s
    "prompts": lambda f: ["stdlib", str(f["prompts.jsonl"])],
    "config": lambda f: [str(f["c.toml"])],
    "set": lambda f: ["optim.lr=1e-3", "train.log_every=1", "train.seed=3"],
    "mesh": lambda f: ["1,1", "-1,1"],
    "temperatures": lambda f: ["0", "0,0.5"],
    "corpus": lambda f: [str(f["corpus"])],
    "schemas": lambda f: [str(f["schemas.jsonl"])],
    "tasks": lambda f: [["copy"], ["pair", "sudoku"]],
}
# valid numbers kept small: they are budgets (tokens, steps, prompts, batch rows)
CHEAP = {"max_new_tokens": 3, "batch": 2, "repeats": 1, "num_prompts": 2, "steps": 2, "new_tokens": 2,
         "windows": 2, "batch_size": 2, "max_prompt_tokens": 64, "draft_vocab": 64, "vocab_size": 300, "limit": 1}
# budgets whose valid extremes are long jobs (others, like --batch or --max-new-tokens, are
# refused by the memory and context checks and stay in)
RUN_LONG = {"steps", "repeats", "num_prompts", "vocab_size", "windows", "batch_size", "draft_vocab", "limit"}
# options whose defaults are long jobs (every method, 128 tokens, the stdlib corpus, every schema,
# SmolLM2): always given
ALWAYS = {"methods", "max_new_tokens", "num_prompts", "repeats", "new_tokens", "windows", "corpus", "batch_size",
          "limit", "model"}
NOT_FUZZED = {"distributed"}  # needs a cluster; initialize() refuses to run after JAX has started
# options a command writes to: their invalid values stay inside the example's folder, whose
# `empty` and `binary` files and `folder` are made for each example
WRITES = {"out", "dir"}
LOCAL = ["empty", "binary", "folder", "folder/new", "missing/deeper", "."]
# (no NUL: a command line cannot carry one; non-UTF-8 bytes arrive as surrogate escapes, like "\udcff")
BAD_TEXT = ["", " ", "-", "--", "\udcff", "nan", "inf", "-1", "1e400", "9" * 40, "x" * 300, "[1,", "é"]


class Files(dict):
    """The fixture files by name (read only), and fresh output folders."""

    def __init__(self, root: Path):
        super().__init__()
        self.root, self.count = root, 0

    def fresh(self) -> Path:
        self.count += 1
        return self.root / f"out-{self.count}"


@pytest.fixture(scope="module")
def files(tmp_path_factory, code_corpus):
    import tomli_w

    root = tmp_path_factory.mktemp("fuzz")
    f = Files(root)
    f["missing"] = root / "missing"
    f["empty"] = root / "empty"
    f["empty"].write_bytes(b"")
    f["binary"] = root / "binary"
    f["binary"].write_bytes(bytes(range(256)) * 4)
    f["folder"] = root / "folder"
    f["folder"].mkdir()
    f["tiny"] = root / "tiny"
    shutil.copytree(resolve("tiny"), f["tiny"])
    f["truncated"] = root / "truncated"
    shutil.copytree(resolve("tiny-draft"), f["truncated"])
    weights = f["truncated"] / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:4000])
    (f["truncated"] / "tokenizer.json").write_text((resolve("tiny") / "tokenizer.json").read_text()[:500])
    f["schema.json"] = root / "schema.json"
    f["schema.json"].write_text('{"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]}')
    f["answer.lark"] = root / "answer.lark"
    f["answer.lark"].write_text('start: "Answer: " /(yes|no)/\n')
    f["bad.json"] = root / "bad.json"
    f["bad.json"].write_text('{"type": "object", "properties": ')
    f["prompts.jsonl"] = root / "prompts.jsonl"
    f["prompts.jsonl"].write_text('{"prompt": "def f(x):"}\n{"prompt": "import os", "category": "b"}\n')
    f["bad.jsonl"] = root / "bad.jsonl"
    f["bad.jsonl"].write_text('{"prompt": "x"}\n{"turns": 3}\n[1]\n')
    f["schemas.jsonl"] = root / "schemas.jsonl"
    f["schemas.jsonl"].write_text(json.dumps({"name": "a", "kind": "flat", "schema": json.loads(
        f["schema.json"].read_text()), "prompt": "An object."}) + "\n")
    f["corpus"] = code_corpus / "src"
    raw = {"model": {"model_type": "llama", "vocab_size": 300, "hidden_size": 16, "intermediate_size": 32,
                     "num_layers": 1, "num_heads": 2, "num_kv_heads": 1, "head_dim": 8,
                     "max_position_embeddings": 64, "tie_word_embeddings": True},
           "data": {"tokenizer": str(code_corpus / "tok"), "cache_dir": str(root / "cache"),
                    "corpus": str(code_corpus / "src"), "held_out": ["m3.py"], "seq_len": 8},
           "optim": {"lr": 1e-2, "warmup_steps": 1},
           "train": {"out": str(root / "run"), "steps": 2, "batch_size": 2, "log_every": 1, "eval_every": 1000,
                     "eval_batches": 1, "save_every": 1000}}
    f["c.toml"] = root / "c.toml"
    f["c.toml"].write_bytes(tomli_w.dumps(raw).encode())
    f["bad.toml"] = root / "bad.toml"
    f["bad.toml"].write_bytes(tomli_w.dumps({**raw, "optim": {"lr": "fast"}}).encode())
    f["truncated.toml"] = root / "truncated.toml"
    f["truncated.toml"].write_bytes(tomli_w.dumps(raw).encode()[:150])
    return f


def _subcommands(parser) -> dict:
    return next(a for a in parser._actions if a.dest == "command").choices


# (main, name, parser, what precedes the options: the subcommand's name)
COMMANDS = [(specjax_cli.main, name, sub, [name]) for name, sub in _subcommands(specjax_cli._parser()).items()] + \
           [(train_cli.main, name, sub, [name]) for name, sub in _subcommands(train_cli.parser()).items()] + \
           [(structured.main, "structured", structured.parser(), [])]


def _value(draw, name, action, f, valid: bool) -> str:
    """One value for `action` of command `name`: valid, or drawn from invalid and extreme ones."""
    bounds = getattr(action.type, "bounds", None)
    if valid:
        known = VALID.get(f"{name}.{action.dest}", VALID.get(action.dest))
        if known is not None:
            return draw(st.sampled_from(known(f)))
        if action.choices is not None:
            return draw(st.sampled_from(list(action.choices)))
        if bounds is None:
            pytest.fail(f"no valid values for {action.dest} ({action.option_strings}): add it to VALID")
        low, high = (0 if bounds[0] is None else bounds[0]), bounds[1]  # small values, and the top
        top = low + CHEAP.get(action.dest, 3) if high is None else min(high, low + CHEAP.get(action.dest, 3))
        values = (st.one_of(st.integers(low, top), st.just(low if high is None else high))
                  if action.type.__name__ == "integer" else st.floats(low, top))
        return draw(values.map(repr).filter(lambda text: _parses(action.type, text)))
    numbers = ["0", "-1", "1.5", str(2**63), str(-(2**63) - 1), str(10**30), "1e308", "-0", "0x10", "1_000"]
    text = st.text(st.characters(blacklist_characters="\x00"), max_size=12)
    if action.dest in WRITES:  # relative: inside the example's folder
        return draw(st.one_of(st.sampled_from(LOCAL + BAD_TEXT + numbers), text).map(_inside))
    files = [str(f[k]) for k in ("missing", "empty", "binary", "folder", "truncated", "bad.json", "bad.jsonl",
                                  "bad.toml", "truncated.toml")]
    values = st.one_of(st.sampled_from(BAD_TEXT + files + numbers), text)
    if action.dest in RUN_LONG:  # a valid huge budget is a long job, not an error: not run here
        values = values.filter(lambda text: not _parses(action.type, text))
    if action.dest == "set":  # no override of where a run writes
        values = values.filter(lambda text: "out" not in text and "dir" not in text)
    return draw(values)


def _inside(text: str) -> str:
    """`text` as a path under the current folder: not absolute, no way up (keeps '' and '-')."""
    parts = [part for part in text.replace("\\", "/").split("/") if part not in ("..", "~")]
    return "/".join(parts).lstrip("/") if text not in ("", "-", "--") else text


def _parses(parse, text: str) -> bool:
    try:
        parse(text)
    except argparse.ArgumentTypeError:
        return False
    return True


@st.composite
def command_lines(draw, name, sub, f) -> list[str]:
    all_valid = draw(st.integers(0, 3)) == 0
    argv = []
    options = [a for a in sub._actions if a.option_strings and a.dest not in ("help", *NOT_FUZZED)]
    for action in draw(st.permutations(options)):
        given = action.required or action.dest in ALWAYS
        if not (given or draw(st.booleans())) or (action.required and not all_valid and draw(st.integers(0, 9)) == 0):
            continue
        flag = draw(st.sampled_from(action.option_strings))
        if action.nargs == 0:
            argv.append(flag)
            continue
        count = 1 if action.nargs is None else draw(st.integers(0 if action.nargs == "*" else 1, 2))
        values = [_value(draw, name, action, f, all_valid or draw(st.booleans())) for _ in range(count)]
        values = [v for group in values for v in (group if isinstance(group, list) else [group])]
        if count == 1 and not values[0].startswith("-") and draw(st.booleans()):
            argv.append(f"{flag}={values[0]}")
        else:
            argv += [flag, *values]
    for action in sub._actions:  # positionals, in order
        if not action.option_strings and (all_valid or draw(st.integers(0, 9)) > 0):
            argv.append(_value(draw, name, action, f, all_valid or draw(st.booleans())))
    if not all_valid and draw(st.integers(0, 4)) == 0:
        argv.insert(draw(st.integers(0, len(argv))), draw(st.sampled_from(["--bogus", "extra", "--", "-x"])))
    return argv


@pytest.mark.parametrize("main, name, sub, prefix", COMMANDS, ids=[f"{m.__module__.split('.')[-2]}-{n}"
                                                                  for m, n, *_ in COMMANDS])
def test_every_command_line_ends_in_0_or_one_error_line(main, name, sub, prefix, files, tmp_path, monkeypatch):
    monkeypatch.setenv("SPECJAX_CACHE", str(tmp_path / "cache"))  # a GGUF conversion's cache
    examples = itertools.count()

    @settings(max_examples=EXAMPLES or DEFAULT_EXAMPLES[name], derandomize=not EXAMPLES, deadline=None,
              database=None, suppress_health_check=list(HealthCheck))
    @given(st.data())
    def run(data):
        here = tmp_path / f"example-{next(examples)}"  # the example's folder, its working directory
        (here / "folder").mkdir(parents=True)
        (here / "empty").write_bytes(b"")
        (here / "binary").write_bytes(bytes(range(256)) * 4)
        monkeypatch.chdir(here)
        try:
            argv = [*prefix, *data.draw(command_lines(name, sub, files), label="argv")]
            out, err = io.StringIO(), io.StringIO()
            with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
                try:
                    code = main(argv)
                except SystemExit as e:  # --help
                    code = e.code
        finally:
            monkeypatch.chdir(tmp_path)
            shutil.rmtree(here)
        err = err.getvalue()
        assert "Traceback" not in err, err
        assert code in (0, 2), (code, err)
        if code == 2:
            assert err.startswith("error: ") and err.count("\n") == 1, err

    configuration.set_hypothesis_home_dir(tmp_path / "hypothesis")  # its caches too
    try:
        run()
    finally:
        configuration.set_hypothesis_home_dir(None)
    print(f"{name}: {next(examples)} command lines")  # shown by pytest -rP
