#!/usr/bin/env bash
# On a GPU machine, from anywhere: run the kernel tests on the real backend (GPU cases compiled,
# interpret-only cases skipped), the kernel benchmarks, the verify-step cost on 1B- and 8B-shaped
# models in bf16 and int4 (step_cost.py), and the bench table with the batch sweep on the shipped
# models (specjax rows; the transformers peers need torch). Logs, JUnit XML and the benchmark
# JSON / Markdown go to $OUT (default benchmarks/gpu/results). Exits non-zero if a test failed.
# STEPS="tests kernels step_cost bench" (the default) picks what runs, e.g. to split the work
# over calls with a time limit.
#   PYTHON=/path/to/python OUT=/tmp/out benchmarks/gpu/run_all.sh
set -euo pipefail
cd "$(dirname "$0")/../.."
PYTHON="${PYTHON:-python}"
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
export OUT="${OUT:-benchmarks/gpu/results}"
mkdir -p "$OUT"

"$PYTHON" -c "import jax; print('jax', jax.__version__, jax.devices())" | tee "$OUT/devices.txt"
if [ "$("$PYTHON" -c 'import jax; print(jax.default_backend())')" != "gpu" ]; then
  echo "no GPU backend: for a CPU check run $PYTHON benchmarks/gpu/bench_kernels.py --cpu-smoke" >&2
  exit 2
fi

STEPS="${STEPS:-tests kernels step_cost bench}"
runs() { [[ " $STEPS " == *" $1 "* ]]; }

# --noconftest: the kernel tests need none of tests/conftest.py (torch / transformers fixtures).
tests=0
if runs tests; then
  "$PYTHON" -m pytest tests/kernels -q -rs --noconftest -p no:cacheprovider \
    --junitxml="$OUT/kernel_tests.xml" 2>&1 | tee "$OUT/kernel_tests.log" || tests=$?
fi
if runs kernels; then
  "$PYTHON" benchmarks/gpu/bench_kernels.py --out "$OUT" 2>&1 | tee "$OUT/bench_kernels.log"
fi
if runs step_cost; then
  "$PYTHON" benchmarks/gpu/step_cost.py --out "$OUT" 2>&1 | tee "$OUT/step_cost.log"
fi
if runs bench; then
  "$PYTHON" -m specjax bench --batch 1 4 16 64 --repeats 5 --out "$OUT/bench" --methods ar draft-chain \
    prompt-lookup recycling medusa eagle adaptive-draft-chain adaptive-prompt-lookup 2>&1 | tee "$OUT/bench.log"
fi
exit "$tests"
