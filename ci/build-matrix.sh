#!/usr/bin/env bash
# Builds every compiler and build type a user may pick, warnings as errors
# (the project's flags), each from scratch in its own directory, and prints
# one line per combination: PASS or FAIL, seconds, and a failure's first
# error line. A tool to run by hand before a release, not part of CI (six
# full builds: about 12 minutes on two cores).
#
#   ci/build-matrix.sh [--keep] [COMBO...]
#
# COMBO is COMPILER-TYPE (gcc-Release, clang-Debug, ...; default: all six of
# gcc and clang x Release, Debug, RelWithDebInfo). Directories:
# build-matrix/COMBO/ (ignored by git), each with its build.log. --keep
# builds into an existing directory instead of starting afresh. The build
# keeps going past a failure (ninja -k 0), so a log lists every error.
#   JOBS=N   parallel build jobs (default 2)
set -uo pipefail
cd "$(dirname "$0")/.."
keep=0
combos=()
for a in "$@"; do
  case "$a" in
    --keep) keep=1 ;;
    -h|--help) sed -n '2,16p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    gcc-*|clang-*) combos+=("$a") ;;
    *) echo "build-matrix: unknown argument '$a' (try --help)" >&2; exit 2 ;;
  esac
done
[ ${#combos[@]} -gt 0 ] ||
  combos=(gcc-Release gcc-Debug gcc-RelWithDebInfo clang-Release clang-Debug clang-RelWithDebInfo)
fails=0
for combo in "${combos[@]}"; do
  cc=${combo%%-*} type=${combo#*-}
  case "$type" in Release|Debug|RelWithDebInfo) ;; *)
    echo "build-matrix: unknown build type in '$combo'" >&2; exit 2 ;;
  esac
  dir=build-matrix/$combo
  [ "$keep" = 1 ] || rm -rf "$dir"
  mkdir -p "$dir"
  start=$(date +%s)
  { cmake -S . -B "$dir" -G Ninja -DCMAKE_BUILD_TYPE="$type" -DCMAKE_C_COMPILER="$cc" &&
    cmake --build "$dir" -j "${JOBS:-2}" -- -k 0; } > "$dir/build.log" 2>&1
  rc=$?
  secs=$(( $(date +%s) - start ))
  if [ "$rc" = 0 ]; then
    printf '%-22s PASS %5d s\n' "$combo" "$secs"
  else
    fails=$((fails + 1))
    first=$( (grep -m1 'error:' "$dir/build.log" || grep -m1 -E 'CMake Error|FAILED' "$dir/build.log" ||
      echo "exit $rc") | sed "s|$PWD/||g")
    printf '%-22s FAIL %5d s  %s\n' "$combo" "$secs" "$first"
  fi
done
[ "$fails" = 0 ]
