#!/usr/bin/env bash
# Every goal of the pipeline work in one machine session on the GPU machine, in calls back to back
# on the warm machine (each under the 10-minute call limit):
#   part 1: the ResNet-50 loop fed by the loader (default decoder) against synthetic data, then the
#           benchmark with every pipeline on cls-500x375 and cls-1080p (DALI under both decoder loads
#           and both queue counts; the loader and decoding alone, whose ratio is a goal, in three
#           alternated rounds, their medians counting: one process's rate varies by 10-20% on small
#           images);
#   part 2: the same benchmark on face and det, then one table of all four from both parts' JSON
#           (kept in $HOME/all_goals between the calls).
#   part 2 can also take one workload at a time (`all_goals.sh 2 face`, then `all_goals.sh 2 det`), so
#           each call has room for more rounds; the table then merges whichever parts are there;
#   part 3: the training loop alone (TRAIN_RUNS runs, default 1); with NVJPEG_AB=1 then, where DALI's
#           wheels left their nvJPEG ($HOME/peers/nvidia/cu13/lib), the loop with that library first
#           and without it, alternated twice (whether another nvJPEG build slows the loop: in goal run
#           26 it did not).
# Logs and tables go to $OUT.
#
# DALI 2.4 must be importable there (nvidia-dali-cuda130==2.4.0 with nvidia-nvimgcodec-cu13 and
# nvidia-nvjpeg, on PYTHONPATH and LD_LIBRARY_PATH). The machine has no internet and a call carries at
# most 64 MiB: install the wheels for Python 3.12 elsewhere (pip install --target DIR --python-version
# 3.12 --only-binary=:all: ...), then carry DIR over in pieces, one call each, back to back while the
# machine stays warm. Build orbbec in the first of those calls
# (TORCH_CUDA_ARCH_LIST=9.0 FORCE_CUDA=1 MAX_JOBS=16 python3 setup.py build_ext --inplace), then:
#   next call:  bash tools/dev/all_goals.sh 1      (with DALI's paths exported)
#   the one after: bash tools/dev/all_goals.sh 2
# Both parts run the training loop TRAIN_RUNS times (default 1) beside their benchmarks, with
# TRAIN_ARGS added to its command line (e.g. "--decoder training"). ROUNDS (default 3) sets the
# rounds of the loader and decoding alone: one process's rate moves by 10-20% from the next one's
# (face's loader 48-58k img/s in three rounds of one run), so their median steadies with more. Each
# extra round adds about a minute to a part (two workloads, two processes of about 14 s); a part
# must stay under the call's 10 minutes. WORKERS (default "24,cls-1080p=9,det=32,face=32") sets the
# loader's workers per workload (benchmark_pipeline.py's --workers).
set -uo pipefail
: "${OUT:?set OUT to a folder for the logs}"
part=${1:?part 1 or 2}
keep=$HOME/all_goals
mkdir -p "$keep"
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
bench() {  # workloads, name
  timeout 560 python3 tools/benchmark_pipeline.py --seconds 2.5 --rounds "${ROUNDS:-3}" --rounds-of "orbbec,orbbec decode only" \
    --workers "${WORKERS:-24,cls-1080p=9,det=32,face=32}" \
    --pipelines "orbbec,orbbec decode only,DALI,torchvision,CPU DataLoader" --workloads "$1" \
    --json "$keep/$2.json" --md "$OUT/$2.md" > "$OUT/bench_$2.log" 2>&1
  echo "benchmark $2 rc $?"
  cp "$keep/$2.json" "$OUT/" 2>/dev/null
}
without_peers() {  # a search path without the carried peers' folders ($HOME/peers...)
  tr ':' '\n' <<< "${1:-}" | grep -v "^$HOME/peers" | paste -sd: -
}
train_once() {  # log file, then a folder to put first on LD_LIBRARY_PATH ("": none): one run of the loop
  # Without DALI's paths: its wheels' libnvjpeg.so.13 would come before the nvJPEG orbbec was built
  # with (LD_LIBRARY_PATH goes before the build's RUNPATH), and a training loop has no DALI beside it.
  LD_LIBRARY_PATH="$2${2:+:}$(without_peers "${LD_LIBRARY_PATH:-}")" PYTHONPATH="$(without_peers "$PYTHONPATH")" \
  timeout 120 python3 tools/profile_loader.py --skip-stages --modes synthetic,orbbec --orbbec-workers 9 --steps 100 ${TRAIN_ARGS:-} \
    > "$1" 2>&1
  grep -E "images/s|fed the|alone|nvJPEG loaded" "$1"
}
need_part1() {  # parts 2 and 3 read part 1's results, kept on this machine between the calls
  [ -f "$keep/cls.json" ] || { echo "no part 1 on this machine ($keep/cls.json): a fresh machine; start again at the build"; exit 3; }
}
train() {  # TRAIN_RUNS runs of the training loop (default 1): its spread is a few percent, one run says little
  for r in $(seq "${TRAIN_RUNS:-1}"); do train_once "$OUT/train_$part.$r.log" ""; done
}
case "$part" in
1)
  train
  bench cls-500x375,cls-1080p cls
  # Only the loader's rows (the whole table is in $OUT): part 2 must start within the machine's 30 s
  # of idle, and twice after a reply with the whole table it found a fresh machine (a shorter reply
  # is a guess at the cause, not a measured one).
  grep -E "^\| [a-z0-9-]+ \| orbbec \|" "$OUT/cls.md" 2>/dev/null
  ;;
2)
  need_part1
  workloads=${2:-face,det}
  case "$workloads" in face,det) name=face_det ;; face|det) name=$workloads ;;
    *) echo "part 2 takes face, det or face,det (the table merges those parts' files)"; exit 2 ;; esac
  bench "$workloads" "$name"
  train
  parts=()
  for p in cls face_det face det; do [ -f "$keep/$p.json" ] && parts+=("$keep/$p.json"); done
  python3 tools/benchmark_pipeline.py --from-json "${parts[@]}" --md "$OUT/run.md" && cat "$OUT/run.md"
  ;;
3)
  need_part1
  train
  lib=$HOME/peers/nvidia/cu13/lib
  [ "${NVJPEG_AB:-0}" = 1 ] && [ -d "$lib" ] || exit 0
  for r in 1 2; do
    for first in "$lib" ""; do
      echo "[nvJPEG ${first:-as built} r$r]"
      train_once "$OUT/train_nvjpeg_$([ -n "$first" ] && echo wheels || echo built).$r.log" "$first"
    done
  done
  ;;
*) echo "part 1, 2 or 3"; exit 2 ;;
esac
