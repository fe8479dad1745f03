"""`python -m specjax.train COMMAND ...`, the training command line:

    run        train a config (the default: `python -m specjax.train --config F` runs it),
               resuming from the run folder's latest checkpoint; --distributed on every host
    export     write a run's latest checkpoint (an HF folder, or a head folder)
    distill    self-distillation data for draft heads: the target's answers, then their features
    features   the feature cache of a distill run's answers (distill computes it unless --no-features)
    evaluate   held-out loss and greedy samples of trained runs, as Markdown
    tokenizer  train the byte-level BPE tokenizer of the code corpus
    trajectories  a dLLM's own answers to fresh task prompts: the data `dparallel` distills
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from specjax import cli
from specjax.cli import UsageError
from specjax.train.bpe import SPECIAL_TOKENS
from specjax.train.run_config import load_config, parse_value


def parser() -> argparse.ArgumentParser:
    p = cli.ArgumentParser(prog="python -m specjax.train", description=__doc__,
                           formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND")
    count = cli.integer(1)
    config = cli.ArgumentParser(add_help=False)  # a run's config and overrides
    config.add_argument("--config", required=True, help="TOML config file")
    config.add_argument("--out", help="override train.out (run folder: checkpoints, metrics)")
    config.add_argument("--set", action="append", default=[], metavar="SECTION.KEY=VALUE",
                        help="override any config key, e.g. --set optim.lr=1e-3 (repeatable)")

    run = sub.add_parser("run", parents=[config], help="train (resuming from the run folder)")
    run.add_argument("--steps", type=count, help="override train.steps (>= 1)")
    run.add_argument("--resume", action="store_true",
                     help="require a checkpoint to resume from (resuming is automatic anyway)")
    run.add_argument("--mesh", metavar="D,M", type=_mesh,
                     help="override train.mesh: D-way data parallel (FSDP) x M-way tensor parallel; "
                          "D = -1 takes the remaining devices")
    run.add_argument("--distributed", action="store_true",
                     help="call jax.distributed.initialize() first (multi-host; see specjax.sharding)")
    run.add_argument("--no-progress", action="store_true", help="no progress bar")

    export = sub.add_parser("export", parents=[config], help="write the run's latest checkpoint to DIR")
    export.add_argument("dir", metavar="DIR", help="an HF folder (lm) or a head folder (the head objectives)")

    distill = sub.add_parser("distill", help="self-distillation data (specjax.train.selfdistill)")
    _model_and_out(distill)
    distill.add_argument("--num-prompts", type=count, default=1500, help="prompts to answer (>= 1)")
    distill.add_argument("--batch-size", type=count, default=32, help="prompts per generate call (>= 1)")
    distill.add_argument("--max-new-tokens", type=count, default=192, help="new tokens per answer at most (>= 1)")
    distill.add_argument("--temperatures", type=_temperatures, default="0,0.7,1.0",
                         help="comma-separated temperatures (>= 0), one per shard in turn")
    distill.add_argument("--seed", type=cli.integer(*cli.SEED_RANGE), default=0, help="the sampling seed")
    distill.add_argument("--max-prompt-tokens", type=count, default=768, help="longer prompts are left out")
    _feature_options(distill)
    distill.add_argument("--no-features", action="store_true", help="stop after the answers")

    features = sub.add_parser("features", help="the feature cache of a distill run (specjax.train.features)")
    _model_and_out(features)
    _feature_options(features)

    evaluate = sub.add_parser("evaluate", help="held-out loss and greedy samples of trained runs")
    evaluate.add_argument("--config", action="append", required=True, help="run config (repeatable)")
    evaluate.add_argument("--new-tokens", type=count, default=64, help="greedy new tokens per sample (>= 1)")
    evaluate.add_argument("--windows", type=count, help="cap on held-out windows (default: all)")

    tokenizer = sub.add_parser("tokenizer", help="train the code corpus's BPE tokenizer (specjax.train.bpe)")
    tokenizer.add_argument("--out", required=True, help="folder to write tokenizer.json into")
    least = 256 + len(SPECIAL_TOKENS)  # the bytes and the special tokens
    tokenizer.add_argument("--vocab-size", type=cli.integer(least), default=4096,
                           help=f"tokens in the vocabulary (>= {least}: the 256 bytes and the special tokens)")
    tokenizer.add_argument("--corpus", default="stdlib", help='"stdlib" or a folder of .py files')

    trajectories = sub.add_parser("trajectories", help="a dLLM's answers to task prompts, for dparallel")
    trajectories.add_argument("--model", required=True, help="the teacher: a dLLM folder or name")
    trajectories.add_argument("--out", required=True, help="the .npz to write ([data] corpus of a dparallel run)")
    trajectories.add_argument("--count", type=count, default=4096, help="prompts to answer (>= 1)")
    trajectories.add_argument("--tasks", nargs="+", default=(), metavar="TASK",
                              help="the tasks (default: all of specjax.data.parallel_bench.TASKS)")
    trajectories.add_argument("--seq-len", type=count, default=41,
                              help="canvas length: prompt + answer slots (the dparallel run's [data] seq_len)")
    trajectories.add_argument("--seed", type=cli.integer(*cli.SEED_RANGE), default=0, help="the prompts' seed")
    return p


def _model_and_out(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", required=True, help="the target: a named model, an HF folder or a .gguf file")
    p.add_argument("--out", required=True, help="run folder (resumed when it exists)")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")


def _feature_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--top-k", type=cli.integer(1), default=16,
                   help="target next-token ids/probabilities kept per position (>= 1)")
    p.add_argument("--draft-vocab", type=cli.integer(1), default=16384, help="reduced draft vocabulary size (>= 1)")


def _mesh(text: str) -> list[int]:
    """--mesh D,M: D >= 1 or -1 (the remaining devices), M >= 1."""
    try:
        d, m = (int(n) for n in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected D,M (two integers), got {text!r}") from None
    if not (d >= 1 or d == -1) or m < 1:
        raise argparse.ArgumentTypeError(f"D must be >= 1 or -1 and M >= 1, got {text!r}")
    return [d, m]


def _temperatures(text: str) -> tuple[float, ...]:
    return tuple(cli.number(0)(t) for t in text.split(","))


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv[:1] not in ([c] for c in ("-h", "--help")) and (not argv or argv[0].startswith("-")):
        argv = ["run", *argv]  # `python -m specjax.train --config F` trains

    def command():
        p = parser()
        args = p.parse_args(argv)
        return {"run": cmd_run, "export": cmd_export, "distill": cmd_distill, "features": cmd_features,
                "evaluate": cmd_evaluate, "tokenizer": cmd_tokenizer,
                "trajectories": cmd_trajectories}[args.command](args, p)

    return cli.run(command)


def _config(args, p: argparse.ArgumentParser):
    """The run's config with the command line's overrides."""
    overrides = {}
    for item in args.set:
        key, eq, value = item.partition("=")
        if not eq:
            p.error(f"--set expects SECTION.KEY=VALUE, got {item!r}")
        overrides[key.strip()] = parse_value(value.strip())
    if getattr(args, "steps", None) is not None:
        overrides["train.steps"] = args.steps
    if args.out is not None:
        overrides["train.out"] = args.out
    if getattr(args, "mesh", None) is not None:
        overrides["train.mesh"] = args.mesh
    return _read_config(args.config, overrides)


def _read_config(path: str, overrides: dict | None = None):
    try:
        return load_config(path, overrides)
    except (ValueError, OSError) as e:
        raise UsageError(e) from None


def cmd_run(args, p) -> int:
    """Train; a run stopped by Ctrl-C (or SIGTERM) is checkpointed and exits 128 + the signal."""
    if args.distributed:
        from specjax.sharding import initialize_distributed

        try:
            initialize_distributed()  # before JAX touches a device
        except ValueError as e:  # no cluster found
            raise UsageError(f"--distributed: {e} (see specjax.sharding.initialize_distributed)") from None
    config = _config(args, p)
    _check_mesh(config)
    from specjax.train.loop import train

    try:
        done = train(config, resume=args.resume, progress=not args.no_progress)
    except FileNotFoundError as e:  # a missing corpus, feature cache or token counts
        raise UsageError(e) from None
    return 0 if done["signal"] is None else 128 + done["signal"]


def _check_mesh(config) -> None:
    """[train] mesh against this host's devices and the batch, before anything is built."""
    tc = config.train
    if not tc.mesh:
        return
    from specjax import sharding

    try:
        mesh = sharding.make_mesh(tc.mesh)
    except ValueError as e:
        raise UsageError(f"train.mesh (--mesh): {e}") from None
    if tc.batch_size % mesh.shape[sharding.DATA]:
        raise UsageError(f"train.batch_size {tc.batch_size} does not split over the mesh's "
                         f"{mesh.shape[sharding.DATA]}-way 'data' axis (train.mesh, --mesh)")


