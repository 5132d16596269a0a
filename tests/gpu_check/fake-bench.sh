#!/usr/bin/env bash
# A fake bench/gpu/run.sh for ci/gpu-check.sh --rehearse: one row's files
# and the table. FAKE_BENCH_RC: its exit status (0).
while [ $# -gt 0 ]; do [ "$1" = --out ] && out=$2; shift; done
mkdir -p "$out"
echo "cnn-128-fp32 cnn 128 fp32 5 15" > "$out/rows.txt"
echo '{"event":"epoch","images_per_second":1}' > "$out/bp-cnn-128-fp32.jsonl"
printf '| row | img/s |\n| --- | --- |\n| cnn-128-fp32 (fake) | 1 |\n' > "$out/summary.md"
[ "${FAKE_BENCH_RC:-0}" = 0 ] || echo "cnn-128-fp32: torch side failed (fake)"
exit "${FAKE_BENCH_RC:-0}"
