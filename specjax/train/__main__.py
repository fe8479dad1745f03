"""`python -m specjax.train --config FILE [--steps N] [--out DIR] [--resume] [--set k=v ...]
[--mesh D,M] [--distributed] [--export DIR]`: train (resuming from DIR's latest checkpoint),
or export it. On several hosts, run the same command with --distributed on every host.
`python -m specjax.train distill ...`: self-distillation data for draft heads (see
`specjax.train.selfdistill`)."""

from __future__ import annotations

import argparse
import sys

from specjax.train.config import load_config, parse_value


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv[:1] == ["distill"]:
        from specjax.train.selfdistill import main as distill

        return distill(argv[1:])
    p = argparse.ArgumentParser(prog="python -m specjax.train", description=__doc__)
    p.add_argument("--config", required=True, help="TOML config file")
    p.add_argument("--steps", type=int, help="override train.steps")
    p.add_argument("--out", help="override train.out (run folder: checkpoints, metrics)")
    p.add_argument("--resume", action="store_true",
                   help="require a checkpoint to resume from (resuming is automatic anyway)")
    p.add_argument("--set", action="append", default=[], metavar="SECTION.KEY=VALUE",
                   help="override any config key, e.g. --set optim.lr=1e-3 (repeatable)")
    p.add_argument("--export", metavar="DIR",
                   help="do not train: write the run's latest checkpoint to DIR as an HF folder")
    p.add_argument("--mesh", metavar="D,M",
                   help="override train.mesh: D-way data parallel (FSDP) x M-way tensor parallel; "
                        "D = -1 takes the remaining devices")
    p.add_argument("--distributed", action="store_true",
                   help="call jax.distributed.initialize() first (multi-host; see specjax.sharding)")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    args = p.parse_args(argv)
    if args.distributed:
        from specjax.sharding import initialize_distributed

        initialize_distributed()  # before JAX touches a device

    overrides = {}
    for item in args.set:
        key, eq, value = item.partition("=")
        if not eq:
            p.error(f"--set expects SECTION.KEY=VALUE, got {item!r}")
        overrides[key.strip()] = parse_value(value.strip())
    if args.steps is not None:
        overrides["train.steps"] = args.steps
    if args.out is not None:
        overrides["train.out"] = args.out
    if args.mesh is not None:
        try:
            overrides["train.mesh"] = [int(n) for n in args.mesh.split(",")]
        except ValueError:
            p.error(f"--mesh expects D,M (two integers), got {args.mesh!r}")
    try:
        config = load_config(args.config, overrides)
    except (ValueError, FileNotFoundError, TypeError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2

    if args.export:
        from specjax.train.export import export

        step = export(config, args.export)
        print(f"exported step {step} of {config.train.out} -> {args.export}")
        return 0
    from specjax.train.loop import train

    try:
        train(config, resume=args.resume, progress=not args.no_progress)
    except FileNotFoundError as e:  # a missing corpus, feature cache or token counts
        print(f"error: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
