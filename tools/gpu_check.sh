#!/usr/bin/env bash
# One call on the GPU machine: build, CUDA tests, compute-sanitizer, benchmarks. Logs go to $OUT.
# Usage: bash tools/gpu_check.sh "<pytest -k expression for the sanitizer run>" <benchmark commands...>
set -uo pipefail
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee "$OUT/gpu.txt"
TORCH_CUDA_ARCH_LIST=9.0 python -m pip install --no-build-isolation --no-deps -e . > "$OUT/build.log" 2>&1 \
  || { tail -40 "$OUT/build.log"; exit 1; }
python -c "import orbbec; print('orbbec', orbbec.with_cuda(), orbbec.get_compiling_cuda_version(), orbbec.get_compiler_version())"
python -m pytest -q -p no:cacheprovider tests 2>&1 | tee "$OUT/pytest.log" | tail -25
if [ -n "${1:-}" ]; then
  compute-sanitizer --tool memcheck --error-exitcode 9 python -m pytest -q -p no:cacheprovider tests -k "$1" \
    > "$OUT/sanitizer.log" 2>&1; echo "compute-sanitizer exit code: $?" | tee -a "$OUT/sanitizer.log"
  grep -E "ERROR SUMMARY|passed|failed" "$OUT/sanitizer.log" | tail -3
fi
shift || true
for cmd in "$@"; do echo "== $cmd"; eval "$cmd"; done
