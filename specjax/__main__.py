"""`python -m specjax <command>`: generate, convert."""

from __future__ import annotations

import argparse
import dataclasses
import sys
from pathlib import Path

# Weights past any CPU cache: a batch-1 step reads them all from memory, the regime where a step
# over a few tokens costs little more than over one.
MEMORY_BOUND_BYTES = 256 << 20


class UsageError(Exception):
    """Bad command-line input: reported as one line on stderr with exit code 2."""


def default_drafter(target, temperature: float) -> str:
    """The method `generate` uses without --drafter, the fastest measured for this kind of target
    and temperature (benchmarks/README.md), never one measured slower than AR: prompt lookup at
    temperature 0; when sampling, prompt lookup for a target whose weights are memory-bound
    (MEMORY_BOUND_BYTES or more) and AR for one that fits in cache."""
    import jax

    if temperature == 0:
        return "prompt-lookup"
    weights = sum(leaf.nbytes for leaf in jax.tree.leaves(target.params))
    return "prompt-lookup" if weights >= MEMORY_BOUND_BYTES else "ar"


def _generate_methods() -> dict:
    """The methods `generate --drafter` takes (a plain name, no constraint needed), by name."""
    from specjax.methods import METHODS

    return {m.name: m for m in METHODS.values()
            if m.runner == "drafter" and not m.argument and "constraint" not in m.needs}


def _bench_methods() -> dict:
    """The methods `bench --methods` takes (all but those that need a constraint), by usage."""
    from specjax.methods import METHODS

    return {u: m for u, m in METHODS.items() if "constraint" not in m.needs}


def _listing(methods: dict) -> str:
    """'name: description; ...' for a --help text (argparse %-formats help strings)."""
    return "; ".join(f"{name}: {m.description}" for name, m in methods.items()).replace("%", "%%")


def _parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="python -m specjax", description=__doc__)
    sub = ap.add_subparsers(dest="command", required=True)

    g = sub.add_parser("generate", help="generate text from a prompt, printing as it comes")
    g.add_argument("--prompt", required=True)
    g.add_argument("--model", default="tiny", help="model name (tiny, smollm2), HF folder with a tokenizer, or .gguf file")
    g.add_argument("--max-new-tokens", type=int, default=128)
    g.add_argument("--temperature", type=float, default=0.0)
    g.add_argument("--top-k", type=int, default=None)
    g.add_argument("--top-p", type=float, default=None)
    g.add_argument("--seed", type=int, default=0)
    g.add_argument("--drafter", default=None,
                   help=f"the decoding method (default: the fastest measured for the model and temperature): "
                        f"{_listing(_generate_methods())}")
    g.add_argument("--chat", action=argparse.BooleanOptionalAction, default=None,
                   help="render the prompt as a user message with the model's chat template "
                        "(default: when the model has one) and print only the answer")
    g.add_argument("--system", default=None, help="a system message (with --chat)")
    shape = g.add_mutually_exclusive_group()
    shape.add_argument("--json-schema", type=Path, default=None, metavar="FILE",
                       help="constrain the output to JSON valid under this schema (forced tokens drafted)")
    shape.add_argument("--regex", default=None, metavar="PATTERN", help="constrain the output to this regex")

    c = sub.add_parser("convert", help="convert an HF folder to a specjax checkpoint (or back)")
    c.add_argument("src", help="HF folder or specjax checkpoint")
    c.add_argument("out")
    c.add_argument("--format", choices=("specjax", "hf"), default="specjax")
    c.add_argument("--dtype", choices=("float32", "bfloat16", "float16"), default=None)
    c.add_argument("--force", action="store_true", help="replace OUT if it holds a model already")
    bn = sub.add_parser("bench", help="tau, tokens/s and speedup of every method on a prompt set")
    bn.add_argument("--model", default="tiny")
    bn.add_argument("--draft", default="tiny-draft", help="draft model for the methods that need one: "
                    + ", ".join(u for u, m in _bench_methods().items() if "draft model" in m.needs))
    bn.add_argument("--methods", nargs="+", default=None,
                    help=f"methods to run (default: all with a plain name): {_listing(_bench_methods())}")
    bn.add_argument("--prompts", default="stdlib",
                    help="stdlib (held-out code, for the tiny model; default), humaneval, chat (the "
                         "Spec-Bench-style set), or a JSONL file of rows with a 'prompt' or Spec-Bench 'turns'")
    bn.add_argument("--batch", type=int, nargs="+", default=[1])
    bn.add_argument("--max-new-tokens", type=int, default=128)
    bn.add_argument("--temperature", type=float, default=0.0,
                    help="sample with each method's exact rule (transformers rows are greedy only)")
    bn.add_argument("--repeats", type=int, default=3)
    bn.add_argument("--num-prompts", type=lambda s: None if s == "all" else int(s), default=8,
                    help="how many, taken in turn from each category, or 'all' (default 8)")
    bn.add_argument("--out", default="runs/bench")
    bn.add_argument("--quick", action="store_true", help="2 prompts, 16 new tokens, 1 repeat")
    return ap


