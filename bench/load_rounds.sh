#!/bin/sh
# load_rounds.sh: how the default thread policy degrades when another
# process keeps one core busy, beside the policies it was chosen over.
#
#   bench/load_rounds.sh [BUILD_DIR [ROUNDS]]     (defaults: build 3)
#
# Each round trains one epoch of the MLP (all 60000 images) and of the CNN
# (its first 3200), 1000 test images, under three configurations:
#   default   the CLI as shipped: oneDNN GEMMs, OpenMP threads that sleep
#             between regions (OMP_WAIT_POLICY=PASSIVE, set by the CLI)
#   spin      the same with OMP_WAIT_POLICY=ACTIVE (threads spin)
#   openblas  fc on OpenBLAS (BP_KERNELS='fc.*=blas'), whose threads spin
#             and split each GEMM statically
# once on an idle machine and once beside a busy loop on one core, in
# that order, so each pair sees the same minute. One line per round, model
# and configuration: images/s idle, loaded, and loaded / idle. With two
# cores and a third busy thread, a fair share leaves a run 2/3 of them.
set -eu
build=${1:-build}
rounds=${2:-3}
busy_pid=""
stop_busy() { [ -z "$busy_pid" ] || kill "$busy_pid" 2>/dev/null || true; busy_pid=""; }
trap stop_busy EXIT INT TERM
ips() { grep -o '[0-9]* img/s' | head -1 | grep -o '^[0-9]*'; }
run() { # CONFIG MODEL: one epoch's images/s
  lim=""
  [ "$2" = cnn ] && lim="--train-limit 3200"
  case $1 in
    default) set -- "$2" ;;
    spin) set -- "$2" OMP_WAIT_POLICY=ACTIVE ;;
    openblas) set -- "$2" 'BP_KERNELS=fc.*=blas' ;;
  esac
  m=$1
  shift
  env "$@" "$build/blueprint" train "models/$m.yaml" --epochs 1 --seed 1 $lim --test-limit 1000 \
    --quiet 2>&1 | ips
}
for r in $(seq "$rounds"); do
  for m in mlp cnn; do
    for c in default spin openblas; do
      idle=$(run "$c" "$m")
      sh -c 'while :; do :; done' &
      busy_pid=$!
      loaded=$(run "$c" "$m")
      stop_busy
      echo "$r $m $c $idle $loaded" | awk '{
        printf "round %s %s %-8s idle %6d img/s  loaded %6d img/s  loaded/idle %.2f\n", $1, $2, $3, $4, $5, $5 / $4 }'
    done
  done
done
