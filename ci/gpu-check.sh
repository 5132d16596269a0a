#!/usr/bin/env bash
# The GPU check (ci/README.md, "GPU check"): runs on a machine with an
# NVIDIA GPU from the pack ci/gpu-pack.sh made (.gpu/), in about 8 minutes,
# and writes its logs and summary.txt under $OUT (default .gpu/out).
#
#   ci/gpu-check.sh [--dry-run] [--only STAGE,...] [--skip STAGE,...] [--budget SECONDS]
#                   [--device KIND]
#
# Stages, in order, each with its own time limit, each going on after a
# failure; one summary line per stage, PASS, FAIL or SKIP with the reason:
#   env        the GPU, the driver, where cuDNN, cuBLAS, NCCL and cudart were found
#   plugins    `blueprint plugins`: the cuda device and the cuda, cudnn and cublas
#              modules load (none refused)
#   ctest      the GPU suites (ctest -R 'cuda|cudnn|cublas|nccl|graph_replay'): all pass,
#              none skips
#   validate   `blueprint validate --device cuda` (FP32 and the FP16 twins)
#   replay     CNN, 20 steps, --deterministic: graph replay and --no-graph give the
#              same losses and the same checkpoint bytes (FP32 and --amp), the eager
#              3-stream run the same checkpoint as --streams 1, and the
#              graph run's steps did run as graphs (launches per step > 0)
#   amp_skip   MLP --amp: a static loss scale of 1e19 overflows every step, and every
#              step is skipped; a scale growing every step overflows and is skipped
#              at some steps while training goes on
#   accuracy   MLP and CNN, one epoch of Fashion-MNIST on the GPU, within 0.5 points
#              of the CPU's test accuracy (figures below)
#   scaling    the inputs of the multi-GPU model (bench/RESULTS-gpu.md, "Scaling on
#              paper"): VGG16-BN, batch 128, AMP, synthetic data: the plan's
#              gradient buckets, 3 profiled steps, 15 graph steps (the step time),
#              4 eager FP32 steps of 2 ranks on the one GPU (the collectives' time
#              and overlap with backward, comm_*_per_step); then
#              bench/gpu/scaling_model.py: scaling.md
#   bench      bench/gpu/run.sh --quick (its table in bench.md)
#   sanitizer  compute-sanitizer memcheck over a few MLP and CNN (--amp) steps
#              (SKIP where it is missing or refuses the device)
# Time (s; expected on an H200 is an estimate until a run records it, the
# limit is the stage's cap): env 5/-, plugins 5/30, ctest 60/150, validate
# 45/150, replay 50/240, amp_skip 15/90, accuracy 50/180, scaling 50/195,
# bench 150/300, sanitizer 90/180: about 520 s expected, so --budget
# (default 480) decides: a stage gets at most what is left, and the stages
# after the budget SKIP. The costly stages come last (bench, then the
# sanitizer, which a second call can run alone: --only sanitizer).
# --dry-run prints every stage's command and SKIPs it; so does a machine
# without a GPU (no nvidia-smi, or one that sees no device). --device cpu
# runs the training stages (replay, amp_skip, accuracy, scaling with the
# CNN) on the CPU instead, without a GPU: a test of this script itself. Exit
# status: 1 when any stage FAILs.
set -uo pipefail
root=$(cd "$(dirname "$0")/.." && pwd -P)
cd "$root"
pack=$root/.gpu
start=$(date +%s)
budget=480
dry=0
dev=cuda
only=""
skip=""
while [ $# -gt 0 ]; do
  case "$1" in
    --dry-run) dry=1 ;;
    --only) only=",$2,"; shift ;;
    --skip) skip=",$2,"; shift ;;
    --budget) budget=$2; shift ;;
    --device) dev=$2; shift ;;
    -h|--help) sed -n '2,/^[^#]/{/^#/p}' "$0"; exit 0 ;;
    *) echo "gpu-check: unknown argument '$1' (try --help)" >&2; exit 2 ;;
  esac
  shift
done

