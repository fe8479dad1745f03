#!/usr/bin/env bash
# Rebuild every shipped tiny-model file from nothing:
#   corpus (this interpreter's stdlib) -> tokenizer -> target -> draft -> export -> evaluate.
# Runs resume from their checkpoints in runs/, so re-running after a kill continues.
# Usage: train/make_tiny.sh   (PYTHON=/path/to/python to pick the interpreter)
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python}

$PY -m specjax.train.tokenizer --out runs/tokenizer --vocab-size 4096
$PY -m specjax.train --config configs/tiny.toml
$PY -m specjax.train --config configs/tiny-draft.toml
$PY -m specjax.train --config configs/tiny.toml --export specjax/assets/tiny
$PY -m specjax.train --config configs/tiny-draft.toml --export specjax/assets/tiny-draft
cp runs/tiny/curve.png train/tiny_curve.png
cp runs/tiny-draft/curve.png train/tiny-draft_curve.png
$PY -m specjax.train.evaluate --config configs/tiny.toml --config configs/tiny-draft.toml \
    > train/results.md
du -ch specjax/assets/tiny/* specjax/assets/tiny-draft/* | tail -1
