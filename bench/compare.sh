#!/usr/bin/env bash
# Trains blueprint and its PyTorch twin (bench/torch_twin.py) on the same
# model, batch, seed and thread count and prints them side by side.
#
#   bench/compare.sh [options] [MODELS [EPOCHS [THREADS]]] [-- COMMON...]
#
#   MODELS   comma-separated model names (models/NAME.yaml) or paths; default mlp,cnn
#   EPOCHS   default 3
#   THREADS  the twin's --threads (torch's OpenMP/oneDNN pool and OpenBLAS's);
#            blueprint's threads per rank (BP_THREADS, OPENBLAS_NUM_THREADS,
#            OMP_NUM_THREADS); default: nproc
#   COMMON   `blueprint train` options passed to both sides; the twin takes the
#            same names: --train-limit N, --test-limit N, --batch B,
#            --eval-batch B, --lr X, --momentum X, --weight-decay X, --nesterov,
#            --schedule constant|step|cosine, --warmup-epochs X, --step-gamma X,
#            --step-every N, --crop-pad P, --flip, --optimizer sgd|adamw
#
# options:
#   --ranks        issue 5 mode: images/s of blueprint --ranks 1 and --ranks 2,
#                  1 rank with 2 BLAS threads, `mpirun -np 2` (when mpirun
#                  is installed) and "pair": two independent 1-rank runs at
#                  once (their summed images/s over one run's: what the
#                  machine gives two jobs, the ceiling of 2r/1r), beside
#                  PyTorch at its best thread count (1 and 2 tried). 2 ranks
#                  run the 1-rank global batch (strong scaling: each rank's
#                  batch halves, its share of the update too); "w2" runs 2
#                  ranks at twice the batch, each rank the 1-rank batch (weak
#                  scaling); "2rep" runs 2 ranks with --replicate-update
#                  (every rank updates every parameter: the update not
#                  sharded);
#                  EPOCHS defaults to 1 there. Every blueprint rank gets one
#                  BLAS thread (BP_THREADS=1), so 2 ranks use the 2 cores
#                  that 1 rank leaves half idle. "n/a" where blueprint lacks
#                  `train` or refuses `--ranks 2`.
#   --repeat N     ranks mode: N interleaved rounds of every blueprint kind,
#                  the median kept (default 1; this machine's noise is large)
#   --seed S       data-order seed for both (default 1)
#   --out DIR      where logs and JSONL files go (default: a new mktemp -d)
#   --skip-torch   reuse DIR/torch-*.jsonl from an earlier run with --out DIR
#   --skip-blueprint
#   -h, --help
#
# environment: BLUEPRINT (default ./build/blueprint), PYTHON (default
# /usr/bin/python3, Debian's, where python3-torch is installed),
# BLUEPRINT_ARGS (extra arguments for every `blueprint train`), TWIN_ARGS
# (extra arguments for every torch_twin.py run), KINDS (ranks mode: the blueprint
# kinds to run, default "1 2 2rep w2 1t2 pair mpi2"). Options for both sides go
# after `--`.
#
# Runs one training at a time. Timings on a shared or small machine are noisy;
# read the images/s columns as indications, the accuracy columns as results.
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
root=$(cd "$here/.." && pwd)
BLUEPRINT=${BLUEPRINT:-$root/build/blueprint}
PYTHON=${PYTHON:-/usr/bin/python3}
read -r -a extra_bp <<<"${BLUEPRINT_ARGS:-}"
read -r -a extra_pt <<<"${TWIN_ARGS:-}"

mode=accuracy seed=1 repeat=1 out='' skip_torch=0 skip_bp=0
pos=() common=()
while [ $# -gt 0 ]; do
  case $1 in
    --) shift; common=("$@"); break ;;
    --ranks) mode=ranks ;;
    --repeat) repeat=${2:?--repeat needs a count}; shift ;;
    --seed) seed=${2:?--seed needs a value}; shift ;;
    --out) out=${2:?--out needs a directory}; shift ;;
    --skip-torch) skip_torch=1 ;;
    --skip-blueprint) skip_bp=1 ;;
    -h|--help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    -*) echo "compare.sh: unknown option '$1' (try --help)" >&2; exit 2 ;;
    *) pos+=("$1") ;;
  esac
  shift
