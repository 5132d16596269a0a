#!/usr/bin/env bash
# Runs ci/gpu-check.sh and checks its exit status and summary.txt (a CTest
# test of the script, tests/CMakeLists.txt):
#   expect.sh OUTDIR STATUS PATTERN... -- ARGS...
# Each PATTERN is an extended regex that some line of summary.txt must
# match, or, after a leading '!', that no line may match.
set -uo pipefail
out=$1 want=$2
shift 2
patterns=()
while [ $# -gt 0 ] && [ "$1" != -- ]; do patterns+=("$1"); shift; done
shift
root=$(cd "$(dirname "$0")/../.." && pwd -P)
rm -rf "$out"
OUT=$out "$root/ci/gpu-check.sh" "$@"
rc=$?
bad=0
[ "$rc" = "$want" ] || { echo "expect: exit status $rc, want $want"; bad=1; }
for p in "${patterns[@]}"; do
  if [ "${p:0:1}" = '!' ]; then
    grep -Eq -- "${p:1}" "$out/summary.txt" && { echo "expect: a line matches '${p:1}'"; bad=1; }
  else
    grep -Eq -- "$p" "$out/summary.txt" || { echo "expect: no line matches '$p'"; bad=1; }
  fi
done
[ $bad = 0 ] && echo "expect: ok"
exit $bad
