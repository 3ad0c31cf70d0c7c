#!/usr/bin/env bash
# Everything a fresh machine needs, then the demo or the tests:
#   bash scripts/setup.sh demo    build orbbec and run scripts/demo.py
#   bash scripts/setup.sh test    build orbbec and run the test suite (what CI runs)
set -euo pipefail
cd "$(dirname "$0")/.."
MODE=${1:-test}
PY=${PYTHON:-python3}

# OpenCV's C++ library for affine_opencv (optional: orbbec builds without it).
if ! pkg-config --exists opencv4 2>/dev/null; then
  if command -v apt-get >/dev/null 2>&1 && [ "$(id -u)" = 0 ]; then
    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq libopencv-dev pkg-config >/dev/null \
      || echo "setup: libopencv-dev not installed; affine_opencv will be unavailable"
  else
    echo "setup: no OpenCV C++ library and no root apt-get; affine_opencv will be unavailable"
  fi
fi

# torch first, pinned, so that pip never resolves an unpinned torch (gigabytes) for the other packages.
$PY -c "import torch" 2>/dev/null || $PY -m pip install -q "torch==2.13.0"
$PY -m pip install -q -r requirements/build.txt -r requirements/runtime.txt -r requirements/tests.txt
# nvJPEG for orbbec.io's GPU decoder, where there is a CUDA compiler: the toolkit's if it has it,
# else NVIDIA's wheel (headers and library, 4 MB).
if command -v nvcc >/dev/null 2>&1 || [ -x /usr/local/cuda/bin/nvcc ]; then
  CUDA_INC=$(dirname "$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)")/../include
  [ -f "$CUDA_INC/nvjpeg.h" ] || $PY -m pip install -q "nvidia-nvjpeg==13.0.4.44"
fi
$PY -m pip install -q --no-build-isolation --no-deps -e . 2>&1 | tail -3
$PY -c "import orbbec; print('orbbec built:', 'CUDA ' + orbbec.get_compiling_cuda_version() if orbbec.with_cuda() else 'CPU only', '|', orbbec.get_compiler_version())"

case "$MODE" in
  demo) $PY scripts/demo.py ;;
  test)
    # Compile the CUDA sources too where nvcc exists (CI has no GPU: this catches breakage early).
    if command -v nvcc >/dev/null 2>&1 || [ -x /usr/local/cuda/bin/nvcc ]; then
      PATH="$PATH:/usr/local/cuda/bin" bash tools/check_cuda_compile.sh
    fi
    $PY -m pytest -q -rs -p no:cacheprovider tests ;;
  *) echo "usage: bash scripts/setup.sh demo|test"; exit 2 ;;
esac
