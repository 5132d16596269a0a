#!/usr/bin/env bash
# The GPU check (ci/README.md, "GPU check"): runs on a machine with an
# NVIDIA GPU from the pack ci/gpu-pack.sh made (.gpu/), as two device calls,
# and writes its logs and summary.txt under $OUT (default .gpu/out).
#
#   ci/gpu-check.sh [--bench] [--rehearse] [--dry-run] [--only STAGE,...]
#                   [--skip STAGE,...] [--budget SECONDS]
#
# Two calls, each stage with its own cap (seconds); the budget is the sum
# of the caps, and a stage starts only while its whole cap is left:
#   ci/gpu-check.sh           correctness, budget 300:
#     env 10        the driver against the pack's CUDA major, the GPU's
#                   compute capability against the pack's SASS/PTX, every
#                   CUDA library the modules and cuDNN load resolved; a
#                   failure stops the whole check (one line per reason)
#     plugins 15    `blueprint plugins`: the cuda device and the cuda, cudnn
#                   and cublas modules load (none refused)
#     ctest 75      the GPU suites (ctest -R 'cuda|cudnn|cublas|nccl|graph_replay'):
#                   all pass, none skips
#     validate 50   `blueprint validate --device cuda --json`: some CUDA case
#                   ran, none failed, none skipped but for an unsupported
#                   shape (or a collective, which needs every rank); each
#                   ViT op (attention, layernorm, gelu_tanh, pos_embed;
#                   fwd and bwd) ran at least one case
#     replay 60     CNN, 20 steps, --deterministic: graph replay and --no-graph
#                   give the same finite losses and checkpoint bytes (FP32 and
#                   --amp), 3 streams the same checkpoint as --streams 1, and
#                   the graph run's steps ran as graphs
#     amp_skip 20   MLP --amp: a static loss scale of 1e19 skips every step; a
#                   scale growing every step skips some while training goes on
#     accuracy 40   the MLP recipe below on the GPU (--deterministic --no-tf32)
#                   and on the CPU, in this run: test accuracies within 1.5 points
#     sanitizer 30  compute-sanitizer memcheck over 3 MLP steps
#   ci/gpu-check.sh --bench   the figures, budget 300:
#     env 10, scaling 120 (the multi-GPU model's inputs, VGG16-BN; a failed
#     2-rank run fails it), bench 170 (bench/gpu/run.sh --quick)
# Each summary line gives the stage's wall time against its cap. A stage
# stopped at its cap, or not started for want of budget, is SKIP (budget)
# with what it finished: a timing to resize, not a failure.
# --budget SECONDS: less than the caps' sum (a session short of device time):
# the stages that no longer fit SKIP (budget). --only/--skip: some stages.
# --dry-run prints each stage's commands and SKIPs it; so does a machine
# without a GPU (no nvidia-smi, or one that sees no device).
# --rehearse: the whole check on this CPU machine (CI's tests do): fake
# nvidia-smi, library directory and compute-sanitizer from
# tests/gpu_check/rehearse.sh, the cpu device standing in for cuda, the
# normal build (GPU_CHECK_BUILD, default build/) and tiny data limits.
# Exit status: 1 when a stage FAILs, 0 otherwise (SKIPs included).
set -uo pipefail
root=$(cd "$(dirname "$0")/.." && pwd -P)
cd "$root" || exit 2
pack=$root/.gpu
mode=check
rehearse=0
dry=0
budget=""
only=""
skip=""
while [ $# -gt 0 ]; do
  case "$1" in
    --bench) mode=bench ;;
    --rehearse) rehearse=1 ;;
    --dry-run) dry=1 ;;
    --only) only=",$2,"; shift ;;
    --skip) skip=",$2,"; shift ;;
    --budget) budget=$2; shift ;;
    -h|--help) sed -n '2,/^[^#]/{/^#/p}' "$0"; exit 0 ;;
    *) echo "gpu-check: unknown argument '$1' (try --help)" >&2; exit 2 ;;
  esac
  shift
done

# ---- stages, caps, budget ---------------------------------------------------------

declare -A cap=([env]=10 [plugins]=15 [ctest]=75 [validate]=50 [replay]=60 [amp_skip]=20
                [accuracy]=40 [sanitizer]=30 [scaling]=120 [bench]=170)
