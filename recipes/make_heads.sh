#!/usr/bin/env bash
# Rebuild the shipped draft heads for the shipped tiny target (run recipes/make_tiny.sh first: it
# leaves runs/tokenizer, runs/data and specjax/assets/tiny):
#   Medusa-1 heads -> specjax/assets/tiny-medusa, EAGLE-1 head -> specjax/assets/tiny-eagle,
#   Clover, PPD and Hidden Transfer -> specjax/assets/tiny-{clover,ppd,hidden-transfer},
# then greedy tau of each on held-out prompts -> recipes/heads_results.md.
# TARGET=/path/to/hf-folder picks another target folder (default: the shipped "tiny").
# Usage: recipes/make_heads.sh   (PYTHON=/path/to/python to pick the interpreter)
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python}
TARGET=${TARGET:-tiny}

$PY -m specjax.train --config configs/medusa.toml --set heads.target="$TARGET"
$PY -m specjax.train export --config configs/medusa.toml --set heads.target="$TARGET" specjax/assets/tiny-medusa
$PY -m specjax.train --config configs/eagle.toml --set heads.target="$TARGET"
$PY -m specjax.train export --config configs/eagle.toml --set heads.target="$TARGET" specjax/assets/tiny-eagle
$PY -m specjax.train --config configs/clover.toml --set heads.target="$TARGET"
$PY -m specjax.train export --config configs/clover.toml --set heads.target="$TARGET" specjax/assets/tiny-clover
for head in ppd hidden-transfer; do
  $PY -m specjax.train --config configs/$head.toml --set heads.target="$TARGET"
  $PY -m specjax.train export --config configs/$head.toml --set heads.target="$TARGET" specjax/assets/tiny-$head
done
# EAGLE-3 (3-layer fusion, training-time test) is trained the same way; not shipped:
#   $PY -m specjax.train --config configs/eagle3.toml
TARGET="$TARGET" $PY recipes/heads_tau.py > recipes/heads_results.md
du -ch specjax/assets/tiny-medusa/* specjax/assets/tiny-eagle/* specjax/assets/tiny-clover/* specjax/assets/tiny-ppd/* \
  specjax/assets/tiny-hidden-transfer/* | tail -1