# CPU reference test accuracies after one epoch (seed 1, default kernels,
# the model files' settings), both on a fresh clone of main, 2026-12-02:
# MLP `blueprint train models/mlp.yaml --epochs 1` (86.22%); CNN the
# README's main job, with the Winograd convolutions of ops/winograd
# (85.37%). The CPU's own figure moves by a few tenths with its kernels
# (85.66% with oneDNN's convolution primitives, 85.83% with im2col + SGEMM).
ref_mlp=86.22
ref_cnn=85.37
tolerance=0.5

out=${OUT:-$pack/out}
work=$(mktemp -d "${TMPDIR:-/tmp}/gpu-check.XXXXXX")
mkdir -p "$out"
summary=$out/summary.txt
: > "$summary"
failed=0

say() { echo "$*" | tee -a "$summary"; }
# result STAGE PASS|FAIL|SKIP REASON
result() {
  local line
  line=$(printf '%-10s %-4s %s' "$1" "$2" "$3")
  say "$line"
  [ "$2" = FAIL ] && failed=1
  return 0
}
left() { echo $((budget - ($(date +%s) - start))); }
# wanted STAGE: whether --only/--skip let it run
wanted() {
  [ -n "$only" ] && [[ "$only" != *",$1,"* ]] && return 1
  [[ "$skip" == *",$1,"* ]] && return 1
  return 0
}
# limit SECONDS: the stage's limit, cut to the budget left
limit() { local l; l=$(left); [ "$l" -lt 1 ] && l=1; [ "$1" -lt "$l" ] && echo "$1" || echo "$l"; }

# ---- the pack and the machine ----------------------------------------------------

B=${GPU_CHECK_BUILD:-$pack/build} # another build: only to test this script
bp=$B/blueprint
data=$pack/data/fashion-mnist
gpu=1
why_no_gpu=""
if [ $dry = 1 ]; then
  gpu=0; why_no_gpu="dry run"
elif [ "$dev" != cuda ]; then
  gpu=1 # a test of the script on another device
elif ! command -v nvidia-smi >/dev/null 2>&1; then
  gpu=0; why_no_gpu="no nvidia-smi: no NVIDIA driver on this machine"
elif ! nvidia-smi -L 2>/dev/null | grep -q '^GPU '; then
  gpu=0; why_no_gpu="nvidia-smi sees no GPU"
fi
have_pack=1
if [ ! -x "$bp" ] || [ ! -f "$pack/PACK" ]; then
  have_pack=0
fi

# The build's paths are absolute (RPATH, CTest files, the tests' module
# paths): where this copy sits elsewhere, its path takes the packed one.
if [ $have_pack = 1 ] && [ $gpu = 1 ]; then
  src=$(sed -n 's/^source //p' "$pack/PACK")
  if [ -n "$src" ] && [ "$src" != "$root" ]; then
    if [ ! -e "$src" ]; then
      mkdir -p "$(dirname "$src")" && ln -s "$root" "$src"
    fi
    if [ "$(cd "$src" 2>/dev/null && pwd -P)" != "$root" ]; then
      have_pack=0
      why_pack="the pack was built at $src, which exists here and is not this copy"
    fi
  fi
fi

# Libraries: the pack's where the system lacks them (a system zlib newer
# than the pack's stays the one every process, Python too, loads), then
# CUDA's and PyTorch's wheels (nvidia/*/lib), for what the loader does not know.
mkdir -p "$work/lib"
for f in "$pack"/lib/*; do
  [ -e "$f" ] || continue
  ldconfig -p 2>/dev/null | grep -q "^[[:space:]]*$(basename "$f") " || ln -sf "$f" "$work/lib/"
done
libdirs=$work/lib:$B/core
for d in /usr/local/cuda/lib64 /usr/local/cuda/lib; do [ -d "$d" ] && libdirs=$libdirs:$d; done
for d in /opt/torch/.venv/lib/python3*/site-packages/nvidia/*/lib \
         $(python3 -c 'import site; print(" ".join(site.getsitepackages()))' 2>/dev/null | \
           xargs -n1 2>/dev/null | sed 's|$|/nvidia/*/lib|'); do
  for e in $d; do [ -d "$e" ] && [[ ":$libdirs:" != *":$e:"* ]] && libdirs=$libdirs:$e; done
