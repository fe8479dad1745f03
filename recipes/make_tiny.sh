#!/usr/bin/env bash
# Rebuild every shipped tiny-model file from nothing:
#   corpus (this interpreter's stdlib) -> tokenizer -> target -> draft -> export -> evaluate.
# Runs resume from their checkpoints in runs/, so re-running after a kill continues.
# Usage: recipes/make_tiny.sh   (PYTHON=/path/to/python to pick the interpreter)
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python}

$PY -m specjax.train tokenizer --out runs/tokenizer --vocab-size 4096
$PY -m specjax.train --config configs/tiny.toml
$PY -m specjax.train --config configs/tiny-draft.toml
$PY -m specjax.train export --config configs/tiny.toml specjax/assets/tiny
$PY -m specjax.train export --config configs/tiny-draft.toml specjax/assets/tiny-draft
cp runs/tiny/curve.png recipes/tiny_curve.png
cp runs/tiny-draft/curve.png recipes/tiny-draft_curve.png
$PY -m specjax.train evaluate --config configs/tiny.toml --config configs/tiny-draft.toml \
    > recipes/results.md
du -ch specjax/assets/tiny/* specjax/assets/tiny-draft/* | tail -1