if [ $mode = bench ]; then stages=(env scaling bench)
else stages=(env plugins ctest validate replay amp_skip accuracy sanitizer); fi
# GPU_CHECK_CAPS=stage=secs,...: other caps (the tests' short ones)
caps_set=${GPU_CHECK_CAPS:-}
for kv in ${caps_set//,/ }; do cap[${kv%%=*}]=${kv#*=}; done
caps_sum=0
for s in "${stages[@]}"; do caps_sum=$((caps_sum + cap[$s])); done
budget=${budget:-$caps_sum}

# The accuracy recipe (ci/README.md, "Accuracy"): seed 1, the model file's
# settings, one epoch of the first 6400 training images, scored on the
# first 2000 test images. 1.5 points: above the largest spread measured
# between the CPU's own kernel variants and thread counts on one seed.
acc_train=6400 acc_test=2000 acc_tol=1.5

# ---- where things are (the pack, or the rehearsal's stand-ins) ---------------------

out=${OUT:-$pack/out}
work=$(mktemp -d "${TMPDIR:-/tmp}/gpu-check.XXXXXX")
dev=cuda
B=${GPU_CHECK_BUILD:-$pack/build} # another build: only to test this script
if [ $rehearse = 1 ]; then
  dev=cpu
  B=${GPU_CHECK_BUILD:-$root/build}
  # shellcheck source=../tests/gpu_check/rehearse.sh
  . "$root/tests/gpu_check/rehearse.sh"
fi
bp=${GPU_CHECK_BLUEPRINT:-$B/blueprint}
pack_file=${GPU_CHECK_PACK:-$pack/PACK}
data=${GPU_CHECK_DATA:-$pack/data/fashion-mnist}
nvsmi=${GPU_CHECK_NVIDIA_SMI:-nvidia-smi}
bench_cmd=${GPU_CHECK_BENCH:-bench/gpu/run.sh}

mkdir -p "$out"
summary=$out/summary.txt
: > "$summary"
failed=0

say() { echo "$*" | tee -a "$summary"; }
# result STAGE PASS|FAIL|SKIP REASON: the stage's line, with its time when it ran
result() {
  local line t=""
  [ -n "${t0:-}" ] && t=" ($(( $(date +%s) - t0 )) s of ${cap[$1]} s cap)"
  line=$(printf '%-10s %-4s %s%s' "$1" "$2" "$3" "$t")
  say "$line"
  [ "$2" = FAIL ] && failed=1
  return 0
}
# pack_key KEY: a line of the pack's PACK file
pack_key() { sed -n "s/^$1 //p" "$pack_file" 2>/dev/null | head -n 1; }

gpu=1
why_no_gpu=""
if [ $dry = 1 ]; then
  gpu=0; why_no_gpu="dry run"
elif ! command -v "$nvsmi" >/dev/null 2>&1; then
  gpu=0; why_no_gpu="no nvidia-smi: no NVIDIA driver on this machine"
elif ! "$nvsmi" -L 2>/dev/null | grep -q '^GPU '; then
  gpu=0; why_no_gpu="nvidia-smi sees no GPU"
fi
have_pack=1
why_pack="no pack in .gpu: run ci/gpu-pack.sh where the packages are"
if [ ! -x "$bp" ] || [ ! -f "$pack_file" ]; then
  have_pack=0
fi

# The build's paths are absolute (RPATH, CTest files, the tests' module
# paths): where this copy sits elsewhere, its path takes the packed one.
if [ $have_pack = 1 ] && [ $gpu = 1 ] && [ $rehearse = 0 ]; then
  src=$(pack_key source)
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

# ---- running a stage within its cap -------------------------------------------------

# step COMMAND...: one command of the current stage, into its log (its
# stdout into $step_out where set), limited to what is left of the stage's
# cap. Its exit status, or 124 when the cap stopped it or left no time to
# start it (then $cut is 1 and the stage's later steps do not start).
step() {
  [ "$cut" = 1 ] && return 124
  local secs=$((deadline - $(date +%s)))
  [ "$secs" -lt 1 ] && { cut=1; return 124; }
  echo "\$ $*" >> "$log"
  timeout --kill-after=5 "$secs" "$@" >> "${step_out:-$log}" 2>> "$log"
  local rc=$?
  if [ $rc -eq 124 ] || [ $rc -eq 137 ]; then
    cut=1; echo "(stopped at the stage's ${cap[$stage]} s cap)" >> "$log"; return 124
  fi
  return $rc
}
# verdict OK MSGS: the stage's line: FAIL on a check that failed, else
# SKIP (budget) when the cap stopped it, with what it finished, else PASS
verdict() {
  if [ "$1" != 1 ]; then result "$stage" FAIL "${2# }"
  elif [ "$cut" = 1 ]; then
    result "$stage" SKIP "budget: stopped at its ${cap[$stage]} s cap; finished:${2:- nothing}"
  else result "$stage" PASS "${2# }"; fi
}
# the gates every stage passes: a SKIP or FAIL line with the reason, else 0
gate() {
  local s=$1 left
  if ! wanted "$s"; then result "$s" SKIP "not asked for (--only/--skip)"; return 1; fi
  if [ $gpu = 0 ]; then result "$s" SKIP "$why_no_gpu"; return 1; fi
  if [ $have_pack = 0 ]; then result "$s" FAIL "$why_pack"; return 1; fi
  left=$((budget - ($(date +%s) - start)))
  if [ "$left" -lt "${cap[$s]}" ]; then
    result "$s" SKIP "budget: ${left} s left of --budget $budget, its cap is ${cap[$s]} s"; return 1
  fi
  return 0
}
# wanted STAGE: whether --only/--skip let it run
wanted() {
  [ -n "$only" ] && [[ "$only" != *",$1,"* ]] && return 1
  [[ "$skip" == *",$1,"* ]] && return 1
  return 0
}

# ---- env: fail fast on the driver, the architecture and the libraries ---------------

# the oldest driver branch each CUDA major runs on (CUDA's release notes)
min_driver() { case $1 in 13) echo 580 ;; 12) echo 525 ;; 11) echo 450 ;; *) echo "" ;; esac; }

