"""`python -m specjax COMMAND`:

  generate  generate text from a prompt, printing it as it comes
  convert   convert a model (HF folder, specjax checkpoint, GGUF file or name) to a specjax
            checkpoint or an HF folder
  bench     tau, tokens/s and speedup of every decoding method on a prompt set (--dllm: a
            masked-diffusion LM's samplers on ParallelBench-style tasks)

Training is `python -m specjax.train`. Bad input is one line on stderr and exit status 2;
Ctrl-C is one line and exit status 130.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
from pathlib import Path

from specjax import cli
from specjax.cli import UsageError

# Weights past any CPU cache: a batch-1 step reads them all from memory, the regime where a step
# over a few tokens costs little more than over one.
MEMORY_BOUND_BYTES = 256 << 20
DEFAULT_DRAFT = "tiny-draft"


def default_drafter(target, temperature: float, constrained: bool = False) -> str:
    """The method `generate` uses without --drafter, the fastest measured for this kind of target
    and temperature (benchmarks/README.md), never one measured slower than AR: on the CPU, for a
    target whose float weights are memory-bound (MEMORY_BOUND_BYTES or more), its own int8 copy
    (`quantized-self`) at any temperature, unless a constraint is given (measured on the CPU
    only); otherwise prompt lookup at temperature 0 and, when sampling, prompt lookup for a
    memory-bound target and AR for one that fits in cache."""
    import jax

    from specjax.quantize import is_quantized

    memory_bound = sum(leaf.nbytes for leaf in jax.tree.leaves(target.params)) >= MEMORY_BOUND_BYTES
    on_cpu = jax.default_backend() == "cpu"
    if on_cpu and memory_bound and not is_quantized(target) and not constrained:
        return "quantized-self"
    if temperature == 0:
        return "prompt-lookup"
    return "prompt-lookup" if memory_bound else "ar"


def _generate_methods() -> dict:
    """The methods `generate --drafter` takes (a plain name, no constraint needed), by name."""
    from specjax.methods import METHODS

    return {m.name: m for m in METHODS.values()
            if m.runner == "drafter" and not m.argument and "constraint" not in m.needs}


def _bench_methods() -> dict:
    """The methods `bench --methods` takes (all but those that need a constraint), by usage."""
    from specjax.methods import METHODS

    return {u: m for u, m in METHODS.items() if "constraint" not in m.needs}


def _needs(m) -> str:
    return f" (needs: {', '.join(m.needs)})" if m.needs else ""


def _listing(methods: dict) -> str:
    """'name (needs ...): description; ...' for a --help text (argparse %-formats help strings)."""
    return "; ".join(f"{name}{_needs(m)}: {m.description}" for name, m in methods.items()).replace("%", "%%")


def _sampler_listing() -> str:
    from specjax.diffusion.named import SAMPLERS
    return "; ".join(f"{n}: {s.description}" for n, s in SAMPLERS.items()).replace("%", "%%")


def _parser() -> argparse.ArgumentParser:
    ap = cli.ArgumentParser(prog="python -m specjax", description=__doc__,
                            formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="command", required=True, metavar="COMMAND")
    count, temperature = cli.integer(1), cli.number(0)

    g = sub.add_parser("generate", help="generate text from a prompt, printing it as it comes",
                       description="Generate text from a prompt, printing it as it comes, then a status "
                                   "line on stderr.")
    g.add_argument("--prompt", required=True, type=cli.text(), help="the prompt text (not empty)")
    g.add_argument("--model", default="tiny",
                   help="model name (tiny, smollm2), HF folder with a tokenizer, or .gguf file")
    g.add_argument("--drafter", default=None, choices=_generate_methods(), metavar="NAME",
                   help=f"the decoding method (default: the fastest measured for the model and temperature): "
                        f"{_listing(_generate_methods())}")
    g.add_argument("--draft", default=None, metavar="PATH",
                   help=f"the draft model of the drafters that need one, with the target's vocabulary "
                        f"(default: {DEFAULT_DRAFT}, for --model tiny)")
    g.add_argument("--int8-activations", action="store_true",
                   help="round the inputs of a quantized model's matmuls to int8 (W8A8 / W4A8, as llama.cpp "
                        "runs Q8_0 / Q4_0; faster on CPUs with AVX-512 VNNI): see docs/guide/quantization.md")
    g.add_argument("--max-new-tokens", type=count, default=128, help="new tokens at most (>= 1)")
    g.add_argument("--temperature", type=temperature, default=0.0, help="0: greedy; > 0: sample")
    g.add_argument("--top-k", type=count, default=None, help="sample from the k likeliest tokens only")
    g.add_argument("--top-p", type=cli.number(0, 1, low_open=True), default=None,
                   help="sample from the smallest set of tokens holding this probability, in (0, 1]")
    g.add_argument("--seed", type=cli.integer(*cli.SEED_RANGE), default=0,
                   help=f"the sampling seed, in [0, {cli.SEED_RANGE[1]}]")
    g.add_argument("--chat", action=argparse.BooleanOptionalAction, default=None,
                   help="render the prompt as a user message with the model's chat template "
                        "(default: when the model has one) and print only the answer")
    g.add_argument("--system", default=None, type=cli.text(), help="a system message (with --chat)")
    shape = g.add_mutually_exclusive_group()
    shape.add_argument("--json-schema", type=Path, default=None, metavar="FILE",
                       help="constrain the output to JSON valid under the schema in FILE, written in "
                            "json.dumps spacing (needs specjax[constraints])")
    shape.add_argument("--regex", default=None, type=cli.text(), metavar="PATTERN",
                       help="constrain the output to this regular expression (no backreferences or "
                            "lookarounds; needs specjax[constraints])")
    shape.add_argument("--grammar", type=Path, default=None, metavar="FILE.lark",
                       help="constrain the output to the Lark grammar in FILE (llguidance's dialect: "
                            "`start: ...`, /regex/ terminals, %%json {schema}; needs specjax[constraints])")
    dllm = g.add_argument_group("masked-diffusion models (LLaDA, Dream, tiny-dllm-*): --max-new-tokens is "
                                "the number of slots filled")
    dllm.add_argument("--sampler", default=None, metavar="NAME",
                      help="how many slots a forward commits (default threshold-0.9): " + _sampler_listing())
    dllm.add_argument("--block", type=count, default=None, help="block length in slots (default 32)")

    c = sub.add_parser("convert", help="convert a model to a specjax checkpoint or an HF folder",
                       description="Convert an HF folder, a specjax checkpoint, a .gguf file or a named model "
                                   "to a specjax checkpoint (or an HF folder), copying its tokenizer.")
    c.add_argument("src", help="HF folder, specjax checkpoint, .gguf file or model name")
    c.add_argument("out", help="the folder to write")
    c.add_argument("--format", choices=("specjax", "hf"), default="specjax", help="what to write")
    c.add_argument("--dtype", choices=("float32", "bfloat16", "float16"), default=None,
                   help="cast the weights (default: the source's; float32 for a GGUF). On a CPU a "
                        "bfloat16 model decodes several times slower than float32")
    c.add_argument("--force", action="store_true", help="replace OUT if it holds a model already")

    bn = sub.add_parser("bench", help="tau, tokens/s and speedup of every method on a prompt set",
                        description="Measure tau, tokens/s and speedup over AR of each method on a prompt "
                                    "set; write results.json, results.md and chart.png to --out. With --dllm "
                                    "MODEL: accuracy vs tokens per forward of a masked-diffusion LM's samplers "
                                    "on ParallelBench-style tasks instead.")
    bn.add_argument("--model", default="tiny", help="model name (tiny, smollm2), HF folder or .gguf file")
    bn.add_argument("--draft", default=DEFAULT_DRAFT, help="draft model for the methods that need one: "
                    + ", ".join(u for u, m in _bench_methods().items() if "draft model" in m.needs))
    bn.add_argument("--methods", nargs="*", default=None, metavar="NAME",
                    help=f"methods to run (default: all with a plain name; --methods alone lists them): "
                         f"{_listing(_bench_methods())}")
    bn.add_argument("--prompts", default="stdlib",
                    help="stdlib (held-out code, for the tiny model), humaneval, chat (the "
                         "Spec-Bench-style set), or a JSONL file of rows with a 'prompt' or Spec-Bench 'turns'")
    bn.add_argument("--batch", type=count, nargs="+", default=None, metavar="B",
                    help="batch sizes (>= 1; default 1); with --dllm one size, the examples per canvas (default 16)")
    bn.add_argument("--int8-activations", action="store_true",
                    help="round the inputs of a quantized model's matmuls to int8 (as generate's flag)")
    bn.add_argument("--max-new-tokens", type=count, default=128, help="new tokens per prompt (>= 1)")
    bn.add_argument("--temperature", type=temperature, default=0.0,
                    help="sample with each method's exact rule (transformers rows are greedy only)")
    bn.add_argument("--repeats", type=count, default=3, help="timed runs per method (>= 1); the best counts")
    bn.add_argument("--num-prompts", type=_all_or(count), default=8, metavar="N",
                    help="how many prompts (>= 1), taken in turn from each category, or 'all'")
    bn.add_argument("--out", default=None, help="folder for results.json, results.md, chart.png "
                    "(default: runs/bench; runs/bench-dllm with --dllm)")
    bn.add_argument("--quick", action="store_true", help="2 prompts, 16 new tokens, 1 repeat")
    bn.add_argument("--dllm", default=None, metavar="MODEL",
                    help="instead: the ParallelBench-style evaluation of a masked-diffusion LM on "
                         "specjax.data.parallel_bench's vocabulary (e.g. tiny-dllm-tasks): accuracy vs tokens "
                         "per forward of each sampler (specjax.bench.dllm)")
    bn.add_argument("--tasks", nargs="+", default=None, metavar="TASK",
                    help="with --dllm: the tasks (default: all of specjax.data.parallel_bench.TASKS)")
    bn.add_argument("--samplers", nargs="*", default=None, metavar="NAME",
                    help="with --dllm: the samplers (default: all; --samplers alone lists them)")
    bn.add_argument("--num-examples", type=count, default=None, metavar="N",
                    help="with --dllm: seeded examples per task (default 64)")
    bn.add_argument("--block", type=count, default=None, help="with --dllm: block length (default 8)")
    return ap


def _all_or(parse):
    """An option type: 'all' (None) or what `parse` takes."""
    def all_or(text: str):
        return None if text == "all" else parse(text)
    all_or.__name__, all_or.bounds = parse.__name__, parse.bounds
    return all_or


def _resolve(name: str, flag: str) -> Path:
    from specjax.convert import resolve

    try:
        return resolve(name)
    except (ValueError, OSError) as e:
        raise UsageError(f"{flag}: {e}") from None


def _load(folder: Path, flag: str, dtype: str | None = None):
    import specjax as sj

    try:
        return sj.load(folder, dtype=dtype)
    except (ValueError, OSError, KeyError) as e:
        raise UsageError(f"cannot load {flag} {folder}: {e}") from None


def _load_tokenizer(path: Path):
    from specjax.tokenizer import load_tokenizer

    if path.suffix != ".gguf" and not (path / "tokenizer.json").exists():
        raise UsageError(f"{path} has no tokenizer.json; --model needs a folder with a tokenizer")
    try:
        return load_tokenizer(path)
    except Exception as e:  # a malformed tokenizer file
        raise UsageError(f"{path}: cannot read the tokenizer ({e})") from None


def cmd_generate(args) -> int:
    """Print the answer as it comes; on Ctrl-C, what came so far and 'interrupted after N tokens'."""
    new = []  # the tokens printed so far
    try:
        _generate(args, new)
    except KeyboardInterrupt:
        print(flush=True)
        print(f"interrupted after {len(new)} tokens", file=sys.stderr)
        return cli.INTERRUPTED_STATUS
    return 0


def _keep_compiled_programs() -> None:
    """Keep the XLA programs `generate` compiles between runs, in the specjax cache under `xla/`,
    one folder per jaxlib version and host CPU: the next run of the same command skips its
    compile (docs/guide/cli.md). A cache folder the user chose (JAX_COMPILATION_CACHE_DIR) is
    kept; JAX_ENABLE_COMPILATION_CACHE=false turns it off."""
    import hashlib

    import jax
    import jaxlib

    from pallas_kernels.ffi import cpu_flags
    from specjax.convert.gguf_cache import cache_root

    if jax.config.jax_compilation_cache_dir or not jax.config.jax_enable_compilation_cache:
        return
    key = hashlib.sha256(f"{jaxlib.__version__} {cpu_flags()}".encode()).hexdigest()[:16]
    jax.config.update("jax_compilation_cache_dir", str(cache_root() / "xla" / key))
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0)  # most of its programs compile in < 1 s


def _generate(args, new: list[int]) -> None:
    import jax

    import specjax as sj
    from specjax import methods
    from specjax.decoding import check_positions

    _keep_compiled_programs()
    folder = _resolve(args.model, "--model")
    tokenizer = _load_tokenizer(folder)
    constraint = _constraint(args, tokenizer)
    chat = tokenizer.chat_template is not None if args.chat is None else args.chat
    if chat and tokenizer.chat_template is None:
        raise UsageError(f"--chat: the model {args.model} has no chat template")
    if args.system is not None and not chat:
        raise UsageError("--system needs --chat (a model with a chat template)")
    model = _load(folder, "--model")
    if args.int8_activations:
        model = cli.int8_activations(model, args.model)
    if model.config.bidirectional:
        return _generate_diffusion(args, folder, model, tokenizer, chat)
    if args.sampler is not None or args.block is not None:
        raise UsageError(f"--sampler and --block are for masked-diffusion models; {args.model} decodes left "
                         f"to right (choose its method with --drafter)")
    name = args.drafter or default_drafter(model, args.temperature, constrained=constraint is not None)
    draft = None
    if "draft model" in methods.METHODS[name].needs:
        draft = _load(_resolve(args.draft or DEFAULT_DRAFT, "--draft"), "--draft")
    elif args.draft is not None:
        raise UsageError(f"--draft is for the drafters that need a draft model "
                         f"({', '.join(n for n, m in _generate_methods().items() if 'draft model' in m.needs)}), "
                         f"not {name}")
    ids = _prompt_ids(args, tokenizer, chat)
    eos = sorted({*tokenizer.eos_token_ids, *([model.config.eos_token_id] if model.config.eos_token_id is not None else [])})
    try:
        check_positions(model.config, len(ids), args.max_new_tokens)  # before the echo
        drafter = methods.make(name, model, draft)  # None: plain AR, which a constraint leaves as it is
        if constraint is not None and drafter is not None and drafter.supports_forced:
            drafter = sj.drafters.Forced(drafter)
        steps = sj.stream(model, ids, max_new_tokens=args.max_new_tokens, drafter=drafter,
                          temperature=args.temperature, top_k=args.top_k, top_p=args.top_p,
                          key=jax.random.key(args.seed), eos_token_id=eos or None, constraint=constraint)
    except (ValueError, OSError) as e:  # sj.stream checks its inputs when called, before the first token
        raise UsageError(str(e)) from None
    shown = [] if chat else ids  # a chat prints the answer alone; plain text continues the prompt
    print("" if chat else args.prompt, end="", flush=True)
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


def _prompt_ids(args, tokenizer, chat: bool) -> list[int]:
    messages = [{"role": "system", "content": args.system}] if args.system is not None else []
    try:
        ids = (tokenizer.chat(messages + [{"role": "user", "content": args.prompt}]) if chat
               else tokenizer.encode(args.prompt))
    except Exception as e:  # the template (e.g. a role it does not accept) or the tokenizer raised
        hint = " (a word outside the model's vocabulary, which has no unknown token)" if "[UNK]" in str(e) else ""
        raise UsageError(f"cannot tokenize the prompt{' with the chat template' if chat else ''}: {e}{hint}") from None
    if not ids:
        raise UsageError("--prompt is empty after tokenization")
    return ids


def _generate_diffusion(args, folder, model, tokenizer, chat: bool) -> None:
    """A masked-diffusion model fills --max-new-tokens slots with a named sampler, then prints
    them (up to the first EOS) and a status line."""
    import time

    import jax

    from specjax import diffusion
    from specjax.diffusion.named import filter_of, find

    ar_only = [flag for flag, value in (("--drafter", args.drafter), ("--draft", args.draft),
                                        ("--top-k", args.top_k), ("--top-p", args.top_p),
                                        ("--json-schema", args.json_schema), ("--regex", args.regex),
                                        ("--grammar", args.grammar)) if value is not None]
    if ar_only:
        raise UsageError(f"{ar_only[0]} is for left-to-right models; {args.model} is a masked-diffusion model "
                         f"(choose how it decodes with --sampler)")
    ids = _prompt_ids(args, tokenizer, chat)
    name = args.sampler or "threshold-0.9"
    c = model.config
    eos = [*tokenizer.eos_token_ids, *([c.eos_token_id] if c.eos_token_id is not None else [])]
    try:
        sampler = find(name)
        if len(ids) + args.max_new_tokens > c.max_position_embeddings:
            raise ValueError(f"the prompt ({len(ids)} tokens) and --max-new-tokens {args.max_new_tokens} exceed "
                             f"the model's {c.max_position_embeddings} positions: pass --max-new-tokens "
                             f"{c.max_position_embeddings - len(ids)} or less")
        canvas = diffusion.make_canvas([ids], args.max_new_tokens, c.mask_token_id)
        block = min(args.block or 32, args.max_new_tokens)
        start = time.perf_counter()
        out = sampler.run(model, canvas, gen_length=args.max_new_tokens, block=block,
                          eos_id=eos[0] if eos else None, filter_params=filter_of(folder),
                          delimiters=tuple(tokenizer.encode("\n")[-1:]), temperature=args.temperature,
                          key=jax.random.key(args.seed))
        tokens = [int(t) for t in out.tokens[0]]
    except (ValueError, OSError) as e:  # checked before anything is printed
        raise UsageError(str(e)) from None
    seconds = time.perf_counter() - start
    end = next((i for i, t in enumerate(tokens) if t in eos), len(tokens))
    text = tokenizer.decode(tokens[:end], skip_special_tokens=True)
    joined = text if chat or not text or text[:1].isspace() else f" {text}"  # a word-level tokenizer drops spaces
    print(("" if chat else args.prompt) + joined, end="", flush=True)
    nfe = int(out.nfe[0])
    print(f"\n[{end} new tokens in {len(tokens)} slots, {nfe} forwards ({len(tokens) / nfe:.2f} slots a forward), "
          f"sampler {name}, {seconds:.1f} s with compile]", file=sys.stderr)


def _constraint(args, tokenizer):
    """The --json-schema / --regex / --grammar constraint (None without one)."""
    import specjax as sj

    given = [(flag, value) for flag, value in (("--json-schema", args.json_schema), ("--regex", args.regex),
                                               ("--grammar", args.grammar)) if value is not None]
    if not given:
        return None
    flag, value = given[0]
    try:
        if flag == "--regex":
            return sj.constraints.regex(value, tokenizer)
        build = sj.constraints.json_schema if flag == "--json-schema" else sj.constraints.grammar
        return build(value.read_text(), tokenizer)
    except ImportError:
        raise UsageError(f"{flag} needs llguidance and outlines-core: pip install 'specjax[constraints]'") from None
    except (ValueError, OSError) as e:  # unreadable, not UTF-8, not JSON, not compilable
        regular = " (a regular expression: no backreferences or lookarounds)" if flag == "--regex" else ""
        raise UsageError(f"{flag}: {e}{regular}") from None


def cmd_convert(args) -> None:
    import specjax as sj

    model = _load(_resolve(args.src, "SRC"), "SRC", args.dtype)
    try:
        sj.save(model, args.out, format=args.format, tokenizer=args.src, overwrite=args.force)
    except FileExistsError:
        raise UsageError(f"{args.out} exists; pass --force to replace the model there") from None
    except OSError as e:
        raise UsageError(str(e)) from None
    copied = (Path(args.out) / "tokenizer.json").is_file()
    print(f"wrote {args.format} checkpoint to {args.out} ({model.config.model_type}, "
          f"{model.config.num_params / 1e6:.2f}M parameters, "
          f"{'tokenizer copied' if copied else 'no tokenizer: the source has none'})")


def cmd_bench(args) -> int | None:
    import shlex

    from specjax.bench.harness import DEFAULT_METHODS, BenchConfig, measure, prepare, skipped
    from specjax.bench.report import caveat, markdown, write

    if args.methods == []:  # `--methods` alone: the list
        print("\n".join(f"{u}{_needs(m)}: {m.description}" for u, m in _bench_methods().items()))
        return
    if args.dllm is not None or args.samplers == []:
        return _bench_dllm(args)
    given = [f for f, v in (("--tasks", args.tasks), ("--samplers", args.samplers),
                            ("--num-examples", args.num_examples), ("--block", args.block)) if v is not None]
    if given:
        raise UsageError(f"{given[0]} is for --dllm MODEL")
    cfg = BenchConfig(model=args.model, draft=args.draft, methods=tuple(args.methods or DEFAULT_METHODS),
                      batches=tuple(args.batch or [1]), num_prompts=args.num_prompts,
                      max_new_tokens=args.max_new_tokens, repeats=args.repeats, prompts=args.prompts,
                      temperature=args.temperature, int8_activations=args.int8_activations)
    if args.quick:
        cfg = dataclasses.replace(cfg, num_prompts=2, max_new_tokens=16, repeats=1)
    try:
        prepared = prepare(cfg)
    except (ValueError, OSError) as e:
        raise UsageError(str(e)) from None
    rows = measure(prepared)
    command = "python -m specjax " + shlex.join(args.argv)
    out = args.out or "runs/bench"
    write(rows, cfg, Path(out), command, skipped(cfg))
    print(markdown(rows, skipped(cfg)))
    if caveat(cfg):
        print(f"\n{caveat(cfg)}")
    print(f"\nwrote {out}/results.json, results.md, chart.png")


def _bench_dllm(args) -> int:
    """`bench --dllm MODEL`: specjax.bench.dllm; exit status 1 when FreeDave's output differs
    from static decoding's."""
    import shlex

    from specjax.bench import dllm

    if args.samplers == []:  # `--samplers` alone: the list
        print(dllm.listing())
        return 0
    if args.batch is not None and len(args.batch) > 1:
        raise UsageError("--batch takes one size with --dllm")
    defaults = dllm.DllmConfig(model=args.dllm)
    cfg = dataclasses.replace(defaults, tasks=tuple(args.tasks or defaults.tasks),
                              samplers=tuple(args.samplers) if args.samplers else None,
                              num_examples=args.num_examples or defaults.num_examples,
                              batch=args.batch[0] if args.batch else defaults.batch, block=args.block or defaults.block)
    try:
        prepared = dllm.prepare(cfg)
    except (ValueError, OSError) as e:
        raise UsageError(str(e)) from None
    rows, closed = dllm.measure(prepared)
    out = Path(args.out or "runs/bench-dllm")
    dllm.write(prepared, rows, closed, out, "python -m specjax " + shlex.join(args.argv))
    print(dllm.markdown(rows, closed))
    print(f"wrote {out}/results.json, results.md, {dllm.PLOT}")
    if dllm.mismatches(rows):
        print(dllm.mismatches(rows), file=sys.stderr)
        return 1
    return 0


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)

    def command():
        args = _parser().parse_args(argv)
        args.argv = argv
        return {"generate": cmd_generate, "convert": cmd_convert, "bench": cmd_bench}[args.command](args)

    return cli.run(command)


if __name__ == "__main__":
    sys.exit(main())
