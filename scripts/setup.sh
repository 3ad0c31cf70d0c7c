#!/usr/bin/env bash
# Everything a fresh machine needs, then the demo or the tests:
#   bash scripts/setup.sh demo    build orbbec and run scripts/demo.py
#   bash scripts/setup.sh test    build orbbec and run the test suite (what CI runs)
# PYTHON=/path/to/python picks the interpreter (default: python3 on PATH, e.g. an active venv);
# MAX_JOBS the compile jobs (default: the CPU count).
set -euo pipefail
usage() { echo "usage: bash scripts/setup.sh demo|test" >&2; exit 2; }
[ $# -eq 1 ] || usage
MODE=$1
case "$MODE" in demo|test) ;; *) usage ;; esac
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
export MAX_JOBS=${MAX_JOBS:-$(nproc)}
# What a machine without torch gets: a matching pair, so the tests can compare with torchvision.
TORCH_PIN="torch==2.14.1" TORCHVISION_PIN="torchvision==0.29.1"
step() { echo; echo "== setup: $*"; }
pip() { "$PY" -m pip "$@"; }

step "installing into $("$PY" -c 'import sys; print(sys.executable, "(Python", sys.version.split()[0] + ")")')"

# OpenCV's C++ library for affine_opencv (optional: orbbec builds without it).
if ! pkg-config --exists opencv4 2>/dev/null; then
  if command -v apt-get >/dev/null 2>&1 && [ "$(id -u)" = 0 ]; then
    step "apt-get install libopencv-dev (for affine_opencv)"
    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq libopencv-dev pkg-config >/dev/null \
      || echo "setup: libopencv-dev not installed; affine_opencv will be unavailable"
  else
    echo "setup: no OpenCV C++ library and no root apt-get; affine_opencv will be unavailable"
  fi
fi

# torch first, pinned, so that pip never resolves an unpinned torch (gigabytes) for the other packages.
if "$PY" -c "import torch" 2>/dev/null; then
  TORCH_VERSION=$("$PY" -c "import torch; print(torch.__version__)")
  step "torch $TORCH_VERSION is installed; building against it"
else
  PINS=("$TORCH_PIN"); [ "$MODE" = test ] && PINS+=("$TORCHVISION_PIN")
  step "no torch here: installing ${PINS[*]}"
  pip install "${PINS[@]}"
  TORCH_VERSION=$("$PY" -c "import torch; print(torch.__version__)")
fi
# Keep the installed torch whatever the other requirements say (-c: a constraint, not a request).
# The distribution's version, not torch.__version__: PyPI's wheel says 2.14.1, its torch 2.14.1+cu130.
TORCH_CONSTRAINT=$(mktemp); trap 'rm -f "$TORCH_CONSTRAINT"' EXIT
"$PY" -c "import importlib.metadata as m; print('torch==' + m.version('torch'))" > "$TORCH_CONSTRAINT"
step "build and test requirements"
pip install -c "$TORCH_CONSTRAINT" -r requirements/build.txt -r requirements/runtime.txt -r requirements/tests.txt

# torchvision for the tests' comparisons: the release made for this torch, if it loads with it.
if [ "$MODE" = test ] && ! "$PY" -c "import torchvision.ops" 2>/dev/null; then
  step "torchvision for torch $TORCH_VERSION (the tests compare with torchvision.ops)"
  if pip install -c "$TORCH_CONSTRAINT" torchvision && "$PY" -c "import torchvision.ops" 2>/dev/null; then :
  else
    echo "setup: no torchvision that loads with torch $TORCH_VERSION (PyPI's builds need PyPI's torch);" \
         "the torchvision comparisons will be skipped, with this reason, in the test report"
    pip uninstall -y -q torchvision 2>/dev/null || true
  fi
fi

# nvJPEG for orbbec.io's GPU decoder, where there is a CUDA compiler: the toolkit's if it has it,
# else NVIDIA's wheel (headers and library, 4 MB).
if command -v nvcc >/dev/null 2>&1 || [ -x /usr/local/cuda/bin/nvcc ]; then
  CUDA_INC=$(dirname "$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)")/../include
  if [ ! -f "$CUDA_INC/nvjpeg.h" ]; then step "nvidia-nvjpeg (the toolkit has no nvjpeg.h)"; pip install "nvidia-nvjpeg==13.0.4.44"; fi
fi

step "building orbbec with $MAX_JOBS compile jobs (pip install --no-build-isolation -e .; several minutes)"
# The compile steps ([n/N]) are shown; the whole log is kept, and its end shown if the build fails.
mkdir -p build; LOG=build/setup-build.log
: > "$LOG"  # exists before tail follows it (the background pip may start later)
pip install -v --no-build-isolation --no-deps -e . > "$LOG" 2>&1 < /dev/null &
BUILD_PID=$!
# (pip -v indents the backend's output; a step shows as "[3/10] orbbec/nms/src/cpu/nms_cpu.cpp")
tail -n +1 -f "$LOG" --pid=$BUILD_PID \
  | sed -nEu 's#^ *(\[[0-9]+/[0-9]+\]) .* -c ([^ ]+\.(cpp|cu)) .*#\1 \2#p; s#^ *(orbbec: .*)#\1#p' || true
if ! wait $BUILD_PID; then tail -60 "$LOG"; echo "setup: the build failed (whole log: $LOG)"; exit 1; fi
"$PY" -c "import orbbec; print('orbbec built:', 'CUDA ' + orbbec.get_compiling_cuda_version() if orbbec.with_cuda() else 'CPU only', '|', orbbec.get_compiler_version())"

case "$MODE" in
  demo) step "demo"; "$PY" scripts/demo.py ;;
  test)
    # Compile the CUDA sources too where nvcc exists (CI has no GPU: this catches breakage early).
    if command -v nvcc >/dev/null 2>&1 || [ -x /usr/local/cuda/bin/nvcc ]; then
      step "compiling the CUDA sources for sm_90 ($MAX_JOBS at a time)"
      PATH="$PATH:/usr/local/cuda/bin" PYTHON="$PY" JOBS=$MAX_JOBS bash tools/check_cuda_compile.sh
    fi
    step "tests"
    "$PY" -m pytest -q -rs -p no:cacheprovider tests ;;
esac