# arch_runs CC ARCHS: whether a GPU of compute capability CC (90 for 9.0)
# runs code built for CMAKE_CUDA_ARCHITECTURES ARCHS ("90", "80-real;90-virtual", "90a"):
# SASS of the same major and no newer minor ("a": that very one), or older PTX
arch_runs() {
  local cc=$1 a n kind
  for a in ${2//;/ }; do
    case $a in all|all-major|native) return 0 ;; esac
    n=${a%%-*} kind=${a#"$n"}
    if [[ $n == *a ]]; then [ "${n%a}" = "$cc" ] && [ "$kind" != -virtual ] && return 0; continue; fi
    [ "$kind" != -virtual ] && [ $((n / 10)) = $((cc / 10)) ] && [ "$n" -le "$cc" ] && return 0
    [ "$kind" != -real ] && [ "$n" -le "$cc" ] && return 0
  done
  return 1
}

# the libraries the modules load by name and the ones cuDNN and cuBLAS load
# at run time (dlopen: ldd does not show them), for the pack's majors
runtime_libs() {
  local cm=$1 dm=$2 l
  for l in cudart cublas cublasLt nvrtc; do echo "lib$l.so.$cm"; done
  for l in "" _graph _ops _cnn _adv _heuristic _engines_precompiled _engines_runtime_compiled; do
    echo "libcudnn$l.so.$dm"
  done
  [ -e "$B/core/blueprint/modules/bp_ops_allreduce_nccl.so" ] && echo libnccl.so.2
  return 0
}
# lib_find NAME: its path in the library directories (GPU_CHECK_LIBDIRS in
# a rehearsal, else LD_LIBRARY_PATH's, then the loader's cache)
lib_find() {
  local d dirs=${GPU_CHECK_LIBDIRS:-$LD_LIBRARY_PATH}
  for d in ${dirs//:/ }; do [ -e "$d/$1" ] && { echo "$d/$1"; return 0; }; done
  [ -n "${GPU_CHECK_LIBDIRS:-}" ] && return 1
  ldconfig -p 2>/dev/null | sed -n "s/^[[:space:]]*$1 .*=> //p" | head -n 1 | grep .
}

# env_log: what the machine carries, for the log (not judged)
env_log() {
  echo "== nvidia-smi"; "$nvsmi" 2>&1
  echo "== uname"; uname -a
  echo "== nvcc"; (command -v nvcc && nvcc --version) 2>&1 || /usr/local/cuda/bin/nvcc --version 2>&1
  echo "== python3 torch"; LD_LIBRARY_PATH=$orig_ld python3 -c 'import torch; print(torch.__version__, torch.version.cuda, torch.backends.cudnn.version(), torch.cuda.get_device_name(0))' 2>&1
  echo "== LD_LIBRARY_PATH"; echo "$LD_LIBRARY_PATH" | tr ':' '\n'
  echo "== the pack's libraries in use (the system lacks them)"; ls "$work/lib"
}
stage_env() {
  env_log >> "$log" 2>&1
  local q name drv cc cm dm archs need lib path missing="" found=0 m notfound="" bad=0
  q=$("$nvsmi" --query-gpu=name,driver_version,compute_cap --format=csv,noheader 2>>"$log" | head -n 1)
  IFS=, read -r name drv cc <<< "$q"
  name=${name# } drv=${drv// /} cc=${cc// /}
  cm=$(pack_key cuda_major) dm=$(pack_key cudnn_major) archs=$(pack_key cuda_arch)
  need=$(min_driver "$cm")
  # the driver against the CUDA major the pack was built with
  if [ -z "$need" ]; then
    result env FAIL "the pack records no CUDA major (cuda_major in PACK): repack with ci/gpu-pack.sh"; bad=1
  elif ! [[ $drv =~ ^[0-9]+ ]] || [ "${drv%%.*}" -lt "$need" ]; then
    result env FAIL "driver '$drv' is older than CUDA $cm needs (>= $need): this machine cannot run the pack"; bad=1
  fi
  # the GPU's compute capability against the pack's SASS/PTX
  if ! [[ $cc =~ ^[0-9]+\.[0-9]+$ ]]; then
    result env FAIL "nvidia-smi gives no compute capability ('$cc'): driver too old to say"; bad=1
  elif [ -z "$archs" ] || ! arch_runs "${cc/./}" "$archs"; then
    result env FAIL "GPU $name is compute capability $cc; the pack has code for '${archs:-nothing recorded}' only: repack with CUDA_ARCH=${cc/./}"; bad=1
  fi
  # every library the modules link, as the loader resolves it
  for m in "$B"/core/blueprint/modules/bp_*{cuda,cudnn,cublas,nccl}*.so; do
    [ -e "$m" ] || continue
    echo "== ldd $m" >> "$log"; ldd "$m" >> "$log" 2>&1
    notfound="$notfound $(ldd "$m" 2>/dev/null | awk '/=> not found/ {print $1}')"
  done
  # and every one loaded at run time by name
  while read -r lib; do
    if path=$(lib_find "$lib"); then found=$((found + 1)); echo "found $lib: $path" >> "$log"
    else missing="$missing $lib"; fi
  done < <(runtime_libs "$cm" "${dm:-9}")
  missing=$(echo "$missing $notfound" | xargs -n1 2>/dev/null | sort -u | xargs)
  if [ -n "$missing" ]; then
    result env FAIL "libraries not found: $missing (searched LD_LIBRARY_PATH, the loader's cache; env.log)"; bad=1
  fi
  [ $bad = 1 ] && return 1
  result env PASS "$name, driver $drv (CUDA $cm needs >= $need), compute capability $cc (pack: $archs), $found run-time libraries found"
}

# ---- plugins ------------------------------------------------------------------------

stage_plugins() {
  local m missing="" extra="" mods=(bp_device_cuda bp_ops_cuda bp_ops_cudnn bp_ops_cublas)
  [ "$dev" = cpu ] && mods=(bp_device_cpu bp_ops_cpu bp_ops_reference)
  step "$bp" plugins
  for m in "${mods[@]}"; do
    grep -Eq "^ *loaded +.*/$m\.so" "$log" || missing="$missing $m"
  done
  # the collectives on device memory and NCCL, where the pack has them
  if [ "$dev" = cuda ]; then
    for m in bp_ops_allreduce_cuda bp_ops_allreduce_nccl; do
      [ -e "$B/core/blueprint/modules/$m.so" ] || continue
      if grep -Eq "^ *loaded +.*/$m\.so" "$log"; then extra="$extra, ${m#bp_ops_}"
      else missing="$missing $m"; fi
    done
  fi
  if [ -z "$missing" ]; then verdict 1 "${mods[*]}$extra loaded"
  else verdict 0 "not loaded:$missing ($(grep -A2 'refused' "$log" | grep -o 'init failed.*' | head -n 2 | tr '\n' ' '))"; fi
}

# ---- ctest --------------------------------------------------------------------------

# the suites' directory and filter: the pack's GPU suites, or the rehearsal's
ct_dir=${GPU_CHECK_CTEST_DIR:-$B}
ct_re=${GPU_CHECK_CTEST_RE:-cuda|cudnn|cublas|nccl|graph_replay}
stage_ctest() {
  local ct rc n skipped bad t unfinished="" passed
  ct=$(command -v ctest || echo /opt/torch/.venv/bin/ctest)
  step "$ct" --test-dir "$ct_dir" -R "$ct_re" -j 8 --output-on-failure
  rc=$?
  n=$(grep -c 'Test *#' "$log")
  passed=$(grep -E 'Test *#.* Passed' "$log" | sed -n 's/.*: \([A-Za-z_0-9]*\) .* \([0-9.]*\) sec.*/\1 \2s/p' | tr '\n' ' ')
  skipped=$(grep -E 'Test *#.*(Skipped|Not Run)' "$log" | sed -n 's/.*: \([A-Za-z_0-9]*\) .*/\1/p' | tr '\n' ' ')
  bad=$(grep -E 'Test *#.*(Failed|Timeout|Exception|\*\*\*)' "$log" | grep -v Skipped | sed -n 's/.*: \([A-Za-z_0-9]*\) .*/\1/p' | tr '\n' ' ')
  if [ $rc -eq 124 ]; then
    for t in $("$ct" --test-dir "$ct_dir" -N -R "$ct_re" 2>/dev/null | sed -n 's/^ *Test *#[0-9]*: //p'); do
      grep -Eq "Test *#[0-9]+: $t " "$log" || unfinished="$unfinished $t"
    done
  fi
  if [ -n "$bad" ]; then verdict 0 "$n suites; failed: $bad"
  elif [ -n "$skipped" ]; then verdict 0 "$n suites; skipped on a GPU: $skipped"
  elif [ $rc -eq 124 ]; then verdict 1 " $passed(unfinished:$unfinished)"
  elif [ "$n" -eq 0 ] || [ $rc -ne 0 ]; then verdict 0 "no suite reported (exit $rc)"
  else verdict 1 "$n suites: $passed"; fi
}

# ---- validate -----------------------------------------------------------------------

# validate_judge FILE DEVICE SCOPE: the JSON report's cases on DEVICE: how
# many ran, failed, and skipped for a reason that is not the case's shape;
# SCOPE "all" (no --op filter) also wants a case of every ViT op
validate_judge() {
  python3 - "$1" "$2" "$3" <<'EOF'
import json, sys
rows = [r for r in json.load(open(sys.argv[1]))["results"] if r["device"] == sys.argv[2]]
ran = [r for r in rows if r["verdict"].lower() in ("pass", "fail")]
failed = [r for r in rows if r["verdict"].lower() == "fail"]
# an unsupported shape is the kernel's own answer; a collective needs every rank (ctest checks those)
odd = [r for r in rows if r["verdict"].lower() == "skip"
       and not r["detail"].startswith(("unsupported:", "collective:"))]
name = lambda r: "%s/%s %s: %s" % (r["op"], r["impl"], r["case"], r["detail"][:120])
# a whole run (no --op filter): the ViT ops' kernels must each have run
vit = ["%s.%s" % (o, p) for o in ("attention", "layernorm", "gelu_tanh", "pos_embed")
       for p in ("fwd", "bwd")] if sys.argv[3] == "all" else []
missing = [o for o in vit if not any(r["op"] == o for r in ran)]
if failed or odd or not ran:
    print("FAIL", "%d %s cases ran, %d failed, %d skipped for another reason than the shape: %s" % (
        len(ran), sys.argv[2], len(failed), len(odd), "; ".join(map(name, (failed + odd)[:3]))))
elif missing:
    print("FAIL", "no %s case ran for %s" % (sys.argv[2], ", ".join(missing)))
else:
    print("PASS", "%d %s cases ran and passed, %d skipped (unsupported shape or collective)" % (
        len(ran), sys.argv[2], len(rows) - len(ran)))
EOF
}
validate_args=${GPU_CHECK_VALIDATE_ARGS:-}
stage_validate() {
  local rc v
  rm -f "$work/validate.json"
  # shellcheck disable=SC2086 # the extra arguments are words
  step_out=$work/validate.json step "$bp" validate --device "$dev" --json $validate_args
  rc=$?
  [ $rc -eq 124 ] && { verdict 1 ""; return; }
  local scope=all
  case " $validate_args " in *" --op "*) scope=filtered ;; esac
  v=$(validate_judge "$work/validate.json" "$dev" "$scope" 2>> "$log") || v="FAIL the report did not parse (exit $rc)"
  [ $rc -ne 0 ] && [ "${v%% *}" = PASS ] && v="FAIL exit $rc: ${v#* }"
  if [ "${v%% *}" = PASS ]; then verdict 1 "${v#* }"; else verdict 0 "${v#* }"; fi
}

# ---- replay == eager ----------------------------------------------------------------

# epoch_key KEY FILE: the key of the last epoch line
epoch_key() {
  python3 -c 'import json,sys
e=[x for x in map(json.loads, open(sys.argv[2])) if x.get("event") == "epoch"][-1]
print(e.get(sys.argv[1]))' "$1" "$2" 2>/dev/null
}
# losses FILE: the step lines' losses and the epoch line, one per line;
# exit 1 on a loss that is not finite (null in the metrics file, or nan/inf)
losses() {
  python3 - "$1" <<'EOF'
import json, math, sys
bad = 0
for line in open(sys.argv[1]):
    x = json.loads(line)
    keys = {"step": ["train_loss"], "epoch": ["train_loss", "test_loss"]}.get(x.get("event"), [])
    vals = [x.get(k) for k in keys]
    if keys:
        bad |= any(v is None or not math.isfinite(v) for v in vals)
        print(x["event"], x.get("global_step", ""), " ".join(map(repr, vals + [x.get("test_accuracy")])))
sys.exit(1 if bad else 0)
EOF
}
# replay_compare PREC: one precision's runs against each other; a message, exit 1 when they differ
replay_compare() {
  local p=$work/replay-$1
  local a=$p-graph.jsonl b=$p-eager.jsonl
  if ! losses "$a" > "$p-graph.txt" || ! losses "$b" > "$p-eager.txt"; then
    echo "$1: a loss is not finite ($(grep -m1 -E 'None|nan|inf' "$p-graph.txt" "$p-eager.txt" | head -c 120))"; return 1
  elif [ "$(grep -c '^step' "$p-graph.txt")" -ne "$replay_steps" ]; then
    echo "$1: not $replay_steps step lines"; return 1
  elif ! cmp -s "$p-graph.txt" "$p-eager.txt"; then
    diff "$p-graph.txt" "$p-eager.txt" | head -n 6 >> "$log"; echo "$1: losses differ"; return 1
  elif ! cmp -s "$p-graph.ckpt" "$p-eager.ckpt"; then
    echo "$1: losses equal, checkpoints differ"; return 1
  elif ! cmp -s "$p-eager.ckpt" "$p-onestream.ckpt"; then
    echo "$1: 3 streams and --streams 1 give different checkpoints"; return 1
  elif [ "$dev" != cpu ] && ! python3 -c 'import sys; sys.exit(0 if float(sys.argv[1]) > 0 else 1)' \
         "$(epoch_key graph_launches_per_step "$a")" 2>/dev/null; then
    echo "$1: equal, but no step ran as a graph ($(grep -m1 -hE 'step graph failed|steps run eagerly' "$log" | head -c 300))"; return 1
  fi
  echo "$1: $replay_steps steps equal (graph launches/step $(epoch_key graph_launches_per_step "$a"), syncs/step $(epoch_key syncs_per_step "$a"))"
}
# CNN 20 steps of 128 on the GPU; 4 of 16 in a rehearsal
replay_batch=128 replay_steps=20 replay_test=400
[ $rehearse = 1 ] && { replay_batch=16 replay_steps=4 replay_test=32; }
stage_replay() {
  local msgs="" ok=1 prec mode m
  local -a amp ng
  for prec in fp32 amp; do
    amp=(); [ $prec = amp ] && amp=(--amp)
    for mode in graph eager onestream; do
      ng=(); [ $mode = eager ] && ng=(--no-graph)
      [ $mode = onestream ] && ng=(--no-graph --streams 1)
      step "$bp" train models/cnn.yaml --device "$dev" --data "$data" --batch "$replay_batch" \
        --train-limit $((replay_batch * replay_steps)) --test-limit "$replay_test" --epochs 1 \
        --deterministic --log-every 1 --quiet "${amp[@]}" "${ng[@]}" \
        --metrics "$work/replay-$prec-$mode.jsonl" --checkpoint "$work/replay-$prec-$mode.ckpt"
      case $? in 0) ;; 124) break 2 ;; *) ok=0; msgs="$msgs $prec $mode run failed;" ;; esac
    done
    [ $ok = 1 ] || continue
    m=$(replay_compare $prec) || ok=0
    msgs="$msgs $m;"
  done
  verdict $ok "$msgs"
}

