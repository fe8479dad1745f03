#!/usr/bin/env bash
# On a GPU machine, from anywhere: the kernel benchmarks against the HBM bandwidth
# (bench_kernels.py), the kernel tests on the real backend (GPU cases compiled, interpret-only
# cases skipped), the verify-step cost of 1B- and 8B-shaped models in bf16 and int4
# (step_cost.py), a per-op profile of the 1B forward (profile_step.py), and the bench table of
# the shipped tiny models. Each step is cut off after its share of ~10 minutes in all (the rows
# printed so far stay in its log). Logs, JSON and Markdown go to $OUT (default
# benchmarks/gpu/results). Exits non-zero if a test failed.
#   PYTHON=/path/to/python OUT=/tmp/out benchmarks/gpu/run_all.sh
#   STEPS="kernels profile" benchmarks/gpu/run_all.sh     # some steps only
set -uo pipefail
cd "$(dirname "$0")/../.."
PYTHON="${PYTHON:-python}"
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
export OUT="${OUT:-benchmarks/gpu/results}"
mkdir -p "$OUT"

{ nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv 2>/dev/null
  "$PYTHON" -c "import jax; print('jax', jax.__version__, jax.devices())"; } | tee "$OUT/devices.txt"
if [ "$("$PYTHON" -c 'import jax; print(jax.default_backend())')" != "gpu" ]; then
  echo "no GPU backend: for a CPU check run $PYTHON benchmarks/gpu/bench_kernels.py --cpu-smoke" >&2
  exit 2
fi

STEPS="${STEPS:-kernels tests step_cost profile bench}"
runs() { [[ " $STEPS " == *" $1 "* ]]; }

# --noconftest: the kernel tests need none of tests/conftest.py (torch / transformers fixtures).
tests=0
if runs kernels; then
  timeout 210 "$PYTHON" benchmarks/gpu/bench_kernels.py --out "$OUT" 2>&1 | tee "$OUT/bench_kernels.log"
fi
if runs tests; then
  timeout 120 "$PYTHON" -m pytest tests/kernels -q -rs --noconftest -p no:cacheprovider \
    2>&1 | tee "$OUT/kernel_tests.log"
  tests=$?
fi
if runs step_cost; then
  timeout 150 "$PYTHON" benchmarks/gpu/step_cost.py --shapes 8b 1b --layouts loaded stacked --batch 1 16 --tokens 1 4 16 64 \
    --out "$OUT" 2>&1 | tee "$OUT/step_cost.log"
fi
if runs profile; then
  timeout 60 "$PYTHON" benchmarks/gpu/profile_step.py --shape 1b --tokens 1 4 --out "$OUT" \
    2>&1 | tee "$OUT/profile_step.log"
fi
if runs bench; then
  timeout 90 "$PYTHON" -m specjax bench --model tiny --batch 1 16 --repeats 3 --out "$OUT/bench" \
    --methods ar draft-chain prompt-lookup eagle 2>&1 | tee "$OUT/bench.log"
fi
exit "$tests"