def cmd_export(args, p) -> int:
    config = _config(args, p)
    from specjax.train.export import export

    try:
        step = export(config, args.dir)
    except FileNotFoundError as e:  # no checkpoint (not trained yet), or the target is missing
        raise UsageError(e) from None
    print(f"exported step {step} of {config.train.out} -> {args.dir}")
    return 0


def cmd_distill(args, p) -> int:
    from specjax.train.selfdistill import DistillConfig, generate_answers

    cfg = DistillConfig(args.model, args.out, args.num_prompts, args.batch_size, args.max_new_tokens,
                        args.temperatures, args.seed, args.max_prompt_tokens)
    model, tokenizer = _target(args)
    room = model.config.max_position_embeddings
    if args.max_prompt_tokens + args.max_new_tokens > room:
        raise UsageError(f"--max-prompt-tokens {args.max_prompt_tokens} + --max-new-tokens {args.max_new_tokens} "
                         f"exceeds the model's max_position_embeddings {room}")
    from specjax.memory import BatchTooLarge

    try:
        generate_answers(model, tokenizer, cfg, progress=not args.no_progress)
    except BatchTooLarge as e:  # refused before the first batch is allocated
        raise UsageError(f"--batch-size {args.batch_size}: {e}") from None
    return 0 if args.no_features else cmd_features(args, p, model)