# ---- AMP overflow skip ----------------------------------------------------------------

stage_amp_skip() {
  local msgs="" ok=1 s n sc acc rc
  step "$bp" train models/mlp.yaml --device "$dev" --data "$data" \
    --amp --loss-scale 1e19 --batch 128 --train-limit 1280 --test-limit 200 --epochs 1 --quiet \
    --metrics "$work/amp-static.jsonl"
  rc=$?
  [ $rc -eq 124 ] && { verdict 1 ""; return; }
  s=$(epoch_key skipped_steps "$work/amp-static.jsonl") n=$(epoch_key steps "$work/amp-static.jsonl")
  sc=$(epoch_key loss_scale "$work/amp-static.jsonl")
  if [ "$n" = 10 ] && [ "$s" = "$n" ]; then msgs="static 1e19: $s of $n steps skipped (scale $sc);"
  else ok=0; msgs="static 1e19: skipped $s of $n steps (exit $rc), 10 of 10 expected;"; fi
  step "$bp" train models/mlp.yaml --device "$dev" --data "$data" \
    --amp --loss-scale-growth-interval 1 --batch 128 --train-limit 5120 --test-limit 200 \
    --epochs 1 --quiet --metrics "$work/amp-growth.jsonl"
  rc=$?
  [ $rc -eq 124 ] && { verdict $ok "$msgs"; return; }
  s=$(epoch_key skipped_steps "$work/amp-growth.jsonl") n=$(epoch_key steps "$work/amp-growth.jsonl")
  acc=$(epoch_key test_accuracy "$work/amp-growth.jsonl")
  if [[ $s =~ ^[0-9]+$ ]] && [[ $n =~ ^[0-9]+$ ]] && [ "$s" -ge 1 ] && [ "$s" -lt "$n" ] &&
     python3 -c "import sys; sys.exit(0 if float('$acc') > 0.5 else 1)" 2>/dev/null; then
    msgs="$msgs growing scale: $s of $n steps skipped, test accuracy $acc"
  else ok=0; msgs="$msgs growing scale: $s of $n steps skipped, test accuracy $acc (want 1 <= skipped < steps, accuracy > 0.5)"; fi
  verdict $ok "$msgs"
}

