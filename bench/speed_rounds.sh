#!/bin/sh
# speed_rounds.sh: training images/s of blueprint's default command, of
# blueprint --ranks 2, and of the PyTorch twin with 2 and 1 threads, in
# alternating rounds (a drifting machine moves all of them alike).
#
#   bench/speed_rounds.sh [BUILD_DIR [ROUNDS]]     (defaults: build 2)
#
# One epoch each: the CNN on its first 12800 training images, the MLP on
# all 60000; 1000 test images. One line per round and model. Just before
# and just after the MLP's default run, bench_sgemm_floor measures the
# SGEMM rate sustained for 3 s (and its fastest call): the machine drifts
# by tens of percent within a minute, so the run is held against the mean
# of the two (the fastest call: the faster of the two). The MLP's floor is
# that rate over its 4,012,032 training FLOPs per image (3 x 2 x 668,672
# weights), and the line ends with the default run's share of both
# floors. A profiled run of the default then gives its step's share of
# the SGEMM floor measured in the same process (`--profile`'s "SGEMM
# floor" line).
set -eu
build=${1:-build}
rounds=${2:-2}
ips() { grep -o '[0-9]* img/s' | head -1; }
twin() { grep -o '"images_per_second": [0-9]*' | head -1 | grep -o '[0-9]*$'; }
for r in $(seq "$rounds"); do
  for m in cnn mlp; do
    lim=""
    [ "$m" = cnn ] && lim="--train-limit 12800"
    floor=""
    if [ "$m" = mlp ] && [ -x "$build/bench/bench_sgemm_floor" ]; then
      floor=$("$build/bench/bench_sgemm_floor" 3)
    fi
    a=$("$build/blueprint" train "models/$m.yaml" --epochs 1 --seed 1 $lim --test-limit 1000 --quiet 2>&1 | ips)
    [ -z "$floor" ] || floor="$floor
$("$build/bench/bench_sgemm_floor" 3)"
    b=$("$build/blueprint" train "models/$m.yaml" --epochs 1 --seed 1 $lim --test-limit 1000 --ranks 2 --quiet 2>&1 | ips)
    c=$(/usr/bin/python3 bench/torch_twin.py --model "$m" --epochs 1 $lim --test-limit 1000 --threads 2 --json 2>/dev/null | twin)
    d=$(/usr/bin/python3 bench/torch_twin.py --model "$m" --epochs 1 $lim --test-limit 1000 --threads 1 --json 2>/dev/null | twin)
    # the step against the yardstick measured in the same process (docs/profile.md)
    e=$("$build/blueprint" train "models/$m.yaml" --epochs 1 --seed 1 $lim --test-limit 1000 --quiet --profile 2>&1 |
      grep -o 'reaches [0-9.]*% and [0-9.]*%' | head -1)
    echo "round $r $m: blueprint default $a; --ranks 2 $b; pytorch 2 threads $c img/s; 1 thread $d img/s"
    echo "round $r $m: profiled default step $e of its SGEMM floor (yardstick's fastest and median run)"
    # the floor lines before and after the run: mean sustained rate, faster fastest call
    [ -z "$floor" ] || echo "$floor" | awk -v ips="${a% img/s}" '{
      for (i = 1; i <= NF; i++) {
        if ($i == "sustained") { s[NR] = $(i + 1) + 0 }
        if ($i == "fastest" && $(i + 1) + 0 > f) f = $(i + 1) + 0
      } }
      END { m = (s[1] + s[2]) / 2; fs = m * 1e9 / 4012032; ff = f * 1e9 / 4012032
      printf "round mlp floor: SGEMM sustained %.1f before, %.1f after GFLOP/s -> %.0f img/s, default %.1f%%; fastest call %.1f -> %.0f img/s, default %.1f%%\n", s[1], s[2], fs, 100 * ips / fs, f, ff, 100 * ips / ff }'
  done
done