done
[ ${#pos[@]} -le 3 ] || { echo "compare.sh: at most MODELS EPOCHS THREADS, got ${pos[*]}" >&2; exit 2; }
models=${pos[0]:-mlp,cnn}
if [ "$mode" = ranks ]; then epochs=${pos[1]:-1}; else epochs=${pos[1]:-3}; fi
threads=${pos[2]:-$(nproc)}
case $epochs in ''|*[!0-9]*|0) echo "compare.sh: EPOCHS must be a positive integer, got '$epochs'" >&2; exit 2 ;; esac
case $threads in ''|*[!0-9]*|0) echo "compare.sh: THREADS must be a positive integer, got '$threads'" >&2; exit 2 ;; esac
[ -n "$out" ] || out=$(mktemp -d "${TMPDIR:-/tmp}/bp-compare.XXXXXX")
mkdir -p "$out"

model_file() {
  if [ -f "$1" ]; then echo "$1"; else echo "$root/models/$1.yaml"; fi
}
model_tag() { basename "$1" .yaml; }

# "yes" when `blueprint train` exists (its --help, or a bare call, does not
# say "unknown command").
bp_has_train() {
  [ -x "$BLUEPRINT" ] || return 1
  local msg
  msg=$("$BLUEPRINT" train --help 2>&1 || true)
  ! grep -qi "unknown command" <<<"$msg"
}

# blueprint train MODEL EPOCHS TAG BLAS_THREADS [RANKS [PROCESSES [BATCH]]]: writes
# $out/bp-TAG.jsonl and .log; returns non-zero (the reason in the log) on
# failure. PROCESSES > 0 runs under `mpirun -np PROCESSES` (one rank each;
# Open MPI's opt-ins for root, oversubscription allowed).
run_bp() {
  local model=$1 n=$2 tag=$3 t=$4 ranks=${5:-} procs=${6:-0} batch=${7:-}
  shift $(($# < 7 ? $# : 7)) # the rest: more blueprint options
  local args=(train "$(model_file "$model")" --epochs "$n" --seed "$seed"
              --metrics "$out/bp-$tag.jsonl")
  [ -z "$ranks" ] || args+=(--ranks "$ranks")
  args+=("${common[@]}" "${extra_bp[@]}" "$@")
  [ -z "$batch" ] || args+=(--batch "$batch")
  local env=(BP_THREADS="$t" OPENBLAS_NUM_THREADS="$t" OMP_NUM_THREADS="$t")
  local launch=()
  if [ "$procs" -gt 0 ]; then
    env+=(OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
          OMPI_MCA_btl_vader_single_copy_mechanism=none)
    launch=(mpirun --oversubscribe -np "$procs" -x BP_THREADS -x OPENBLAS_NUM_THREADS
            -x OMP_NUM_THREADS)
  fi
  rm -f "$out/bp-$tag.jsonl"
  echo "+ ${env[*]} ${launch[*]} $BLUEPRINT ${args[*]}" >"$out/bp-$tag.log"
  env "${env[@]}" "${launch[@]}" "$BLUEPRINT" "${args[@]}" </dev/null >>"$out/bp-$tag.log" 2>&1
}

# torch twin MODEL EPOCHS TAG THREADS
run_torch() {
  local model=$1 n=$2 tag=$3 t=$4
  local args=("$here/torch_twin.py" --model "$(model_file "$model")" --epochs "$n"
              --threads "$t" --seed "$seed" --json "${common[@]}" "${extra_pt[@]}")
  echo "+ $PYTHON ${args[*]}" >"$out/torch-$tag.log"
  "$PYTHON" "${args[@]}" >"$out/torch-$tag.jsonl" 2>>"$out/torch-$tag.log"
}

# The training batch of a model file's train: line.
model_batch() { grep -o 'batch: *[0-9]*' "$(model_file "$1")" | head -1 | grep -o '[0-9]*$'; }

summary() { "$PYTHON" "$here/jsonl_summary.py" "$1"; }

# first line of a log that looks like an error (for the "n/a" reasons)
why() { grep -m1 -iE "error|unknown|invalid|not |usage" "$1" 2>/dev/null | cut -c1-100 || true; }

fmt_diff() { # a b -> a - b with sign, or n/a
  case "$1$2" in *n/a*) echo n/a ;; *) awk -v a="$1" -v b="$2" 'BEGIN{printf "%+.2f", a-b}' ;; esac
}
fmt_ratio() { # a b -> a / b, or n/a
  case "$1$2" in *n/a*) echo n/a ;; *) awk -v a="$1" -v b="$2" 'BEGIN{ if (b > 0) printf "%.2fx", a/b; else print "n/a" }' ;; esac
}

have_train=0
if [ $skip_bp = 0 ] && bp_has_train; then have_train=1; fi
pending="pending: blueprint train not yet available"
IFS=, read -r -a model_list <<<"$models"
for m in "${model_list[@]}"; do
  [ -f "$(model_file "$m")" ] || { echo "compare.sh: no model file $(model_file "$m")" >&2; exit 2; }
