#!/bin/sh
# infer_compare.sh: batch-1 latency and batch-200 throughput of blueprint
# (predict, bench_eval_throughput) beside PyTorch (torch_infer.py), for the
# issue 14 table in RESULTS.md. Rounds alternate blueprint and PyTorch so a
# drifting machine affects both.
#
#   bench/infer_compare.sh [BUILD_DIR [ROUNDS [MODELS]]]   (defaults: build 3 "mlp cnn resnet8")
#
# Each model gets a small checkpoint first (64 training images; accuracy does
# not matter for speed). Output: one line per measurement, then `uptime`
# (the load the figures were taken under); RESULTS.md reads its table from them.
set -eu
build=${1:-build}
rounds=${2:-3}
models=${3:-"mlp cnn resnet8"}
data=${BP_DATA:-/usr/share/datasets/fashion-mnist}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
idx="$data/t10k-images-idx3-ubyte.gz"
for m in $models; do
  "$build/blueprint" train "models/$m.yaml" --epochs 1 --train-limit 64 --test-limit 200 \
    --checkpoint "$tmp/$m.ckpt" --quiet > /dev/null
done
for r in $(seq "$rounds"); do
  for m in $models; do
    for t in 1 2; do
      lat=$(BP_THREADS=$t "$build/blueprint" predict "models/$m.yaml" --checkpoint "$tmp/$m.ckpt" \
        --input "$idx" --limit 1000 --threads $t | grep -o 'latency median [0-9.]* ms')
      thr=$(BP_THREADS=$t "$build/bench/bench_eval_throughput" "models/$m.yaml" \
        --checkpoint "$tmp/$m.ckpt" --rounds 5 | tail -1)
      echo "round $r $m blueprint threads $t: batch-1 $lat; batch-200 $thr"
    done
    /usr/bin/python3 bench/torch_infer.py --model "models/$m.yaml" --threads 1,2 --seconds 2 |
      sed "s/^/round $r $m pytorch: /"
  done
done
uptime
