#!/usr/bin/env bash
# Whether Python's garbage collections are the stretches in which the loader leaves the JPEG engines
# idle (docs/dev/decode.md, "The engines' busy share" and "Open"), in one call on the GPU machine
# after the build: for each workload (default "det face"), two alternated rounds of decoding alone,
# the loader, and the loader with the heap frozen once the data is built (--gc-freeze), each with
# the engines' busy share and the process's collections; then the training loop once with the
# training setting (profile_loader.py prints the collections of each mode's timed steps).
#   OUT=... [TRAIN=0] bash tools/dev/gc_probe.sh [workloads]   (about 25 s a probe, 30 s the loop;
#   TRAIN=0 leaves the loop out, when a goal run's training call follows on the same machine)
# Each line of the probes' output is prefixed with its round and setting; logs go to $OUT.
set -uo pipefail
: "${OUT:?set OUT to a folder for the logs}"
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
probe() {  # workload, round, setting name, extra flags
  timeout 90 python3 -W ignore tools/dev/loader_stage_probe.py --workload "$1" --workers 32 --seconds 3 \
    --engine-use --gc "${@:4}" > "$OUT/probe_$1_$2_$3.log" 2>&1
  grep -E "img/s|engine use|garbage|between ms|gil ms" "$OUT/probe_$1_$2_$3.log" | grep -v "window 1" | cut -c1-300 | sed "s|^|[$1 r$2 $3] |"
}
for w in ${1:-det face}; do
  for r in 1 2; do
    probe "$w" "$r" alone --mode decode
    probe "$w" "$r" loader --mode transform --windows 2 --gaps
    probe "$w" "$r" frozen --mode transform --windows 2 --gaps --gc-freeze
  done
done
[ "${TRAIN:-1}" = 1 ] || exit 0
timeout 150 python3 tools/profile_loader.py --skip-stages --modes synthetic,orbbec --orbbec-workers 9 --steps 100 \
  --decoder training > "$OUT/train.log" 2>&1
grep -E "images/s|garbage|fed the" "$OUT/train.log"