# ---- accuracy against the CPU, same recipe, same run -------------------------------------

# accuracy_run DEVICE EXTRA...: the recipe on DEVICE; its test accuracy in
# percent into $pct (empty when the run failed); the run's exit status
accuracy_run() {
  local d=$1 f=$work/accuracy-$1.jsonl rc
  shift
  pct=""
  step "$bp" train models/mlp.yaml --device "$d" --data "$data" --seed 1 --epochs 1 \
    --train-limit "$acc_train" --test-limit "$acc_test" --deterministic --quiet "$@" --metrics "$f"
  rc=$?
  [ $rc -eq 0 ] && pct=$(python3 -c 'import sys; print("%.2f" % (100 * float(sys.argv[1])))' \
                           "$(epoch_key test_accuracy "$f")" 2>/dev/null)
  return $rc
}
[ $rehearse = 1 ] && { acc_train=1280 acc_test=400; }
stage_accuracy() {
  local a c rc pct tf=()
  [ "$dev" = cuda ] && tf=(--no-tf32)
  accuracy_run "$dev" "${tf[@]}"; rc=$? a=$pct
  [ $rc -eq 124 ] && { verdict 1 ""; return; }
  [ -z "$a" ] && { verdict 0 "$dev run failed (exit $rc; no epoch line)"; return; }
  accuracy_run cpu; rc=$? c=$pct
  [ $rc -eq 124 ] && { verdict 1 " $dev $a% (not the CPU's run)"; return; }
  [ -z "$c" ] && { verdict 0 "$dev $a%; the CPU's run failed (exit $rc)"; return; }
  if python3 -c "import sys; sys.exit(0 if abs($a - $c) <= $acc_tol else 1)"; then
    verdict 1 "MLP $acc_train/$acc_test images: $dev $a%, cpu $c% (within $acc_tol points)"
  else verdict 0 "MLP $acc_train/$acc_test images: $dev $a%, cpu $c%: more than $acc_tol points apart"; fi
}

