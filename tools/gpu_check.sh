#!/usr/bin/env bash
# One call on the GPU machine: build, CUDA tests, compute-sanitizer, benchmarks. Logs go to $OUT.
# Usage: bash tools/gpu_check.sh "<pytest -k expression for the sanitizer run>" <benchmark commands...>
# Builds in place (python setup.py build_ext --inplace, TORCH_CUDA_ARCH_LIST=9.0, MAX_JOBS default 16),
# runs the whole test suite (PYTEST_N=8: with pytest-xdist), then the sanitizer on the -k selection
# (SANITIZER_TIMEOUT s, default 400; "" skips it), then each further argument as a shell command.
set -uo pipefail
case "${1:-}" in -h|--help) sed -n '2,6p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;; esac
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee "$OUT/gpu.txt"
start=$(date +%s)
TORCH_CUDA_ARCH_LIST=9.0 FORCE_CUDA=1 MAX_JOBS=${MAX_JOBS:-16} python setup.py build_ext --inplace > "$OUT/build.log" 2>&1 \
  || { tail -40 "$OUT/build.log"; exit 1; }
echo "build: $(( $(date +%s) - start )) s"
python -c "import orbbec; print('orbbec', orbbec.with_cuda(), orbbec.get_compiling_cuda_version(), orbbec.get_compiler_version())"
# PYTEST_N=8 spreads the full suite over worker processes (pytest-xdist); the sanitizer run stays single.
python -m pytest -q -p no:cacheprovider ${PYTEST_N:+-n $PYTEST_N} -rs tests 2>&1 | tee "$OUT/pytest.log" | grep -v "^SKIPPED" | tail -40
if [ -n "${1:-}" ]; then
  timeout ${SANITIZER_TIMEOUT:-400} compute-sanitizer --tool memcheck --error-exitcode 9 python -m pytest -q -p no:cacheprovider tests -k "$1" \
    > "$OUT/sanitizer.log" 2>&1; echo "compute-sanitizer exit code: $?" | tee -a "$OUT/sanitizer.log"
  grep -E "ERROR SUMMARY|passed|failed" "$OUT/sanitizer.log" | tail -3
fi
shift || true
for cmd in "$@"; do echo "== $cmd"; eval "$cmd"; done