done
# PyTorch keeps the machine's own search path: its wheels' libraries, not
# another CUDA's that LD_LIBRARY_PATH would put first
orig_ld=${LD_LIBRARY_PATH:-}
export LD_LIBRARY_PATH=$libdirs${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
unset BP_PLUGIN_PATH # the build's own modules only (an empty value lists as a skipped entry)

# run_stage NAME SECONDS COMMAND...: the command's output into NAME.log
run_stage() {
  local name=$1 secs=$2
  shift 2
  echo "\$ $*" >> "$work/$name.log"
  timeout --kill-after=10 "$secs" "$@" >> "$work/$name.log" 2>&1
}

# the stages that --device cpu skips: they check CUDA itself
gpu_only=env,plugins,ctest,bench,sanitizer
# the gates every GPU stage passes: SKIP or FAIL with the reason, else 0
gate() {
  local stage=$1
  if ! wanted "$stage"; then result "$stage" SKIP "not asked for (--only/--skip)"; return 1; fi
  if [ $gpu = 0 ]; then result "$stage" SKIP "$why_no_gpu"; return 1; fi
  if [ "$dev" != cuda ] && [[ ",$gpu_only," == *",$stage,"* ]]; then
    result "$stage" SKIP "GPU only (--device $dev)"; return 1
  fi
  if [ $have_pack = 0 ]; then
    result "$stage" FAIL "${why_pack:-no pack in .gpu: run ci/gpu-pack.sh where the packages are}"
    return 1
  fi
  if [ "$(left)" -lt 15 ]; then result "$stage" SKIP "out of time (--budget $budget s)"; return 1; fi
  return 0
}

say "gpu-check: $(date -u '+%Y-%m-%d %H:%M:%S UTC') in $root"
[ -f "$pack/PACK" ] && sed 's/^/  pack: /' "$pack/PACK" | tee -a "$summary"

# ---- env ----------------------------------------------------------------------------

stage_env() {
  {
    echo "== nvidia-smi"; nvidia-smi 2>&1
    echo "== nvidia-smi -q (product, driver, clocks)"
    nvidia-smi -q 2>&1 | grep -E 'Product Name|Driver Version|CUDA Version|Persistence|Clocks Event|Max Clocks' -A0 | head -n 20
    echo "== uname"; uname -a
    echo "== nvcc"; (command -v nvcc && nvcc --version) 2>&1 || /usr/local/cuda/bin/nvcc --version 2>&1
    echo "== python3 torch"; LD_LIBRARY_PATH=$orig_ld python3 -c 'import torch; print(torch.__version__, torch.version.cuda, torch.backends.cudnn.version(), torch.cuda.get_device_name(0))' 2>&1
    echo "== LD_LIBRARY_PATH"; echo "$LD_LIBRARY_PATH" | tr ':' '\n'
    echo "== the pack's libraries in use (the system lacks them)"; ls "$work/lib"
    echo "== libraries the CUDA modules resolve"
    for f in "$B"/core/blueprint/modules/*.so; do echo "-- $f"; ldd "$f" 2>&1 | grep -E 'cud|cublas|nccl|not found'; done
    echo "== compute-sanitizer"; command -v compute-sanitizer || ls /usr/local/cuda/bin/compute-sanitizer 2>&1
  } > "$work/env.log" 2>&1
  local name driver libs
  name=$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -n 1)
  driver=$(nvidia-smi --query-gpu=driver_version --format=csv,noheader 2>/dev/null | head -n 1)
  libs=$(grep -E '=> /' "$work/env.log" | grep -Eo 'lib(cudnn|cublas|cublasLt|cudart|nccl)\.so[.0-9]* => [^ ]+' |
         sed 's| => |=|' | sort -u | tr '\n' ' ')
  if grep -q '=> not found' "$work/env.log"; then
    result env FAIL "$name, driver $driver; missing: $(grep '=> not found' "$work/env.log" | awk '{print $1}' | sort -u | tr '\n' ' ')"
  else
    result env PASS "$name, driver $driver; $libs"
  fi
}
if gate env; then stage_env; fi

# ---- plugins ------------------------------------------------------------------------

if gate plugins; then
  run_stage plugins "$(limit 30)" "$bp" plugins
  missing=""
  for m in bp_device_cuda bp_ops_cuda bp_ops_cudnn bp_ops_cublas; do
    grep -Eq "^ *loaded +.*/$m\.so" "$work/plugins.log" || missing="$missing $m"
  done
  # the collectives on device memory and NCCL, where the pack has them
  extra=""
  for m in bp_ops_allreduce_cuda bp_ops_allreduce_nccl; do
    [ -e "$B/core/blueprint/modules/$m.so" ] || continue
    if grep -Eq "^ *loaded +.*/$m\.so" "$work/plugins.log"; then extra="$extra, ${m#bp_ops_}"
    else missing="$missing $m"; fi
  done
  if [ -z "$missing" ]; then result plugins PASS "cuda device and the cuda, cudnn, cublas${extra} modules loaded"
  else result plugins FAIL "not loaded:$missing ($(grep -A2 'refused' "$work/plugins.log" | grep -o 'init failed.*' | head -n 2 | tr '\n' ' '))"; fi
fi

# ---- ctest --------------------------------------------------------------------------

if gate ctest; then
  ct=$(command -v ctest || echo /opt/torch/.venv/bin/ctest)
  run_stage ctest "$(limit 150)" "$ct" --test-dir "$B" -R 'cuda|cudnn|cublas|nccl|graph_replay' \
    -j 4 --timeout 140 --output-on-failure
  rc=$?
  n=$(grep -c 'Test *#' "$work/ctest.log")
  skipped=$(grep -E 'Test *#.*(Skipped|Not Run)' "$work/ctest.log" | sed -n 's/.*: \([a-z_0-9]*\) .*/\1/p' | tr '\n' ' ')
  bad=$(grep -E 'Test *#.*(Failed|Timeout|Exception|\*\*\*)' "$work/ctest.log" | grep -v Skipped | sed -n 's/.*: \([a-z_0-9]*\) .*/\1/p' | tr '\n' ' ')
  # cut off by the stage's limit (a suite's own TIMEOUT property outlasts
  # --timeout): the suites that never reported
  if [ $rc -eq 124 ] || [ $rc -eq 137 ]; then
    unfinished=""
    for t in $("$ct" --test-dir "$B" -N -R 'cuda|cudnn|cublas|nccl|graph_replay' 2>/dev/null |
               sed -n 's/^ *Test *#[0-9]*: //p'); do
      grep -Eq "Test *#[0-9]+: $t " "$work/ctest.log" || unfinished="$unfinished $t"
    done
    bad="${bad}(stopped at the stage's limit; unfinished:${unfinished:- none})"
  fi
  if [ "$n" -eq 0 ]; then result ctest FAIL "no GPU suite ran (exit $rc) ${bad}"
  elif [ $rc -ne 0 ] || [ -n "$bad" ]; then result ctest FAIL "$n suites; failed: ${bad:-exit $rc}"
  elif [ -n "$skipped" ]; then result ctest FAIL "$n suites; skipped on a GPU: $skipped"
  else result ctest PASS "$n suites: $(grep -E 'Test *#' "$work/ctest.log" | sed -n 's/.*: \([a-z_0-9]*\) .*/\1/p' | tr '\n' ' ')"; fi
fi

# ---- validate -----------------------------------------------------------------------

if gate validate; then
  run_stage validate "$(limit 150)" "$bp" validate --device "$dev"
  rc=$?
  line=$(grep -E '^validate: ' "$work/validate.log" | tail -n 1)
  if [ $rc -eq 0 ] && [ -n "$line" ]; then result validate PASS "$line"
  else result validate FAIL "exit $rc: ${line:-$(tail -n 1 "$work/validate.log")}"; fi
fi

# ---- replay == eager ----------------------------------------------------------------

# epoch KEY FILE: the key of the last epoch line
epoch_key() {
  python3 -c 'import json,sys
e=[x for x in map(json.loads, open(sys.argv[2])) if x.get("event") == "epoch"][-1]
print(e.get(sys.argv[1]))' "$1" "$2" 2>/dev/null
}
# the step lines' losses and the epoch line of a metrics file, one per line
losses() {
  python3 - "$1" <<'EOF'
import json, sys
for line in open(sys.argv[1]):
    x = json.loads(line)
    if x.get("event") == "step":
        print("step", x["global_step"], repr(x["train_loss"]))
    elif x.get("event") == "epoch":
        print("epoch", repr(x["train_loss"]), repr(x["test_loss"]), repr(x["test_accuracy"]))
EOF
}
if gate replay; then
  msgs=""
  ok=1
  for prec in fp32 amp; do
    amp=(); [ $prec = amp ] && amp=(--amp)
    for mode in graph eager onestream; do
      ng=(); [ $mode = eager ] && ng=(--no-graph)
      [ $mode = onestream ] && ng=(--no-graph --streams 1)
      run_stage replay "$(limit 60)" "$bp" train models/cnn.yaml --device "$dev" --data "$data" \
        --batch 128 --train-limit 2560 --test-limit 400 --epochs 1 --deterministic \
        --log-every 1 --quiet "${amp[@]}" "${ng[@]}" --metrics "$work/replay-$prec-$mode.jsonl" \
        --checkpoint "$work/replay-$prec-$mode.ckpt" || { ok=0; msgs="$msgs $prec $mode run failed;"; }
    done
    a=$work/replay-$prec-graph.jsonl b=$work/replay-$prec-eager.jsonl
    if [ -s "$a" ] && [ -s "$b" ]; then
      losses "$a" > "$work/replay-$prec-graph.txt"; losses "$b" > "$work/replay-$prec-eager.txt"
      if [ "$(grep -c '^step' "$work/replay-$prec-graph.txt")" -ne 20 ]; then
        ok=0; msgs="$msgs $prec: not 20 step lines;"
      elif ! cmp -s "$work/replay-$prec-graph.txt" "$work/replay-$prec-eager.txt"; then
        ok=0; msgs="$msgs $prec: losses differ;"
        diff "$work/replay-$prec-graph.txt" "$work/replay-$prec-eager.txt" | head -n 6 >> "$work/replay.log"
      elif ! cmp -s "$work/replay-$prec-graph.ckpt" "$work/replay-$prec-eager.ckpt"; then
        ok=0; msgs="$msgs $prec: losses equal, checkpoints differ;"
      elif ! cmp -s "$work/replay-$prec-eager.ckpt" "$work/replay-$prec-onestream.ckpt"; then
        ok=0; msgs="$msgs $prec: 3 streams and --streams 1 give different checkpoints;"
      elif [ "$dev" != cpu ] && ! python3 -c 'import sys; sys.exit(0 if float(sys.argv[1]) > 0 else 1)' \
             "$(epoch_key graph_launches_per_step "$a")" 2>/dev/null; then
        ok=0; msgs="$msgs $prec: equal, but no step ran as a graph ($(grep -m1 -hE 'step graph failed|steps run eagerly' "$work/replay.log" | head -c 300));"
      else
        msgs="$msgs $prec: 20 steps equal ($(python3 -c 'import json,sys
e=[x for x in map(json.loads, open(sys.argv[1])) if x.get("event") == "epoch"][-1]
print("graph launches/step %s, syncs/step %s" % (e.get("graph_launches_per_step"), e.get("syncs_per_step")))' "$a"));"
      fi
    fi
  done
  if [ $ok = 1 ]; then result replay PASS "${msgs# }"; else result replay FAIL "${msgs# }"; fi
fi

# ---- AMP overflow skip ----------------------------------------------------------------

if gate amp_skip; then
  msgs="" ok=1
  run_stage amp_skip "$(limit 45)" "$bp" train models/mlp.yaml --device "$dev" --data "$data" \
    --amp --loss-scale 1e19 --batch 128 --train-limit 1280 --test-limit 200 --epochs 1 --quiet \
    --metrics "$work/amp-static.jsonl"
  s=$(epoch_key skipped_steps "$work/amp-static.jsonl") n=$(epoch_key steps "$work/amp-static.jsonl")
  sc=$(epoch_key loss_scale "$work/amp-static.jsonl")
  if [ -n "$n" ] && [ "$n" != None ] && [ "$s" = "$n" ] && [ "$n" = 10 ]; then
    msgs="static 1e19: $s of $n steps skipped (scale $sc);"
  else ok=0; msgs="static 1e19: skipped $s of $n steps, 10 of 10 expected;"; fi
  run_stage amp_skip "$(limit 45)" "$bp" train models/mlp.yaml --device "$dev" --data "$data" \
    --amp --loss-scale-growth-interval 1 --batch 128 --train-limit 5120 --test-limit 200 \
    --epochs 1 --quiet --metrics "$work/amp-growth.jsonl"
  s=$(epoch_key skipped_steps "$work/amp-growth.jsonl") n=$(epoch_key steps "$work/amp-growth.jsonl")
  acc=$(epoch_key test_accuracy "$work/amp-growth.jsonl")
  if [ -n "$s" ] && [ "$s" != None ] && [ "$s" -ge 1 ] && [ "$s" -lt "$n" ] &&
     python3 -c "import sys; sys.exit(0 if float('$acc') > 0.5 else 1)" 2>/dev/null; then
    msgs="$msgs growing scale: $s of $n steps skipped, test accuracy $acc"
  else ok=0; msgs="$msgs growing scale: $s of $n steps skipped, test accuracy $acc (want 1 <= skipped < steps, accuracy > 0.5)"; fi
  if [ $ok = 1 ]; then result amp_skip PASS "$msgs"; else result amp_skip FAIL "$msgs"; fi
fi

# ---- accuracy against the CPU ---------------------------------------------------------

if gate accuracy; then
  msgs="" ok=1
  models="mlp cnn"
  # a CNN epoch takes minutes on a CPU: --device cpu checks the stage with the MLP
  [ "$dev" = cpu ] && { models=mlp; msgs="(cnn: GPU only)"; }
  for m in $models; do
    ref=$ref_mlp; [ $m = cnn ] && ref=$ref_cnn
    run_stage accuracy "$(limit 90)" "$bp" train "models/$m.yaml" --device "$dev" --data "$data" \
      --epochs 1 --quiet --metrics "$work/accuracy-$m.jsonl"
    acc=$(epoch_key test_accuracy "$work/accuracy-$m.jsonl")
    ips=$(epoch_key images_per_second "$work/accuracy-$m.jsonl")
    if python3 -c "import sys; a=100*float('$acc'); sys.exit(0 if abs(a-$ref) <= $tolerance else 1)" 2>/dev/null; then
      msgs="$msgs $m $(python3 -c "print('%.2f' % (100*float('$acc')))")% (CPU $ref%, ${ips%.*} img/s);"
    elif [ -z "$acc" ] || [ "$acc" = None ]; then ok=0; msgs="$msgs $m: no epoch line (the run failed or ran out of time);"
    else ok=0; msgs="$msgs $m test accuracy $acc not within $tolerance points of the CPU's $ref%;"; fi
  done
  if [ $ok = 1 ]; then result accuracy PASS "${msgs# }"; else result accuracy FAIL "${msgs# }"; fi
fi

# ---- scaling on paper ----------------------------------------------------------------------

# The inputs of bench/gpu/scaling_model.py measured on this GPU: VGG16-BN at
# batch 128 per GPU with AMP on synthetic data. --device cpu: the CNN at
# batch 16 and 2 steps each, a test of the plumbing (VGG16-BN takes minutes
# a step there; the figures mean nothing).
if gate scaling; then
  msgs="" ok=1
  sm=models/vgg16bn.yaml sb=128 prof=3 warm=5 timed=10 rsteps=4
  [ "$dev" = cpu ] && { sm=models/cnn.yaml sb=16 prof=2 warm=2 timed=2 rsteps=2; }
  syn=(--device "$dev" --data synthetic --amp --epochs 1 --quiet --test-limit "$sb" --eval-batch "$sb")
  sp=$work/scaling
  echo "\$ $bp plan $sm --batch $sb --amp --json" >> "$work/scaling.log"
  "$bp" plan "$sm" --batch "$sb" --amp --json > "$sp-plan.json" 2>> "$work/scaling.log" ||
    { ok=0; msgs="plan failed: $(tail -n 1 "$work/scaling.log");"; }
  # profiled eager steps: the nodes in order, their FLOPs (and times, on the cpu)
  run_stage scaling "$(limit 60)" "$bp" train "$sm" "${syn[@]}" --batch "$sb" \
    --train-limit $((sb * prof)) --profile --metrics "$sp-profile.jsonl"
  rc=$?
  [ $rc -ne 0 ] && { ok=0; msgs="$msgs profiled steps: exit $rc;"; }
  # graph-replayed steps: the step time between the step lines after the warm-up
  rate=()
  if [ $warm -gt 0 ]; then
    run_stage scaling "$(limit 60)" "$bp" train "$sm" "${syn[@]}" --batch "$sb" \
      --train-limit $((sb * (warm + timed))) --log-every "$warm" --metrics "$sp-rate.jsonl"
    rc=$?
    if [ $rc -eq 0 ]; then rate=(--throughput "$sp-rate.jsonl")
    else ok=0; msgs="$msgs graph steps: exit $rc;"; fi
  fi
  # 2 ranks sharing the GPU, sb images each, FP32 (where each bucket's
  # collective follows its last writer; AMP's waits for the whole unscale)
  # and eager (step graphs are not timed): the comm stream's time, and the
  # part of it inside backward (docs/training.md, "Streams")
  run_stage scaling "$(limit 75)" "$bp" train "$sm" --device "$dev" --data synthetic --epochs 1 \
    --quiet --test-limit "$sb" --eval-batch "$sb" --no-graph --ranks 2 --batch $((2 * sb)) \
    --train-limit $((2 * sb * rsteps)) --metrics "$sp-ranks2.jsonl"
  rc=$?
  [ $rc -ne 0 ] && msgs="$msgs 2 ranks on one device: exit $rc;"
  if [ -s "$sp-plan.json" ] && grep -q '"event":"profile"' "$sp-profile.jsonl" 2>/dev/null; then
    echo "\$ python3 bench/gpu/scaling_model.py ..." >> "$work/scaling.log"
    python3 bench/gpu/scaling_model.py --plan "$sp-plan.json" --profile "$sp-profile.jsonl" \
      "${rate[@]}" --comm "$sp-ranks2.jsonl" --batch "$sb" --save-inputs "$out/scaling-inputs.json" \
      --json "$sp-model.json" > "$out/scaling.md" 2>> "$work/scaling.log"
    rc=$?
    if [ $rc -eq 0 ]; then
      msgs="$msgs $(python3 - "$sp-model.json" <<'PY'
import json, sys
d = json.load(open(sys.argv[1]))
i, r = d["inputs"], {x["gpus"]: x for x in d["rows"]}[8]["scenarios"]
f = d["info"]["overlap_fraction"]
print("step %.2f ms (%.0f img/s, %s); 8 GPUs at %g GB/s (model): serial %.0f img/s (%.1f%%), "
      "bucket %.0f (%.1f%%); overlap measured: %s; scaling.md" % (
          i["step_ms"], i["batch"] * 1000 / i["step_ms"], i["node_times"], d["busbw_gbs"],
          r["serial"]["img_s"], 100 * r["serial"]["efficiency"], r["bucket"]["img_s"],
          100 * r["bucket"]["efficiency"], "%.2f" % f if f is not None else "no"))
PY
)"
    else ok=0; msgs="$msgs the model failed: $(tail -n 1 "$work/scaling.log");"; fi
  else ok=0; msgs="$msgs no plan or no profile line: the model did not run;"; fi
  if [ $ok = 1 ]; then result scaling PASS "${msgs# }"; else result scaling FAIL "${msgs# }"; fi
fi

# ---- bench ------------------------------------------------------------------------------

if gate bench; then
  run_stage bench "$(limit 300)" env BLUEPRINT="$bp" BP_DATA="$data" PYTHON=python3 ROW_TIMEOUT=60 \
    PYTHON_LD_LIBRARY_PATH="$orig_ld" \
    bench/gpu/run.sh --quick --out "$work/bench"
  rc=$?
  # cut off by its limit: the table of the rows that ran
  [ -f "$work/bench/summary.md" ] || [ ! -f "$work/bench/rows.txt" ] ||
    python3 bench/gpu/summary.py "$work/bench" > "$work/bench/summary.md" 2>> "$work/bench.log"
  [ -f "$work/bench/summary.md" ] && cp "$work/bench/summary.md" "$out/bench.md"
  if [ $rc -eq 0 ]; then result bench PASS "every row ran on both sides (bench.md)"
  else result bench FAIL "exit $rc: $(grep -E 'failed' "$work/bench.log" | head -n 3 | tr '\n' ' ' | head -c 400)"; fi
fi

# ---- compute-sanitizer ------------------------------------------------------------------

if gate sanitizer; then
  cs=$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)
  if [ ! -x "$cs" ]; then result sanitizer SKIP "no compute-sanitizer on this machine"
  else
    ok=1 msgs=""
    for m in mlp cnn; do
      amp=(); [ $m = cnn ] && amp=(--amp)
      run_stage sanitizer "$(limit 90)" "$cs" --tool memcheck --error-exitcode 99 \
        "$bp" train "models/$m.yaml" --device "$dev" --data "$data" "${amp[@]}" --batch 64 \
        --train-limit 192 --test-limit 200 --epochs 1 --quiet
      rc=$?
      if grep -qE 'Device not supported|error 999|not supported on this' "$work/sanitizer.log"; then
        ok=2; msgs="compute-sanitizer refused the device: $(grep -m1 -E 'not supported|999' "$work/sanitizer.log")"; break
      elif [ $rc -eq 0 ]; then msgs="$msgs $m${amp:+ (amp)}: 3 steps, no errors;"
      elif [ $rc -eq 124 ] || [ $rc -eq 137 ]; then ok=0; msgs="$msgs $m: ran past its time limit (exit $rc; memcheck is slow to load cuDNN/cuBLAS);"
      else ok=0; msgs="$msgs $m: exit $rc, $(grep -m1 -E 'ERROR SUMMARY|Invalid|========= [A-Z]' "$work/sanitizer.log" | head -c 200);"; fi
    done
    case $ok in 1) result sanitizer PASS "${msgs# }" ;; 2) result sanitizer SKIP "$msgs" ;;
      *) result sanitizer FAIL "${msgs# }" ;; esac
  fi
