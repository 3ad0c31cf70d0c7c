#!/usr/bin/env bash
# Every goal of the pipeline work in one invocation on the GPU machine (about 9 minutes): the ResNet-50
# loop fed by the loader with the default decoder against synthetic data, then the benchmark with every
# pipeline (DALI under both decoder loads and both queue counts). Logs and tables go to $OUT.
#
# DALI travels in parts (`bash ../shared/tools/device-peers.sh make dali` on the development machine
# prints the calls). To fit the call limit, build in the first part's call and run this in the last:
#   call 1:      bash .peers/1/stage.sh put && TORCH_CUDA_ARCH_LIST=9.0 FORCE_CUDA=1 MAX_JOBS=16 \
#                python3 setup.py build_ext --inplace > $OUT/build.log 2>&1
#   calls 2..N-1: bash .peers/K/stage.sh put
#   call N:      bash .peers/N/stage.sh put && bash .peers/N/stage.sh unpack && source .peers/N/env.sh \
#                && bash tools/dev/all_goals.sh
set -uo pipefail
: "${OUT:?set OUT to a folder for the logs}"
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
timeout 120 python3 tools/profile_loader.py --skip-stages --modes synthetic,orbbec --orbbec-workers 9 --steps 100 \
  > "$OUT/train.log" 2>&1
grep -E "images/s|fed the" "$OUT/train.log"
timeout 470 python3 tools/benchmark_pipeline.py --seconds 2.5 --rounds 1 --workers "12,cls-1080p=9,det=9,face=16" \
  --pipelines "orbbec,orbbec decode only,DALI,torchvision,CPU DataLoader" --workloads cls-500x375,cls-1080p,face,det \
  --json "$OUT/run.json" --md "$OUT/run.md" > "$OUT/bench.log" 2>&1
echo "benchmark rc $?"
cat "$OUT/run.md" 2>/dev/null || tail -20 "$OUT/bench.log"
