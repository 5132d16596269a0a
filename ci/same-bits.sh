#!/usr/bin/env bash
# Prints the bits a build trains to: every shipped model's losses (each
# metrics line's train and test losses and accuracies, as printed to 9
# digits), the plans' arena sizes and the checkpoints' SHA-256, for short
# runs of each training mode a refactor must keep (FP32, --amp, --ranks 2,
# adamw + ema, a resume). Two builds agree when their outputs are identical:
#
#   ci/same-bits.sh build-old > old.txt; ci/same-bits.sh build > new.txt; diff old.txt new.txt
#
# Takes about two minutes on two cores. CHECKPOINTS=DIR keeps the checkpoints
# there, so one build's can be read by the other (`blueprint eval`).
set -euo pipefail
cd "$(dirname "$0")/.."
build=${1:?usage: ci/same-bits.sh BUILD_DIR}
bp=$build/blueprint
[ -x "$bp" ] || { echo "same-bits: no $bp" >&2; exit 2; }
# the build's own libraries even where it is a copy (its RUNPATH names the original)
libdirs=$(find "$build" -name 'lib*.so*' ! -path '*/modules/*' ! -path '*/CMakeFiles/*' -printf '%h\n' |
  sort -u | tr '\n' ':')
export LD_LIBRARY_PATH=$libdirs${LD_LIBRARY_PATH:-}
work=$(mktemp -d "${TMPDIR:-/tmp}/same-bits.XXXXXX")
trap 'rm -rf "$work"' EXIT
keep=${CHECKPOINTS:-}
[ -n "$keep" ] && mkdir -p "$keep"

# run NAME ARGS...: trains, prints the metrics' losses and the checkpoint's hash
run() {
  local name=$1
  shift
  "$bp" train "$@" --quiet --log-every 4 --metrics "$work/$name.jsonl" \
    --checkpoint "$work/$name.ckpt" > "$work/$name.out" 2>&1 ||
    { echo "$name: exit $?"; tail -n 3 "$work/$name.out"; return 0; }
  python3 - "$name" "$work/$name.jsonl" <<'EOF'
import json, sys
name = sys.argv[1]
for line in open(sys.argv[2]):
    x = json.loads(line)
    e = x.get("event")
    if e == "step":
        print(name, "step", x["global_step"], x["train_loss"])
    elif e == "epoch":
        print(name, "epoch", x["epoch"], x["train_loss"], x["train_accuracy"],
              x["test_loss"], x["test_accuracy"])
EOF
  echo "$name ckpt $(sha256sum < "$work/$name.ckpt" | cut -c1-16)"
  [ -z "$keep" ] || cp "$work/$name.ckpt" "$keep/$name.ckpt"
}

small=(--train-limit 1024 --test-limit 256 --batch 64)
run mlp-sgd models/mlp.yaml --epochs 2 --train-limit 8192 --test-limit 1000
run mlp-amp models/mlp.yaml --epochs 1 --train-limit 8192 --test-limit 1000 --amp
run mlp-ranks2 models/mlp.yaml --epochs 1 --train-limit 8192 --test-limit 1000 --ranks 2
run mlp-adamw-ema models/mlp.yaml --epochs 2 --train-limit 4096 --test-limit 1000 \
  --optimizer adamw --lr 0.001 --ema --schedule cosine --warmup-epochs 1
run mlp-noreuse models/mlp.yaml --epochs 1 --train-limit 4096 --test-limit 1000 --no-reuse
run cnn-sgd models/cnn.yaml --epochs 2 --train-limit 1536 --test-limit 500
run cnn-amp models/cnn.yaml --epochs 1 --train-limit 1536 --test-limit 500 --amp
run cnn-ranks2-amp models/cnn.yaml --epochs 1 --train-limit 1536 --test-limit 500 --ranks 2 --amp
run cnn-adamw-ema models/cnn.yaml --epochs 1 --train-limit 1024 --test-limit 500 \
  --optimizer adamw --lr 0.001 --ema
run resnet8 models/resnet8.yaml --epochs 1 "${small[@]}"
run resnet18-amp models/resnet18.yaml --epochs 1 --data synthetic --train-limit 8 --test-limit 4 \
  --batch 4 --eval-batch 4 --amp

# a resume continues to the same bits as the run it interrupts
"$bp" train models/mlp.yaml --epochs 2 --train-limit 4096 --test-limit 500 --quiet \
  --stop-after-steps 40 --checkpoint "$work/resume.ckpt" > /dev/null 2>&1 || true
"$bp" train models/mlp.yaml --epochs 2 --train-limit 4096 --test-limit 500 --quiet \
  --resume "$work/resume.ckpt" --checkpoint "$work/resume.ckpt" > /dev/null 2>&1 ||
  echo "resume: exit $?"
echo "resume ckpt $(sha256sum < "$work/resume.ckpt" | cut -c1-16)"

# the plans: every variant's size and the hash of every tensor's placement,
# with and without liveness packing, FP32 and AMP
for m in models/*.yaml; do
  # vit.yaml needs the ViT layer types (layernorm, gelu_tanh, pos_embed,
  # attention); the baselines predate it: drop this once both have them
  [ "$m" = models/vit.yaml ] && continue
  for opts in "" "--amp" "--no-reuse"; do
    # shellcheck disable=SC2086
    "$bp" plan "$m" $opts --json > "$work/plan.json" 2>&1 || { echo "$m $opts: plan failed"; continue; }
    echo "$(basename "$m" .yaml) ${opts:--} $(python3 -c '
import json, sys
print(" ".join("%s:%d" % (v["name"], v["total_bytes"]) for v in json.load(open(sys.argv[1]))["variants"]))' \
      "$work/plan.json") $(sha256sum < "$work/plan.json" | cut -c1-16)"
  done
done