done

torch_ver=$("$PYTHON" -c 'import torch; print(torch.__version__)' 2>/dev/null || echo "?")
cpu=$(grep -m1 'model name' /proc/cpuinfo | sed 's/.*: //' || echo "?")
echo "# blueprint vs PyTorch $torch_ver, mode $mode, models $models, epochs $epochs," \
     "threads $threads, seed $seed${common[*]:+, common options: ${common[*]}};" \
     "$(nproc) CPUs ($cpu); logs in $out"
[ $have_train = 1 ] || echo "# blueprint: $pending ($BLUEPRINT train)"

if [ "$mode" = accuracy ]; then
  rows=()
  for m in "${model_list[@]}"; do
    tag=$(model_tag "$m")-e$epochs-t$threads
    if [ $skip_torch = 0 ]; then
      echo "# training PyTorch twin: $(model_tag "$m"), $epochs epochs, $threads threads ..." >&2
      run_torch "$m" "$epochs" "$tag" "$threads" || echo "# PyTorch twin failed: see $out/torch-$tag.log" >&2
    fi
    read -r pt_acc pt_ips pt_sec _ pt_all < <(summary "$out/torch-$tag.jsonl")
    bp_acc=n/a bp_ips=n/a bp_sec=n/a bp_all=n/a note=
    if [ $have_train = 1 ]; then
      echo "# training blueprint: $(model_tag "$m"), $epochs epochs ..." >&2
      if run_bp "$m" "$epochs" "$tag" "$threads"; then
        read -r bp_acc bp_ips bp_sec _ bp_all < <(summary "$out/bp-$tag.jsonl")
      else
        note="blueprint failed: $(why "$out/bp-$tag.log")"
      fi
    else
      note=$pending
    fi
    diff=$(fmt_diff "$bp_acc" "$pt_acc")
    verdict=n/a
    [ "$diff" = n/a ] || verdict=$(awk -v d="$diff" 'BEGIN{ print (d <= 1.0 && d >= -1.0) ? "ok" : "FAIL" }')
    rows+=("$(model_tag "$m")|$epochs|$bp_acc|$pt_acc|$diff|$verdict|$bp_ips|$pt_ips|$(fmt_ratio "$bp_ips" "$pt_ips")|$bp_sec|$pt_sec|$note")
    echo "# $(model_tag "$m") test accuracy per epoch (%): blueprint $bp_all; PyTorch $pt_all" >&2
  done
  printf '\n%-8s %6s | %9s %9s %7s %6s | %9s %9s %7s | %8s %8s\n' model epochs \
    "bp acc%" "pt acc%" "diff" "<=1pt" "bp img/s" "pt img/s" "bp/pt" "bp s/ep" "pt s/ep"
  for r in "${rows[@]}"; do
    IFS='|' read -r a b c d e f g h i j k l <<<"$r"
    printf '%-8s %6s | %9s %9s %7s %6s | %9s %9s %7s | %8s %8s' "$a" "$b" "$c" "$d" "$e" "$f" "$g" "$h" "$i" "$j" "$k"
    [ -z "$l" ] && echo || echo "  ($l)"
  done
  echo "# acc: test accuracy after the last epoch; img/s and s/ep: median over epochs" \
       "(training images/s; s/ep includes evaluation)"
