#!/bin/sh
# autotune_rounds.sh: training images/s of the default kernel selection
# against `train --autotune` with a warm cache and with none (cold), in
# alternating rounds (a drifting or loaded machine moves all three alike).
#
#   bench/autotune_rounds.sh [BUILD_DIR [ROUNDS]]     (defaults: build 3)
#
# One epoch each, seed 1: the MLP on its first 12800 training images, the
# CNN on 3200, resnet8 on 2560; 500 test images. The warm cache is filled
# by one --autotune run per model before the rounds. Each line gives the
# epoch's images/s (the trainer's figure: the steps only, not the start-up
# where autotune times) and each run's wall seconds (start-up included),
# then what autotune kept ("tuned" or "default", from its report on
# stderr; "same" when its picks were the default ones). docs/tuning.md
# explains the decision. The first steps of a run pay one-time costs
# (oneDNN primitives, thread pools starting) that an --autotune run has
# already paid in its timing steps: on short epochs that alone lifts its
# images/s (bench/RESULTS.md, issue 31).
set -eu
build=${1:-build}
rounds=${2:-3}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
limit() {
  case $1 in
    mlp) echo 12800 ;;
    cnn) echo 3200 ;;
    *) echo 2560 ;;
  esac
}
# run MODEL [ARGS...]: "<img/s> <wall s> <kept>"
run() {
  m=$1
  shift
  t0=$(date +%s.%N)
  out=$("$build/blueprint" train "models/$m.yaml" --epochs 1 --seed 1 --train-limit "$(limit "$m")" \
    --test-limit 500 --quiet "$@" 2>&1)
  t1=$(date +%s.%N)
  ips=$(echo "$out" | grep -o '[0-9]* img/s' | head -1 | grep -o '^[0-9]*')
  kept=$(echo "$out" | grep -o 'keeping the [a-z]* kernels' | head -1 | awk '{print $3}')
  # no whole steps timed: the tuned kernels are the default ones
  [ -n "$kept" ] || kept=$(echo "$out" | grep -q 'are the default ones' && echo same || echo -)
  echo "$ips $(echo "$t1 - $t0" | bc) $kept"
}
for m in mlp cnn resnet8; do
  run "$m" --autotune-cache "$tmp/$m.cache" > /dev/null
done
for r in $(seq "$rounds"); do
  for m in mlp cnn resnet8; do
    a=$(run "$m")
    b=$(run "$m" --autotune-cache "$tmp/$m.cache")
    c=$(run "$m" --autotune)
    echo "$r $m $a $b $c" | awk '{
      printf "round %s %-7s default %6d img/s (%5.1f s) | autotune warm %6d img/s (%5.1f s, kept %s) | cold %6d img/s (%5.1f s, kept %s)\n",
        $1, $2, $3, $4, $6, $7, $8, $9, $10, $11 }'
  done
done
