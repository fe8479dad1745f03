#!/usr/bin/env bash
# Rebuild the shipped Medusa-1 and Clover heads for SmolLM2-135M-Instruct
# (specjax/assets/smollm2-{medusa,clover}) on the same self-distilled data as the EAGLE-3 head
# (recipes/make_smollm2_eagle3.sh), on the CPU:
#   1. self-distillation data and its feature cache -> runs/smollm2-distill (shared with EAGLE-3;
#      done already when that script ran)
#   2. Medusa-1 (4 heads) and Clover-2 (2-layer block, 4 heads) train on the cache, both drafting
#      over the same 8192-token reduced vocabulary   -> runs/smollm2-{medusa,clover}
#   3. export, stored in bfloat16 (cast back to float32 on load), with the tree size chosen by
#      `benchmarks/head_tree_choice.py --kind medusa|clover` (the fastest against AR on prompts
#      outside both the training and the benchmark sets; edit the sizes after a rerun of it).
# Every stage resumes after a kill: rerun the script. 2-core CPU: ~70 min (step 1) + ~15 + ~20 min.
# Usage: recipes/make_smollm2_heads.sh   (PYTHON=/path/to/python to pick the interpreter)
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python}
MEDUSA_TREE=${MEDUSA_TREE:-4}  # nodes
CLOVER_TREE=${CLOVER_TREE:-4}

$PY -m specjax.train distill --model smollm2 --out runs/smollm2-distill --num-prompts 1500
for kind in medusa clover; do
  $PY -m specjax.train --config configs/smollm2-$kind.toml
  $PY -m specjax.train export --config configs/smollm2-$kind.toml specjax/assets/smollm2-$kind
  cp runs/smollm2-$kind/curve.png recipes/smollm2-${kind}_curve.png
done
$PY - "$MEDUSA_TREE" "$CLOVER_TREE" <<'PY'
import json, sys
from pathlib import Path
from specjax.convert.heads import cast_head
for kind, size in zip(("medusa", "clover"), map(int, sys.argv[1:])):
    out = Path(f"specjax/assets/smollm2-{kind}")
    meta = json.loads((out / "head.json").read_text())
    (out / "head.json").write_text(json.dumps({**meta, "tree_size": size}, indent=2) + "\n")
    cast_head(out, "bfloat16")
PY
du -h specjax/assets/smollm2-medusa/* specjax/assets/smollm2-clover/*