# ---- compute-sanitizer ------------------------------------------------------------------

stage_sanitizer() {
  local cs rc
  cs=${GPU_CHECK_SANITIZER:-$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)}
  if [ ! -x "$cs" ]; then result sanitizer SKIP "no compute-sanitizer on this machine"; return; fi
  step "$cs" --tool memcheck --error-exitcode 99 "$bp" train models/mlp.yaml --device "$dev" \
    --data "$data" --batch 64 --train-limit 192 --test-limit 200 --epochs 1 --quiet
  rc=$?
  if grep -qE 'Device not supported|error 999|not supported on this' "$log"; then
    result sanitizer SKIP "compute-sanitizer refused the device: $(grep -m1 -E 'not supported|999' "$log")"
  elif [ $rc -eq 124 ]; then verdict 1 " nothing (memcheck is slow to load cuBLAS; rerun with --only sanitizer)"
  elif [ $rc -eq 0 ]; then verdict 1 "mlp: 3 steps, no errors"
  else verdict 0 "mlp: exit $rc, $(grep -m1 -E 'ERROR SUMMARY|Invalid|========= [A-Z]' "$log" | head -c 200)"; fi
}

# ---- scaling on paper ----------------------------------------------------------------------

# the model's one-line digest of its JSON
scaling_digest() {
  python3 - "$1" <<'PY'
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
}
# The inputs of bench/gpu/scaling_model.py measured on this GPU: VGG16-BN at
# batch 128 per GPU with AMP on synthetic data; the rehearsal: the CNN at
# batch 16 and 2 steps each, a test of the plumbing.
stage_scaling() {
  local msgs="" ok=1 rc sm=models/vgg16bn.yaml sb=128 prof=3 warm=5 timed=10 rsteps=4
  [ $rehearse = 1 ] && { sm=models/cnn.yaml sb=16 prof=2 warm=2 timed=2 rsteps=2; }
  local syn=(--device "$dev" --data synthetic --amp --epochs 1 --quiet --test-limit "$sb" --eval-batch "$sb")
  local sp=$work/scaling rate=()
  step_out=$sp-plan.json step "$bp" plan "$sm" --batch "$sb" --amp --json
  case $? in 0|124) ;; *) ok=0; msgs="plan failed: $(tail -n 1 "$log");" ;; esac
  # profiled eager steps: the nodes in order, their FLOPs (and times, on the cpu)
  step "$bp" train "$sm" "${syn[@]}" --batch "$sb" --train-limit $((sb * prof)) --profile \
    --metrics "$sp-profile.jsonl"
  case $? in 0|124) ;; *) ok=0; msgs="$msgs profiled steps failed;" ;; esac
  # graph-replayed steps: the step time between the step lines after the warm-up
  step "$bp" train "$sm" "${syn[@]}" --batch "$sb" --train-limit $((sb * (warm + timed))) \
    --log-every "$warm" --metrics "$sp-rate.jsonl"
  case $? in 0) rate=(--throughput "$sp-rate.jsonl") ;; 124) ;; *) ok=0; msgs="$msgs graph steps failed;" ;; esac
  # 2 ranks sharing the GPU, FP32 and eager: the comm stream's time and its
  # part inside backward (docs/training.md, "Streams")
  step "$bp" train "$sm" --device "$dev" --data synthetic --epochs 1 --quiet --test-limit "$sb" \
    --eval-batch "$sb" --no-graph --ranks 2 --batch $((2 * sb)) \
    --train-limit $((2 * sb * rsteps)) --metrics "$sp-ranks2.jsonl"
  case $? in 0|124) ;; *) ok=0; msgs="$msgs 2 ranks on one device failed: $(grep -m1 -i 'error\|fail' "$log" | head -c 200);" ;; esac
  if [ $cut = 0 ] && [ $ok = 1 ]; then
    echo "\$ python3 bench/gpu/scaling_model.py ..." >> "$log"
    if python3 bench/gpu/scaling_model.py --plan "$sp-plan.json" --profile "$sp-profile.jsonl" \
         "${rate[@]}" --comm "$sp-ranks2.jsonl" --batch "$sb" --save-inputs "$out/scaling-inputs.json" \
         --json "$sp-model.json" > "$out/scaling.md" 2>> "$log"; then
      msgs="$(scaling_digest "$sp-model.json")"
    else ok=0; msgs="the model failed: $(tail -n 1 "$log")"; fi
  fi
  verdict $ok "$msgs"
}

