#!/usr/bin/env bash
# On a GPU machine, from anywhere: run the kernel tests on the real backend (GPU cases compiled,
# interpret-only cases skipped), then the kernel benchmarks. Logs, JUnit XML and the benchmark
# JSON / Markdown go to $OUT (default benchmarks/gpu/results). Exits non-zero if a test failed.
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

# --noconftest: the kernel tests need none of tests/conftest.py (torch / transformers fixtures).
tests=0
"$PYTHON" -m pytest tests/kernels -q -rs --noconftest -p no:cacheprovider \
  --junitxml="$OUT/kernel_tests.xml" 2>&1 | tee "$OUT/kernel_tests.log" || tests=$?
"$PYTHON" benchmarks/gpu/bench_kernels.py --out "$OUT" 2>&1 | tee "$OUT/bench_kernels.log"
exit "$tests"