def _load_tokenizer(path: Path):
    from specjax.tokenizer import load_tokenizer

    if path.suffix != ".gguf" and not (path / "tokenizer.json").exists():
        raise UsageError(f"{path} has no tokenizer.json; --model needs a folder with a tokenizer")
    try:
        return load_tokenizer(path)
    except Exception as e:  # a malformed tokenizer file
        raise UsageError(f"{path}: cannot read the tokenizer ({e})") from None


def cmd_generate(args) -> None:
    import jax

    import specjax as sj
    from specjax.convert import resolve
    from specjax import methods
    from specjax.decoding import check_positions
    from specjax.sampling import SamplingParams

    if args.drafter is not None and args.drafter not in _generate_methods():
        raise UsageError(f"unknown --drafter {args.drafter!r}; choose from: {', '.join(_generate_methods())}")
    for flag, text in (("--prompt", args.prompt), ("--system", args.system or "")):
        try:
            text.encode("utf-8")
        except UnicodeEncodeError as e:  # argv bytes that are not UTF-8 arrive as surrogate escapes
            raise UsageError(f"{flag} is not valid UTF-8 (byte 0x{ord(e.object[e.start]) & 0xFF:02x} "
                             f"at character {e.start})") from None
    try:
        SamplingParams(args.temperature, args.top_k, args.top_p)
        if args.max_new_tokens < 1:
            raise ValueError(f"--max-new-tokens must be >= 1, got {args.max_new_tokens}")
        folder = resolve(args.model)
    except (ValueError, OSError) as e:
        raise UsageError(str(e)) from None
    tokenizer = _load_tokenizer(folder)
    constraint = _constraint(args, tokenizer)
    chat = tokenizer.chat_template is not None if args.chat is None else args.chat
    if chat and tokenizer.chat_template is None:
        raise UsageError(f"--chat: the model {args.model} has no chat template")
    if args.system is not None and not chat:
        raise UsageError("--system needs --chat (a model with a chat template)")
    try:
        model = sj.load(folder)
    except (ValueError, OSError, KeyError) as e:
        raise UsageError(f"cannot load --model {args.model}: {e}") from None
    messages = [{"role": "system", "content": args.system}] if args.system is not None else []
    try:
        ids = (tokenizer.chat(messages + [{"role": "user", "content": args.prompt}]) if chat
               else tokenizer.encode(args.prompt))
    except Exception as e:  # the template raised (e.g. a role it does not accept)
        raise UsageError(f"cannot apply the chat template: {e}") from None
    if not ids:
        raise UsageError("--prompt is empty after tokenization")
    name = args.drafter or default_drafter(model, args.temperature)
    eos = sorted({*tokenizer.eos_token_ids, *([model.config.eos_token_id] if model.config.eos_token_id is not None else [])})
    try:
        check_positions(model.config, len(ids), args.max_new_tokens)  # before the echo
        drafter = methods.make(name, model)  # None: plain AR, which a constraint leaves as it is
        if constraint is not None and drafter is not None and drafter.supports_forced:
            drafter = sj.drafters.Forced(drafter)
        steps = sj.stream(model, ids, max_new_tokens=args.max_new_tokens, drafter=drafter,
                          temperature=args.temperature, top_k=args.top_k, top_p=args.top_p,
                          key=jax.random.key(args.seed), eos_token_id=eos or None, constraint=constraint)
    except (ValueError, OSError) as e:
        raise UsageError(str(e)) from None
    shown = [] if chat else ids  # a chat prints the answer alone; plain text continues the prompt
    print("" if chat else args.prompt, end="", flush=True)
    new = []
    while True:
        try:
            chunk = next(steps)
        except StopIteration as stop:
            stats = stop.value
            break
        before = tokenizer.decode(shown + new, skip_special_tokens=True)
        new += chunk
        print(tokenizer.decode(shown + new, skip_special_tokens=True)[len(before):], end="", flush=True)
    why = "" if args.drafter else f" (default at temperature {args.temperature:g})"
    print(f"\n[{len(new)} new tokens, {stats.tokens_per_s:.1f} tokens/s, tau {stats.tau:.2f}, "
          f"method {name}{why}, verifier {stats.verifier}, compile {stats.compile_s:.1f} s]",
          file=sys.stderr)


