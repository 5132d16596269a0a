#!/usr/bin/env bash
# A blueprint that misbehaves on purpose, for the tests of ci/gpu-check.sh's
# FAIL and budget paths (GPU_CHECK_BLUEPRINT names it). It runs the real one,
# FAKE_BP_REAL, and FAKE_BP_FAULT chooses what goes wrong:
#   nan            a train run with step lines logs a non-finite loss at step 2
#   validate-skip  validate reports one more case, skipped for a device error
#   validate-none  validate reports no case at all
#   ranks          a train run with --ranks fails
#   hang           a train run never ends (the stage's cap stops it)
real=${FAKE_BP_REAL:?FAKE_BP_REAL: the real blueprint}
fault=${FAKE_BP_FAULT:-}
# arg_after FLAG ARGS...: the value after FLAG
arg_after() { local f=$1; shift; while [ $# -gt 1 ]; do [ "$1" = "$f" ] && { echo "$2"; return; }; shift; done; }

case "$fault:${1:-}" in
  hang:train) exec sleep 600 ;;
  ranks:train) [[ " $* " == *" --ranks "* ]] && { echo "blueprint train: rank 1 failed (injected)" >&2; exit 1; } ;;
  nan:train)
    "$real" "$@" || exit
    m=$(arg_after --metrics "$@")
    [[ " $* " == *" --log-every "* ]] && [ -n "$m" ] &&
      sed -i '0,/"global_step":2,/s/"train_loss":[^,}]*/"train_loss":null/' "$m"
    exit 0 ;;
  validate-*:validate)
    report=$(mktemp)
    "$real" "$@" > "$report" || exit
    python3 - "$report" "$fault" "$(arg_after --device "$@")" <<'PY'
import json, sys
d = json.load(open(sys.argv[1]))
if sys.argv[2] == "validate-none":
    d["results"] = []
else:
    d["results"].append({"op": "conv2d.fwd", "impl": "cudnn", "device": sys.argv[3], "case": "fake",
                         "reference": False, "verdict": "skip", "error": None, "tolerance": None,
                         "detail": "cudaErrorLaunchFailure: unspecified launch failure (injected)"})
print(json.dumps(d))
PY
    rc=$?; rm -f "$report"; exit $rc ;;
esac
exec "$real" "$@"
