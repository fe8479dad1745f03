"""`python -m specjax.train COMMAND ...`, the training command line:

    run        train a config (the default: `python -m specjax.train --config F` runs it),
               resuming from the run folder's latest checkpoint; --distributed on every host
    export     write a run's latest checkpoint (an HF folder, or a head folder)
    distill    self-distillation data for draft heads: the target's answers, then their features
    features   the feature cache of a distill run's answers (distill computes it unless --no-features)
    evaluate   held-out loss and greedy samples of trained runs, as Markdown
    tokenizer  train the byte-level BPE tokenizer of the code corpus
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from specjax.train.run_config import load_config, parse_value

COMMANDS = ("run", "export", "distill", "features", "evaluate", "tokenizer")


class UsageError(Exception):
    """A bad config, setting or missing input: one line on stderr, exit status 2."""


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m specjax.train",
                                description="Train models and draft heads, and build their data. "
                                            "Without a COMMAND: run (`python -m specjax.train --config F`).")
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND")
    config = argparse.ArgumentParser(add_help=False)  # a run's config and overrides
    config.add_argument("--config", required=True, help="TOML config file")
    config.add_argument("--out", help="override train.out (run folder: checkpoints, metrics)")
    config.add_argument("--set", action="append", default=[], metavar="SECTION.KEY=VALUE",
                        help="override any config key, e.g. --set optim.lr=1e-3 (repeatable)")

    run = sub.add_parser("run", parents=[config], help="train (resuming from the run folder)")
    run.add_argument("--steps", type=int, help="override train.steps")
    run.add_argument("--resume", action="store_true",
                     help="require a checkpoint to resume from (resuming is automatic anyway)")
    run.add_argument("--mesh", metavar="D,M",
                     help="override train.mesh: D-way data parallel (FSDP) x M-way tensor parallel; "
                          "D = -1 takes the remaining devices")
    run.add_argument("--distributed", action="store_true",
                     help="call jax.distributed.initialize() first (multi-host; see specjax.sharding)")
    run.add_argument("--no-progress", action="store_true", help="no progress bar")

    export = sub.add_parser("export", parents=[config], help="write the run's latest checkpoint to DIR")
    export.add_argument("dir", metavar="DIR", help="an HF folder (lm) or a head folder (the head objectives)")

    distill = sub.add_parser("distill", help="self-distillation data (specjax.train.selfdistill)")
    _model_and_out(distill)
    distill.add_argument("--num-prompts", type=int, default=1500)
    distill.add_argument("--batch-size", type=int, default=32)
    distill.add_argument("--max-new-tokens", type=int, default=192)
    distill.add_argument("--temperatures", default="0,0.7,1.0", help="comma-separated, one per shard in turn")
    distill.add_argument("--seed", type=int, default=0)
    distill.add_argument("--max-prompt-tokens", type=int, default=768, help="longer prompts are left out")
    _feature_options(distill)
    distill.add_argument("--no-features", action="store_true", help="stop after the answers")

    features = sub.add_parser("features", help="the feature cache of a distill run (specjax.train.features)")
    _model_and_out(features)
    _feature_options(features)

    evaluate = sub.add_parser("evaluate", help="held-out loss and greedy samples of trained runs")
    evaluate.add_argument("--config", action="append", required=True, help="run config (repeatable)")
    evaluate.add_argument("--new-tokens", type=int, default=64)
    evaluate.add_argument("--windows", type=int, help="cap on held-out windows (default: all)")

    tokenizer = sub.add_parser("tokenizer", help="train the code corpus's BPE tokenizer (specjax.train.bpe)")
    tokenizer.add_argument("--out", required=True, help="folder to write tokenizer.json into")
    tokenizer.add_argument("--vocab-size", type=int, default=4096)
    tokenizer.add_argument("--corpus", default="stdlib", help='"stdlib" or a folder of .py files')
    return p


def _model_and_out(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", required=True, help="the target: a named model, an HF folder or a .gguf file")
    p.add_argument("--out", required=True, help="run folder (resumed when it exists)")
    p.add_argument("--no-progress", action="store_true")


def _feature_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--top-k", type=int, default=16, help="target next-token ids/probabilities kept per position")
    p.add_argument("--draft-vocab", type=int, default=16384, help="reduced draft vocabulary size")


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv[:1] not in ([c] for c in (*COMMANDS, "-h", "--help")):
        argv = ["run", *argv]  # `python -m specjax.train --config F` trains
    p = parser()
    args = p.parse_args(argv)
    try:
        return {"run": cmd_run, "export": cmd_export, "distill": cmd_distill, "features": cmd_features,
                "evaluate": cmd_evaluate, "tokenizer": cmd_tokenizer}[args.command](args, p)
    except UsageError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2


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
        try:
            overrides["train.mesh"] = [int(n) for n in args.mesh.split(",")]
        except ValueError:
            p.error(f"--mesh expects D,M (two integers), got {args.mesh!r}")
    try:
        return load_config(args.config, overrides)
    except (ValueError, FileNotFoundError, TypeError) as e:
        raise UsageError(e) from None


def cmd_run(args, p) -> int:
    if args.distributed:
        from specjax.sharding import initialize_distributed

        initialize_distributed()  # before JAX touches a device
    config = _config(args, p)
    from specjax.train.loop import train

    try:
        train(config, resume=args.resume, progress=not args.no_progress)
    except FileNotFoundError as e:  # a missing corpus, feature cache or token counts
        raise UsageError(e) from None
    return 0


def cmd_export(args, p) -> int:
    config = _config(args, p)
    from specjax.train.export import export

    step = export(config, args.dir)
    print(f"exported step {step} of {config.train.out} -> {args.dir}")
    return 0


def cmd_distill(args, p) -> int:
    import specjax as sj
    from specjax.train.selfdistill import DistillConfig, generate_answers

    try:
        temperatures = tuple(float(t) for t in args.temperatures.split(","))
        cfg = DistillConfig(args.model, args.out, args.num_prompts, args.batch_size, args.max_new_tokens,
                            temperatures, args.seed, args.max_prompt_tokens)
        _check_feature_options(args)
        model, tokenizer = sj.load(args.model), sj.load_tokenizer(args.model)
        generate_answers(model, tokenizer, cfg, progress=not args.no_progress)
    except (ValueError, FileNotFoundError) as e:
        raise UsageError(e) from None
    return 0 if args.no_features else cmd_features(args, p, model)


def cmd_features(args, p, model=None) -> int:
    import specjax as sj
    from specjax.train.features import cache_features

    answers = Path(args.out) / "answers"
    try:
        _check_feature_options(args)
        if not (answers / "meta.json").is_file():
            raise FileNotFoundError(f"{answers}: no answers to compute features of (run `distill` first)")
        cache_features(model or sj.load(args.model), answers, Path(args.out) / "features", top_k=args.top_k,
                       draft_vocab=args.draft_vocab, progress=not args.no_progress)
    except (ValueError, FileNotFoundError) as e:
        raise UsageError(e) from None
    return 0


def _check_feature_options(args) -> None:
    if args.top_k < 1 or args.draft_vocab < 1:
        raise ValueError("--top-k and --draft-vocab must be >= 1")


def cmd_evaluate(args, p) -> int:
    from specjax.train.evaluate import report

    report(args.config, args.new_tokens, args.windows)
    return 0


def cmd_tokenizer(args, p) -> int:
    from specjax.train.bpe import build_tokenizer

    tok = build_tokenizer(args.out, args.corpus, vocab_size=args.vocab_size)
    print(f"tokenizer: vocab {tok.get_vocab_size()} from the {args.corpus} corpus -> {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
