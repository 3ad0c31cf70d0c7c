#!/usr/bin/env bash
# Compiles every CUDA source of orbbec for sm_90 without linking, to catch breakage on machines
# without a GPU (CI). Usage: bash tools/check_cuda_compile.sh [nvcc]
set -euo pipefail
cd "$(dirname "$0")/.."
NVCC=${1:-${NVCC:-nvcc}}
if ! command -v "$NVCC" >/dev/null 2>&1; then
  echo "check_cuda_compile: nvcc not found; skipped"; exit 0
fi
INCLUDES=$(python -c 'import sysconfig, torch.utils.cpp_extension as c; print(" ".join("-I" + p for p in c.include_paths() + [sysconfig.get_paths()["include"]]))')
ABI=$(python -c 'import torch; print(int(torch._C._GLIBCXX_USE_CXX11_ABI))')
# A CPU-only torch wheel ships the c10/cuda headers but not the header its CUDA build generates;
# supply it (it only says c10_cuda is a shared library) so the sources compile against either.
STUB=$(mktemp -d)
if ! python -c 'import torch.utils.cpp_extension as c, os, sys; sys.exit(0 if any(os.path.exists(os.path.join(p, "c10/cuda/impl/cuda_cmake_macros.h")) for p in c.include_paths()) else 1)'; then
  mkdir -p "$STUB/c10/cuda/impl"
  printf '#pragma once\n#define C10_CUDA_BUILD_SHARED_LIBS\n' > "$STUB/c10/cuda/impl/cuda_cmake_macros.h"
fi
INCLUDES="-I$STUB $INCLUDES"
# nvJPEG's header for orbbec.io's GPU decoder: the toolkit's, else the nvidia-nvjpeg wheel's.
NVJPEG_INC=$(python -c 'import glob, os, nvidia; p = [q for b in nvidia.__path__ for q in glob.glob(os.path.join(b, "*", "include", "nvjpeg.h"))]; print(os.path.dirname(p[0]) if p else "")' 2>/dev/null || true)
for d in /usr/local/cuda/include "${CUDA_HOME:-/nonexistent}/include"; do [ -z "$NVJPEG_INC" ] && [ -f "$d/nvjpeg.h" ] && NVJPEG_INC=$d; done
if [ -n "$NVJPEG_INC" ]; then INCLUDES="$INCLUDES -I$NVJPEG_INC -DWITH_NVJPEG"; else echo "check_cuda_compile: nvjpeg.h not found; the GPU decoder is not checked"; fi
status=0
# The .cu kernels, and the host-only CUDA sources (nvJPEG), which nvcc hands to the host compiler.
for f in ${CHECK_FILES:-$(find orbbec -name "*.cu" | sort) $(find orbbec -path "*/src/cuda/*.cpp" | sort)}; do
  if "$NVCC" -std=c++20 -O3 -arch=sm_90 --fmad=false ${NVCC_EXTRA:-} -DWITH_CUDA --expt-relaxed-constexpr -D_GLIBCXX_USE_CXX11_ABI=$ABI \
       -Xcompiler -fPIC -I orbbec $INCLUDES -c "$f" -o /tmp/orbbec_check_$$_$(basename $f).o; then
    echo "check_cuda_compile: OK   $f"
  else
    echo "check_cuda_compile: FAIL $f"; status=1
  fi
done
rm -rf /tmp/orbbec_check_$$_*.o "$STUB"
exit $status
