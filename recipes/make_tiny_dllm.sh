#!/usr/bin/env bash
# Rebuild the shipped tiny masked-diffusion LMs (issue #36) from nothing:
#   code dLLM: the stdlib corpus with the tiny AR model's tokenizer (+ MASK = 4096), LLaDA's
#              pre-training loss -> specjax/assets/tiny-dllm-code
#   task dLLM: every ParallelBench-style task, LLaDA's SFT loss -> specjax/assets/tiny-dllm-tasks
#   dParallel: the task dLLM distilled on its own static greedy answers
#              -> specjax/assets/tiny-dllm-tasks-dparallel
# then the curves and the one-token-per-forward exact match (recipes/tiny_dllm_results.md).
# Runs resume from their checkpoints in runs/, so re-running after a kill continues; an export
# refuses to overwrite an existing asset folder (remove it first).
# Usage: recipes/make_tiny_dllm.sh   (PYTHON=/path/to/python to pick the interpreter)
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python}

$PY -m specjax.train --config configs/tiny-dllm-code.toml
$PY -m specjax.train export --config configs/tiny-dllm-code.toml specjax/assets/tiny-dllm-code
$PY -m specjax.train --config configs/tiny-dllm-tasks.toml
$PY -m specjax.train export --config configs/tiny-dllm-tasks.toml specjax/assets/tiny-dllm-tasks
$PY -m specjax.train trajectories --model specjax/assets/tiny-dllm-tasks \
    --out runs/tiny-dllm-tasks-trajectories.npz --count 4096 --seq-len 41 --seed 1
$PY -m specjax.train --config configs/tiny-dllm-tasks-dparallel.toml
$PY -m specjax.train export --config configs/tiny-dllm-tasks-dparallel.toml specjax/assets/tiny-dllm-tasks-dparallel
for run in tiny-dllm-code tiny-dllm-tasks tiny-dllm-tasks-dparallel; do
    cp runs/$run/curve.png recipes/${run//-/_}_curve.png
done
{
    echo "# Tiny dLLMs"
    echo
    echo "## Code dLLM (held-out loss: the mdm loss, an upper bound on the NLL)"
    echo
    $PY -m specjax.train evaluate --config configs/tiny-dllm-code.toml
    echo "## Task dLLMs, one token per forward"
    echo
    $PY -m specjax.train task-eval --model specjax/assets/tiny-dllm-tasks \
        --model specjax/assets/tiny-dllm-tasks-dparallel --count 256 --seq-len 41
} > recipes/tiny_dllm_results.md
du -ch specjax/assets/tiny-dllm-*/* | tail -1