def cmd_features(args, p, model=None) -> int:
    from specjax.train.features import cache_features

    answers = Path(args.out) / "answers"
    if not (answers / "meta.json").is_file():
        raise UsageError(f"{answers}: no answers to compute features of (run `distill` first)")
    model = model or _target(args)[0]
    if args.top_k > model.config.vocab_size:
        raise UsageError(f"--top-k {args.top_k} exceeds the target's vocabulary of {model.config.vocab_size}")
    cache_features(model, answers, Path(args.out) / "features", top_k=args.top_k,
                   draft_vocab=args.draft_vocab, progress=not args.no_progress)
    return 0


def _target(args):
    """The --model target and its tokenizer."""
    from specjax.convert import load
    from specjax.tokenizer import load_tokenizer

    try:
        return load(args.model), load_tokenizer(args.model)
    except (ValueError, OSError, KeyError) as e:
        raise UsageError(f"cannot load --model {args.model}: {e}") from None


PROMPT_ROOM = 32  # positions kept for `evaluate`'s prompts (a few tokens each)


def cmd_evaluate(args, p) -> int:
    from specjax.train.evaluate import report

    for path in args.config:  # each config read (and refused) before any run is evaluated
        room = _read_config(path).model.max_position_embeddings - PROMPT_ROOM
        if args.new_tokens > room:
            raise UsageError(f"--new-tokens {args.new_tokens} leaves no room for the prompts in {path}'s "
                             f"max_position_embeddings (at most {room})")
    try:
        report(args.config, args.new_tokens, args.windows)
    except FileNotFoundError as e:  # a run with no checkpoint, a missing tokenizer or corpus
        raise UsageError(e) from None
    return 0


def cmd_tokenizer(args, p) -> int:
    from specjax.train.bpe import build_tokenizer

    try:
        tok = build_tokenizer(args.out, args.corpus, vocab_size=args.vocab_size)
    except (ValueError, OSError) as e:  # a missing corpus folder, or one without the held-out files
        raise UsageError(e) from None
    print(f"tokenizer: vocab {tok.get_vocab_size()} from the {args.corpus} corpus -> {args.out}")
    return 0


def _dllm(name: str):
    from specjax.convert import load

    try:
        model = load(name)
    except (ValueError, OSError, KeyError) as e:
        raise UsageError(f"cannot load --model {name}: {e}") from None
    if not model.config.bidirectional:
        raise UsageError(f"--model {name} is not a masked-diffusion LM (its config has no mask_token_id)")
    return model


def cmd_trajectories(args, p) -> int:
    from specjax.train.task_decoding import write_trajectories

    try:
        write_trajectories(args.out, _dllm(args.model), args.tasks, args.count, args.seq_len, args.seed)
    except (ValueError, OSError) as e:  # an unknown task, a prompt longer than the canvas, an unwritable --out
        raise UsageError(e) from None
    print(f"{args.count} answers of {args.model} -> {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
