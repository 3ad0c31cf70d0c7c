#!/usr/bin/env bash
# A/B on the GPU machine: runs one command under each environment setting in turn, ROUNDS times, so
# that a difference between settings is read against the spread of one setting (hosts drift within a
# call). Each line of output is prefixed with its setting.
#   bash tools/dev/alternate_env.sh ROUNDS "VAR=a" "VAR=b" [...] -- command args...
# An empty setting ("") runs the default.
set -uo pipefail
case "${1:-}" in -h|--help|"") sed -n '2,6p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;; esac
rounds=$1; shift
settings=()
while [ $# -gt 0 ] && [ "$1" != "--" ]; do settings+=("$1"); shift; done
shift || { echo "alternate_env: no command after --"; exit 2; }
for r in $(seq 1 "$rounds"); do
  for s in "${settings[@]}"; do
    env $s "$@" 2>&1 | sed "s|^|[${s:-default} r$r] |"
  done
done