fi

# ---- what comes back ----------------------------------------------------------------------

[ $dry = 1 ] && {
  echo "dry run: the commands each stage runs, from $root:"
  cat <<EOF
  plugins    $bp plugins
  ctest      ctest --test-dir $B -R 'cuda|cudnn|cublas|nccl|graph_replay' -j 4
  validate   $bp validate --device cuda
  replay     $bp train models/cnn.yaml --device cuda --data $data --batch 128 --train-limit 2560
             --deterministic --log-every 1 [--amp] [--no-graph] --metrics ... --checkpoint ...
  amp_skip   $bp train models/mlp.yaml --device cuda --amp --loss-scale 1e19 ...;
             ... --amp --loss-scale-growth-interval 1 ...
  accuracy   $bp train models/{mlp,cnn}.yaml --device cuda --data $data --epochs 1
  scaling    $bp plan models/vgg16bn.yaml --batch 128 --amp --json;
             $bp train models/vgg16bn.yaml --device cuda --data synthetic --amp --batch 128
             --profile (3 steps) | --log-every 5 (15 steps) | FP32 --no-graph --ranks 2
             --batch 256 (4 steps);
             python3 bench/gpu/scaling_model.py --plan ... --profile ... --throughput ... --comm ...
  bench      bench/gpu/run.sh --quick
  sanitizer  compute-sanitizer --tool memcheck $bp train models/{mlp,cnn}.yaml --device cuda ...
EOF
}
say "gpu-check: $(grep -c ' PASS ' "$summary") PASS, $(grep -c ' FAIL ' "$summary") FAIL, $(grep -c ' SKIP ' "$summary") SKIP in $(( $(date +%s) - start )) s"
# the scaling model's table (a model, not a measurement) after the stage lines
[ -s "$out/scaling.md" ] && { echo; cat "$out/scaling.md"; } >> "$summary"
# every log into one file, the rest (metrics, checkpoints aside) into a tarball
for f in "$work"/*.log; do
  [ -f "$f" ] || continue
  echo "=================== $(basename "$f")"
  tail -c 400000 "$f"
done > "$out/logs.txt" 2>/dev/null
tar -C "$work" --exclude='*.ckpt' --exclude=./lib -czf "$out/logs.tar.gz" . 2>/dev/null
rm -rf "$work"
exit $failed
