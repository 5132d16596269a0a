#!/usr/bin/env bash
# main_job.sh: runs README's main job (one epoch of the default model on
# Fashion-MNIST) N times from an existing build and prints the range of its
# wall time, training images/s and test accuracy, as the sentence README
# carries. Run it on a quiet machine: other jobs slow every figure but the
# accuracy.
#
#   bench/main_job.sh BUILD_DIR [N [ARGS...]]      (default N: 3)
#
# ARGS go to `blueprint train` after README's (a quick check of the script:
# `bench/main_job.sh build 1 --train-limit 512`; the sentence is then not
# README's).
# One line per run, then the machine and load, then the sentence.
set -euo pipefail
cd "$(dirname "$0")/.."
build=${1:?usage: bench/main_job.sh BUILD_DIR [N]}
n=${2:-3}
shift $(( $# < 2 ? $# : 2 ))
case $n in ''|*[!0-9]*|0) echo "main_job: N must be a positive integer, got '$n'" >&2; exit 2 ;; esac
bp=$build/blueprint
[ -x "$bp" ] || { echo "main_job: no $bp (build first)" >&2; exit 2; }
cmd=("$bp" train models/cnn.yaml --epochs 1 "$@")
log=$(mktemp "${TMPDIR:-/tmp}/main_job.XXXXXX")
trap 'rm -f "$log"' EXIT

echo "main job: ${cmd[*]}"
echo "load before: $(cut -d' ' -f1-3 /proc/loadavg)"
rows=()
for i in $(seq 1 "$n"); do
  t0=$(date +%s.%N)
  "${cmd[@]}" </dev/null >"$log" 2>&1 || { echo "main_job: run $i failed:" >&2; tail -n 5 "$log" >&2; exit 1; }
  t1=$(date +%s.%N)
  # the epoch line: "epoch 1/1  train loss L  train acc A%  test acc T%  R img/s  S s"
  ips=$(awk '/^epoch 1\/1 /{for (i = 1; i <= NF; i++) if ($i == "img/s") print $(i - 1)}' "$log")
  acc=$(sed -n 's/^test accuracy \([0-9.]*\)%.*/\1/p' "$log")
  [ -n "$ips" ] && [ -n "$acc" ] || { echo "main_job: run $i printed no epoch line" >&2; tail -n 5 "$log" >&2; exit 1; }
  wall=$(awk -v a="$t0" -v b="$t1" 'BEGIN { printf "%.1f", b - a }')
  echo "run $i: $wall s wall, $ips img/s, test accuracy $acc%"
  rows+=("$wall $ips $acc")
done
cpu=$(sed -n 's/^model name[[:space:]]*: //p' /proc/cpuinfo | head -n 1)
echo "machine: $(nproc) cores ($cpu); load after: $(cut -d' ' -f1-3 /proc/loadavg)"
printf '%s\n' "${rows[@]}" | awk -v cores="$(nproc)" -v n="$n" '
  function group(x,   s, r) {
    s = sprintf("%d", x); r = ""
    while (length(s) > 3) { r = "," substr(s, length(s) - 2) r; s = substr(s, 1, length(s) - 3) }
    return s r
  }
  NR == 1 { wmin = wmax = $1; imin = imax = $2; amin = amax = $3 }
  { if ($1 < wmin) wmin = $1; if ($1 > wmax) wmax = $1
    if ($2 < imin) imin = $2; if ($2 > imax) imax = $2
    if ($3 < amin) amin = $3; if ($3 > amax) amax = $3 }
  END {
    printf "sentence: on %d cores the main job takes %.0f to %.0f seconds (%s to %s images/s; ", \
      cores, wmin, wmax, group(imin), group(imax)
    if (amin == amax) printf "test accuracy %.2f%%", amin
    else printf "test accuracy %.2f%% to %.2f%%", amin, amax
    printf "), over %d runs of bench/main_job.sh\n", n
  }'
