#!/usr/bin/env bash
# Fuzzing: builds the libFuzzer targets of fuzz/ with clang, AddressSanitizer
# and UndefinedBehaviorSanitizer (in build-fuzz/), then runs each for a
# bounded time over a copy of its seed corpus (fuzz/corpus/<target>/), as
# many targets at a time as there are cores.
#   ci/fuzz.sh [SECONDS]   seconds per target (default 45; BP_FUZZ_SECONDS too)
# A crash, leak, hang (over 10 s on one input) or UB report fails the run;
# libFuzzer leaves the input in build-fuzz/findings/<target>/: add it to
# fuzz/corpus/<target>/ with the fix, and tests/test_fuzz_corpus.c replays it
# in every normal build. The summary line per target feeds docs/reliability.md.
set -euo pipefail
cd "$(dirname "$0")/.."
seconds=${1:-${BP_FUZZ_SECONDS:-45}}
dir=build-fuzz
cmake -S . -B "$dir" -G Ninja -DCMAKE_C_COMPILER=clang -DCMAKE_BUILD_TYPE=Debug \
  -DBP_FUZZ=ON -DBP_SANITIZE=ON -DBP_BUILD_TESTS=OFF -DBP_WITH_CUDA=OFF -DBP_WITH_DNNL=OFF \
  -DBP_WITH_ONEDNN=OFF -DBP_WITH_XNNPACK=OFF -DBP_WITH_MPI=OFF >/dev/null
targets=(model idx elf cli checkpoint onnx)
cmake --build "$dir" -j "$(nproc)" --target "${targets[@]/#/fuzz_}"
export ASAN_OPTIONS=detect_leaks=1:abort_on_error=1
export UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1
# one target: its log in build-fuzz/fuzz_<target>.log, its exit status in
# build-fuzz/fuzz_<target>.status (so that `wait -n` never sees a failure)
fuzz_one() {
  local t=$1 rc=0
  local work="$dir/corpus/$t" findings="$dir/findings/$t" log="$dir/fuzz_$t.log"
  rm -rf "$work" && mkdir -p "$work" "$findings"
  cp fuzz/corpus/"$t"/* "$work"/
  "$dir/fuzz/fuzz_$t" -max_total_time="$seconds" -timeout=10 -rss_limit_mb=2048 -max_len=65536 \
    -close_fd_mask=3 -artifact_prefix="$findings/" -print_final_stats=1 "$work" >"$log" 2>&1 ||
    rc=$?
  echo "$rc" >"$dir/fuzz_$t.status"
}
# one target per core (BP_FUZZ_JOBS overrides): each still gets its SECONDS
# of a whole core, the run takes ceil(targets / cores) * SECONDS
jobs=${BP_FUZZ_JOBS:-$(nproc)}
running=0
for t in "${targets[@]}"; do
  rm -f "$dir/fuzz_$t.status"
  if ((running >= jobs)); then
    wait -n
    running=$((running - 1))
  fi
  fuzz_one "$t" &
  running=$((running + 1))
done
wait
status=0
for t in "${targets[@]}"; do
  log="$dir/fuzz_$t.log" findings="$dir/findings/$t"
  if [ "$(cat "$dir/fuzz_$t.status" 2>/dev/null)" = 0 ]; then
    result=clean
  else
    result=FAILED
    status=1
    tail -n 40 "$log"
  fi
  runs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -n 1)
  echo "fuzz_$t: $result, ${runs:-?} inputs in ${seconds} s, findings in $findings"
done
exit $status
