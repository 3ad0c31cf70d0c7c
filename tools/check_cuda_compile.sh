#!/usr/bin/env bash
# Compiles every CUDA source of orbbec for sm_90 without linking, to catch breakage on machines
# without a GPU (CI). Needs nvcc and torch's headers (a CPU-only torch will do); no GPU.
#   bash tools/check_cuda_compile.sh [nvcc]
# Environment: JOBS (files compiled at once, default the CPU count), PYTHON (default python3),
# CHECK_FILES (a subset), NVCC_EXTRA (more nvcc flags).
set -euo pipefail
case "${1:-}" in -h|--help) sed -n '2,6p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;; esac
cd "$(dirname "$0")/.."
NVCC=${1:-${NVCC:-nvcc}}
PY=${PYTHON:-python3}
if ! command -v "$NVCC" >/dev/null 2>&1; then
  echo "check_cuda_compile: nvcc not found; skipped"; exit 0
fi
INCLUDES=$("$PY" -c 'import sysconfig, torch.utils.cpp_extension as c; print(" ".join("-I" + p for p in c.include_paths() + [sysconfig.get_paths()["include"]]))')
ABI=$("$PY" -c 'import torch; print(int(torch._C._GLIBCXX_USE_CXX11_ABI))')
# A CPU-only torch wheel ships the c10/cuda headers but not the header its CUDA build generates;
# supply it (it only says c10_cuda is a shared library) so the sources compile against either.
STUB=$(mktemp -d); OBJ=$(mktemp -d)
trap 'rm -rf "$STUB" "$OBJ"' EXIT
if ! "$PY" -c 'import torch.utils.cpp_extension as c, os, sys; sys.exit(0 if any(os.path.exists(os.path.join(p, "c10/cuda/impl/cuda_cmake_macros.h")) for p in c.include_paths()) else 1)'; then
  mkdir -p "$STUB/c10/cuda/impl"
  printf '#pragma once\n#define C10_CUDA_BUILD_SHARED_LIBS\n' > "$STUB/c10/cuda/impl/cuda_cmake_macros.h"
fi
INCLUDES="-I$STUB $INCLUDES"
# nvJPEG's header for orbbec.io's GPU decoder: the toolkit's, else the nvidia-nvjpeg wheel's.
NVJPEG_INC=$("$PY" -c 'import glob, os, nvidia; p = [q for b in nvidia.__path__ for q in glob.glob(os.path.join(b, "*", "include", "nvjpeg.h"))]; print(os.path.dirname(p[0]) if p else "")' 2>/dev/null || true)
for d in /usr/local/cuda/include "${CUDA_HOME:-/nonexistent}/include"; do [ -z "$NVJPEG_INC" ] && [ -f "$d/nvjpeg.h" ] && NVJPEG_INC=$d; done
if [ -n "$NVJPEG_INC" ]; then INCLUDES="$INCLUDES -I$NVJPEG_INC -DWITH_NVJPEG"; else echo "check_cuda_compile: nvjpeg.h not found; the GPU decoder is not checked"; fi
export NVCC ABI INCLUDES OBJ NVCC_EXTRA="${NVCC_EXTRA:-}"
compile_one() {
  if "$NVCC" -std=c++20 -O3 -arch=sm_90 --fmad=false $NVCC_EXTRA -DWITH_CUDA --expt-relaxed-constexpr -D_GLIBCXX_USE_CXX11_ABI=$ABI \
       -Xcompiler -fPIC -I orbbec $INCLUDES -c "$1" -o "$OBJ/$(echo "$1" | tr / _).o" > "$OBJ/$(echo "$1" | tr / _).log" 2>&1; then
    echo "check_cuda_compile: OK   $1"
  else
    cat "$OBJ/$(echo "$1" | tr / _).log"; echo "check_cuda_compile: FAIL $1"; return 1
  fi
}
export -f compile_one
# The .cu kernels, and the host-only CUDA sources (nvJPEG), which nvcc hands to the host compiler;
# JOBS files at a time (each nvcc is one process), a failure's messages printed whole.
FILES=${CHECK_FILES:-$(find orbbec -name "*.cu" | sort) $(find orbbec -path "*/src/cuda/*.cpp" | sort)}
printf '%s\n' $FILES | xargs -P "${JOBS:-$(nproc)}" -I{} bash -c 'compile_one "$@"' _ {}