# ---- bench ------------------------------------------------------------------------------

stage_bench() {
  local rc
  step env BLUEPRINT="$bp" BP_DATA="$data" PYTHON=python3 ROW_TIMEOUT=60 \
    PYTHON_LD_LIBRARY_PATH="$orig_ld" "$bench_cmd" --quick --out "$work/bench"
  rc=$?
  # cut off by its cap: the table of the rows that ran
  [ -f "$work/bench/summary.md" ] || [ ! -f "$work/bench/rows.txt" ] ||
    python3 bench/gpu/summary.py "$work/bench" > "$work/bench/summary.md" 2>> "$log"
  [ -f "$work/bench/summary.md" ] && cp "$work/bench/summary.md" "$out/bench.md"
  if [ $rc -eq 124 ]; then verdict 1 " $(ls "$work"/bench/bp-*.jsonl 2>/dev/null | wc -l) rows (bench.md)"
  elif [ $rc -eq 0 ]; then verdict 1 "every row ran on both sides (bench.md)"
  else verdict 0 "exit $rc: $(grep -E 'failed' "$log" | head -n 3 | tr '\n' ' ' | head -c 400)"; fi
}

# ---- the run --------------------------------------------------------------------------

dry_commands() {
  cat <<EOF
dry run: the commands each stage runs, from $root:
  env        $nvsmi --query-gpu=name,driver_version,compute_cap; ldd the CUDA modules; find $(runtime_libs 13 9 | xargs)
  plugins    $bp plugins
  ctest      ctest --test-dir $ct_dir -R '$ct_re' -j 8
  validate   $bp validate --device $dev --json
  replay     $bp train models/cnn.yaml --device $dev --batch 128 --train-limit 2560
             --deterministic --log-every 1 [--amp] [--no-graph [--streams 1]] --metrics ... --checkpoint ...
  amp_skip   $bp train models/mlp.yaml --amp --loss-scale 1e19 ...; ... --amp --loss-scale-growth-interval 1 ...
  accuracy   $bp train models/mlp.yaml --seed 1 --train-limit $acc_train --test-limit $acc_test --deterministic
             [--device cuda --no-tf32 | --device cpu]
  sanitizer  compute-sanitizer --tool memcheck $bp train models/mlp.yaml --device $dev ... (3 steps)
  scaling    $bp plan/train models/vgg16bn.yaml --data synthetic --amp --batch 128 (--bench)
  bench      $bench_cmd --quick (--bench)
EOF
}

say "gpu-check: $(date -u '+%Y-%m-%d %H:%M:%S UTC') in $root; ${mode}: ${stages[*]}; caps $caps_sum s, budget $budget s$([ $rehearse = 1 ] && echo "; REHEARSAL (cpu device, fakes)")"
[ -f "$pack_file" ] && sed 's/^/  pack: /' "$pack_file" | tee -a "$summary"
start=$(date +%s)
stopped=""
for stage in "${stages[@]}"; do
  t0=""
  gate "$stage" || continue
  log=$work/$stage.log cut=0 t0=$(date +%s)
  deadline=$((t0 + ${cap[$stage]}))
  if ! "stage_$stage" && [ "$stage" = env ]; then
    stopped="the environment cannot run the pack (env lines above)"; break
  fi
done
t0=""
[ $dry = 1 ] && dry_commands
if [ -n "$stopped" ]; then say "gpu-check: stopped after env: $stopped"; fi
say "gpu-check: $(grep -c '^[a-z_]* *PASS ' "$summary") PASS, $(grep -c '^[a-z_]* *FAIL ' "$summary") FAIL, $(grep -c '^[a-z_]* *SKIP ' "$summary") SKIP in $(( $(date +%s) - start )) s"
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