def _constraint(args, tokenizer):
    """The --json-schema / --regex automaton (None without either)."""
    import specjax as sj

    try:
        if args.json_schema is not None:
            return sj.constraints.json_schema(args.json_schema.read_text(), tokenizer)
        if args.regex is not None:
            return sj.constraints.regex(args.regex, tokenizer)
    except ImportError:
        raise UsageError("--json-schema / --regex need outlines-core: pip install 'specjax[constraints]'") from None
    except (ValueError, OSError) as e:
        raise UsageError(f"{'--json-schema' if args.json_schema else '--regex'}: {e}") from None
    return None


def cmd_convert(args) -> None:
    import specjax as sj

    try:
        model = sj.load(args.src, dtype=args.dtype)
    except (ValueError, OSError) as e:
        raise UsageError(str(e)) from None
    try:
        sj.save(model, args.out, format=args.format, tokenizer=args.src, overwrite=args.force)
    except OSError as e:
        raise UsageError(str(e)) from None
    copied = (Path(args.out) / "tokenizer.json").is_file()
    print(f"wrote {args.format} checkpoint to {args.out} ({model.config.model_type}, "
          f"{model.config.num_params / 1e6:.2f}M parameters, "
          f"{'tokenizer copied' if copied else 'no tokenizer: the source has none'})")


def cmd_bench(args) -> None:
    import shlex

    from specjax.bench.harness import DEFAULT_METHODS, BenchConfig, run, skipped
    from specjax.bench.report import caveat, markdown, write

    cfg = BenchConfig(model=args.model, draft=args.draft, methods=tuple(args.methods or DEFAULT_METHODS),
                      batches=tuple(args.batch), num_prompts=args.num_prompts,
                      max_new_tokens=args.max_new_tokens, repeats=args.repeats, prompts=args.prompts,
                      temperature=args.temperature)
    if args.quick:
        cfg = dataclasses.replace(cfg, num_prompts=2, max_new_tokens=16, repeats=1)
    try:
        rows = run(cfg)
    except (ValueError, OSError) as e:
        raise UsageError(str(e)) from None
    command = "python -m specjax " + shlex.join(args.argv)
    write(rows, cfg, Path(args.out), command, skipped(cfg))
    print(markdown(rows, skipped(cfg)))
    if caveat(cfg):
        print(f"\n{caveat(cfg)}")
    print(f"\nwrote {args.out}/results.json, results.md, chart.png")


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    args = _parser().parse_args(argv)
    args.argv = argv
    try:
        {"generate": cmd_generate, "convert": cmd_convert, "bench": cmd_bench}[args.command](args)
    except UsageError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
