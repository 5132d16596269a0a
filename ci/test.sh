#!/usr/bin/env bash
# Configures, builds and runs every test.
#   ci/test.sh            gcc, optimized with debug info, in build/
#   ci/test.sh sanitize   clang, AddressSanitizer + UndefinedBehaviorSanitizer, in build-sanitize/
set -euo pipefail
cd "$(dirname "$0")/.."
mode=${1:-normal}
case "$mode" in
  normal) dir=build; args=() ;;
  sanitize)
    dir=build-sanitize
    args=(-DBP_SANITIZE=ON -DCMAKE_BUILD_TYPE=Debug -DCMAKE_C_COMPILER=clang)
    export ASAN_OPTIONS=detect_leaks=1:abort_on_error=1
    export UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1
    ;;
  *) echo "ci/test.sh: unknown mode '$mode' (normal or sanitize)" >&2; exit 2 ;;
esac
cmake -S . -B "$dir" -G Ninja "${args[@]}"
cmake --build "$dir" -j "$(nproc)"
ctest --test-dir "$dir" -j "$(nproc)" --output-on-failure
