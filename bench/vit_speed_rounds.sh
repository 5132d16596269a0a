#!/usr/bin/env bash
# bench/vit_speed_rounds.sh [BUILD [ROUNDS [IMAGES [PINS]]]]: training images/s of
# the ViT (models/vit.yaml) in blueprint's default command (and, given PINS,
# with `--kernels PINS` too) and in its
# PyTorch twin at 1 and 2 threads, one epoch of the first IMAGES training
# images (default 6400), in alternating rounds (default 3), so that every
# side sees the same load; then each side's median and the ratios of
# blueprint's median to each twin's (RESULTS.md, issue 33).
set -euo pipefail
cd "$(dirname "$0")/.."
build=${1:-build} rounds=${2:-3} images=${3:-6400} pins=${4:-}
py=/usr/bin/python3 # Debian's, where python3-torch is installed
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
rate() { python3 -c 'import json, sys
epochs = [d for d in map(json.loads, filter(str.strip, open(sys.argv[1]))) if d.get("event") == "epoch"]
print(round(epochs[-1]["images_per_second"]))' "$1"; }
for r in $(seq "$rounds"); do
  rm -f "$out/bp.jsonl"
  "$build/blueprint" train models/vit.yaml --epochs 1 --train-limit "$images" --test-limit 1000 \
    --quiet --metrics "$out/bp.jsonl" > /dev/null
  echo "round $r blueprint $(rate "$out/bp.jsonl")" | tee -a "$out/rates"
  if [ -n "$pins" ]; then
    rm -f "$out/bp.jsonl"
    "$build/blueprint" train models/vit.yaml --epochs 1 --train-limit "$images" --test-limit 1000 \
      --quiet --kernels "$pins" --metrics "$out/bp.jsonl" > /dev/null
    echo "round $r pinned $(rate "$out/bp.jsonl")" | tee -a "$out/rates"
  fi
  for th in 1 2; do
    "$py" bench/torch_twin.py --model models/vit.yaml --epochs 1 --train-limit "$images" \
      --test-limit 1000 --threads "$th" --json > "$out/t$th.jsonl"
    echo "round $r torch-$th $(rate "$out/t$th.jsonl")" | tee -a "$out/rates"
  done
done
python3 - "$out/rates" <<'PY'
import statistics, sys
rates = {}
for line in open(sys.argv[1]):
    _, _, side, v = line.split()
    rates.setdefault(side, []).append(float(v))
med = {k: statistics.median(v) for k, v in rates.items()}
for k, v in med.items(): print(f"median {k:10s} {v:8.0f} img/s")
best = max(med["torch-1"], med["torch-2"])
for side in [k for k in ("blueprint", "pinned") if k in med]:
    print(f"{side} / torch-1 {med[side] / med['torch-1']:.2f}x, "
          f"/ torch-2 {med[side] / med['torch-2']:.2f}x, / best torch {med[side] / best:.2f}x")
PY