else
  rows=()
  for m in "${model_list[@]}"; do
    name=$(model_tag "$m")
    best_ips=n/a best_t=
    for t in 1 2; do
      tag=$name-e$epochs-t$t
      if [ $skip_torch = 0 ]; then
        echo "# training PyTorch twin: $name, $epochs epochs, $t threads ..." >&2
        run_torch "$m" "$epochs" "$tag" "$t" || echo "# PyTorch twin failed: see $out/torch-$tag.log" >&2
      fi
      read -r _ ips _ _ _ < <(summary "$out/torch-$tag.jsonl")
      if [ "$ips" != n/a ] && { [ "$best_ips" = n/a ] || awk -v a="$ips" -v b="$best_ips" 'BEGIN{exit !(a > b)}'; }; then
        best_ips=$ips best_t=$t
      fi
    done
    declare -A r_ips=() r_all=()
    note=
    # ranks as threads (1 BLAS thread each), 1 rank with 2 BLAS threads, 2
    # processes under mpirun; --repeat N rounds, interleaved so drifting
    # load hits every kind alike, and the median is kept
    if [ -n "${KINDS:-}" ]; then
      read -r -a kinds <<<"$KINDS"
    else
      kinds=(1 2 2rep w2 1t2 pair)
      command -v mpirun >/dev/null && kinds+=(mpi2)
    fi
    for ((round = 1; round <= repeat; round++)); do
      for kind in "${kinds[@]}"; do
        [ $have_train = 1 ] || { note=$pending; continue; }
        tag=$name-e$epochs-r$kind-$round
        echo "# training blueprint: $name, $epochs epochs, $kind, round $round ..." >&2
        case $kind in
          1t2) run_bp "$m" "$epochs" "$tag" 2 1 ;;
          mpi2) run_bp "$m" "$epochs" "$tag" 1 "" 2 ;;
          2rep) run_bp "$m" "$epochs" "$tag" 1 2 0 "" --replicate-update ;;
          w2) # weak scaling: 2 ranks of the 1-rank batch each
            run_bp "$m" "$epochs" "$tag" 1 2 0 $((2 * $(model_batch "$m"))) ;;
          pair) # two independent 1-rank runs at once: what 2 cores give 2 jobs
            run_bp "$m" "$epochs" "$tag-b" 1 1 &
            run_bp "$m" "$epochs" "$tag" 1 1 && wait $! &&
              read -r _ vb _ _ _ < <(summary "$out/bp-$tag-b.jsonl") ;;
          *) run_bp "$m" "$epochs" "$tag" 1 "$kind" ;;
        esac && read -r _ v _ _ _ < <(summary "$out/bp-$tag.jsonl") &&
          { [ "$kind" != pair ] || v=$(awk -v a="$v" -v b="$vb" 'BEGIN{printf "%.0f", a + b}'); } &&
          r_all[$kind]+=" $v" || note="$kind: $(why "$out/bp-$tag.log")"
      done
    done
    for kind in 1 2 2rep w2 1t2 pair mpi2; do
      r_ips[$kind]=$(tr ' ' '\n' <<<"${r_all[$kind]:-}" | awk NF | sort -g |
        awk '{v[NR] = $1} END {print NR ? v[int((NR + 1) / 2)] : "n/a"}')
      [ -z "${r_all[$kind]:-}" ] || echo "# $name $kind: img/s per round:${r_all[$kind]}" >&2
    done
    # each kind over the 1-rank run of its own round: rounds a few minutes
    # apart see different machine speeds, runs of one round much the same
    declare -A r_ratio=()
    for kind in 2 2rep w2 mpi2 pair; do
      r_ratio[$kind]=n/a
      [ -n "${r_all[$kind]:-}" ] && [ -n "${r_all[1]:-}" ] || continue
      ratios=$(paste <(tr ' ' '\n' <<<"${r_all[$kind]}" | awk NF) \
        <(tr ' ' '\n' <<<"${r_all[1]}" | awk NF) | awk 'NF == 2 && $2 > 0 {printf "%.2f\n", $1 / $2}')
      r_ratio[$kind]=$(sort -g <<<"$ratios" | awk '{v[NR] = $1} END {print NR ? v[int((NR + 1) / 2)] "x" : "n/a"}')
      echo "# $name $kind / 1 rank, per round: $(tr '\n' ' ' <<<"$ratios")" >&2
    done
    rows+=("$name|$epochs|${r_ips[1]}|${r_ips[2]}|${r_ratio[2]}|${r_ratio[2rep]}|${r_ips[1t2]}|${r_ips[mpi2]}|${r_ratio[mpi2]}|${r_ratio[w2]}|${r_ratio[pair]}|$best_ips${best_t:+ (${best_t}t)}|$(fmt_ratio "${r_ips[2]}" "$best_ips")|$note")
    unset r_ips r_all r_ratio
  done
  printf '\n%-8s %6s | %11s %11s %7s %8s | %11s | %11s %7s | %7s %7s | %16s %12s\n' model \
    epochs "bp 1 rank" "bp 2 ranks" "2r/1r" "repl/1r" "bp 1r 2blas" "bp mpi -np2" "np2/1r" \
    "w2/1r" "pair/1r" "pt best img/s" "bp 2r / pt"
  for r in "${rows[@]}"; do
    IFS='|' read -r a b c d e x f g h i j k l m <<<"$r"
    printf '%-8s %6s | %11s %11s %7s %8s | %11s | %11s %7s | %7s %7s | %16s %12s' "$a" "$b" \
      "$c" "$d" "$e" "$x" "$f" "$g" "$h" "$i" "$j" "$k" "$l"
    [ -z "$m" ] && echo || echo "  ($m)"
  done
  echo "# training images/s, median over rounds; ratios: median over rounds of each round's" \
       "ratio to its own 1-rank run; PyTorch's best of 1 and 2 threads (threads in" \
       "parentheses); issue 5 target: 2r/1r >= 1.8x"
fi
