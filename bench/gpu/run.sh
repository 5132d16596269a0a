#!/usr/bin/env bash
# The GPU bench (bench/gpu/README.md): blueprint and PyTorch side by side on
# this machine's GPU, same model file, batch and optimizer, then a table.
#
#   bench/gpu/run.sh [--quick] [--out DIR] [--rows ROW,ROW,...]
#
# Rows (name = model-batch-precision):
#   cnn-128-fp32 cnn-128-amp cnn-1024-fp32 cnn-1024-amp   (Fashion-MNIST)
#   vgg16bn-128-amp resnet18-256-amp                     (--data synthetic, 224x224x3)
# --quick: 5 warm-up and 15 timed steps, PyTorch eager only (no
# torch.compile); the default takes 10 and 40, eager and torch.compile.
#
# Environment: BLUEPRINT (the blueprint executable; default build/blueprint),
# BP_DATA (the Fashion-MNIST directory; default blueprint's own default),
# PYTHON (default python3, which must have torch), PYTHON_LD_LIBRARY_PATH
# (when set, PyTorch runs with this LD_LIBRARY_PATH instead: ci/gpu-check.sh
# puts CUDA libraries for blueprint first there, which PyTorch must not
# load in place of its own), ROW_TIMEOUT (seconds per side of a row;
# default 240, 120 with --quick).
# Writes under DIR (default bench/gpu/out): bp-ROW.jsonl (blueprint's
# metrics), bp-ROW.log, arena-ROW.txt (`blueprint plan --json`'s total
# bytes), torch.jsonl, torch-ROW.log, summary.md (bench/gpu/summary.py).
# Exit status: 0 when every row ran on both sides, 1 otherwise (the table
# is written either way).
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/../.." && pwd)
quick=0
out="$here/out"
rows="cnn-128-fp32,cnn-128-amp,cnn-1024-fp32,cnn-1024-amp,vgg16bn-128-amp,resnet18-256-amp"
while [ $# -gt 0 ]; do
  case "$1" in
    --quick) quick=1 ;;
    --out) out=$2; shift ;;
    --rows) rows=$2; shift ;;
    -h|--help) sed -n '2,24p' "$0"; exit 0 ;;
    *) echo "bench/gpu/run.sh: unknown argument '$1' (try --help)" >&2; exit 2 ;;
  esac
  shift
done
bp=${BLUEPRINT:-$repo/build/blueprint}
py=${PYTHON:-python3}
if [ $quick = 1 ]; then warm=5; timed=15; modes=eager; tmo=${ROW_TIMEOUT:-120}
else warm=10; timed=40; modes=both; tmo=${ROW_TIMEOUT:-240}; fi
mkdir -p "$out"
: > "$out/torch.jsonl"
: > "$out/rows.txt"
[ -x "$bp" ] || { echo "bench/gpu/run.sh: no blueprint executable at $bp (set BLUEPRINT)" >&2; exit 1; }
failed=0
IFS=, read -r -a list <<< "$rows"
for row in "${list[@]}"; do
  IFS=- read -r model batch prec <<< "$row"
  case "$prec" in amp) amp=(--amp) ;; fp32) amp=() ;;
    *) echo "bench/gpu/run.sh: row '$row': precision must be fp32 or amp" >&2; exit 2 ;; esac
  yaml="$repo/models/$model.yaml"
  [ -f "$yaml" ] || { echo "bench/gpu/run.sh: row '$row': no $yaml" >&2; exit 2; }
  case "$model" in
    cnn|mlp) data=(); [ -n "${BP_DATA:-}" ] && data=(--data "$BP_DATA"); eb=200 ;;
    *) data=(--data synthetic); eb=$batch ;;
  esac
  n=$((batch * (warm + timed)))
  echo "$row $model $batch $prec $warm $timed" >> "$out/rows.txt"
  echo "== $row: blueprint (${warm} + ${timed} steps of $batch)"
  "$bp" plan "$yaml" --batch "$batch" --eval-batch "$eb" --train-size "$n" "${amp[@]}" --json 2>"$out/arena-$row.err" |
    "$py" -c 'import json,sys; print(json.load(sys.stdin)["variants"][0]["total_bytes"])' \
      > "$out/arena-$row.txt" || echo "   plan failed: $(head -c 300 "$out/arena-$row.err")"
  rm -f "$out/bp-$row.jsonl"
  timeout "$tmo" "$bp" train "$yaml" --device cuda "${data[@]}" --batch "$batch" "${amp[@]}" \
    --epochs 1 --train-limit "$n" --test-limit "$eb" --eval-batch "$eb" --log-every "$warm" \
    --metrics "$out/bp-$row.jsonl" --quiet > "$out/bp-$row.log" 2>&1
  rc=$?
  if [ $rc -ne 0 ]; then
    echo "   blueprint failed (exit $rc$([ $rc = 124 ] && echo ": over ${tmo} s")): $(tail -n 2 "$out/bp-$row.log" | tr '\n' ' ' | head -c 400)"
    failed=1
  fi
  echo "== $row: PyTorch ($modes)"
  ttmo=$tmo; [ "$modes" = both ] && ttmo=$((tmo * 3)) # torch.compile compiles first
  timeout "$ttmo" env LD_LIBRARY_PATH="${PYTHON_LD_LIBRARY_PATH-${LD_LIBRARY_PATH:-}}" \
    "$py" "$here/torch_bench.py" "$yaml" --batch "$batch" \
    "${amp[@]}" --mode "$modes" --warmup "$warm" --steps "$timed" \
    >> "$out/torch.jsonl" 2> "$out/torch-$row.log"
  rc=$?
  if [ $rc -ne 0 ]; then
    echo "   PyTorch failed (exit $rc$([ $rc = 124 ] && echo ": over ${ttmo} s")): $(tail -n 2 "$out/torch-$row.log" | tr '\n' ' ' | head -c 400)"
    failed=1
  fi
done
"$py" "$here/summary.py" "$out" | tee "$out/summary.md"
exit $failed
