#!/usr/bin/python3
"""ONNX import, checked against PyTorch (docs/onnx.md).

For each model, the PyTorch twin (bench/torch_twin.py --export-onnx)
writes its initial network with torch.onnx (BatchNormalization kept, fc as
Flatten + Gemm) and trains it one epoch; `blueprint train` trains the ONNX
file from the same initial weights, the same data order and recipe. Then:
  1. the running training loss of each of the first STEPS steps agrees
     within a relative LOSS_TOL (the first step sees the same weights and
     batch: it differs only by float summation order);
  2. the test accuracy after the epoch is within ACC_POINTS points.
Prints one line of figures per model. Exit 77 (skipped, with the reason)
where torch (python3-torch) or its ONNX exporter is missing; 1 on a
disagreement.

usage: import_torch.py BLUEPRINT REPO_DIR WORKDIR [--train-limit N] [model ...]
"""
import json
import os
import subprocess
import sys

STEPS = 10
# The first step sees the same weights and batch: its loss differs only by
# float summation order (about 1e-7). The steps after it amplify that
# difference where training is unstable: the cnn's loss at lr 0.05 climbs
# from 3.2 to 14.8 in its first 6 steps in both frameworks, and its full
# epoch measured a largest relative difference of 1.05e-3 by step 10
# (docs/onnx.md). Hence 2e-3 over the first 10 steps.
LOSS_TOL = 2e-3
ACC_POINTS = 1.0


def skip(why):
    print(f"SKIP: {why}")
    sys.exit(77)


try:
    import torch  # noqa: F401  (the twin imports it; checked here to skip cleanly)
    import torch.onnx  # noqa: F401
except ImportError as e:
    skip(f"PyTorch missing ({e}): apt-get install python3-torch to compare ONNX import with it")


def run(cmd):
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode != 0:
        sys.exit(f"FAIL: {' '.join(cmd)} exited {r.returncode}: {r.stderr.strip()[-2000:]}")
    return r.stdout


def lines(text):
    return [json.loads(x) for x in text.splitlines() if x.startswith("{")]


def check(blueprint, repo, work, model, limit):
    onnx_path = os.path.join(work, f"{model}_torch.onnx")
    metrics = os.path.join(work, f"{model}_torch.jsonl")
    if os.path.exists(metrics):
        os.remove(metrics)
    common = ["--epochs", "1", "--seed", "1"] + (["--train-limit", str(limit)] if limit else [])
    twin = lines(run([sys.executable, os.path.join(repo, "bench", "torch_twin.py"), "--model",
                      os.path.join(repo, "models", model + ".yaml"), "--export-onnx", onnx_path,
                      "--log-steps", str(STEPS), "--json"] + common))
    run([blueprint, "train", onnx_path, "--metrics", metrics, "--log-every", "1", "--quiet"] +
        common)
    with open(metrics) as f:
        bp = lines(f.read())
    t_steps = [x for x in twin if x["event"] == "step"][:STEPS]
    b_steps = {x["global_step"]: x for x in bp if x["event"] == "step"}
    worst, per_step = 0.0, []
    for t in t_steps:
        b = b_steps[t["global_step"]]
        rel = abs(b["train_loss"] - t["train_loss"]) / max(abs(t["train_loss"]), 1e-6)
        per_step.append(f"{rel:.1e}")
        worst = max(worst, rel)
    t_acc = 100 * [x for x in twin if x["event"] == "epoch"][-1]["test_accuracy"]
    b_acc = 100 * [x for x in bp if x["event"] == "epoch"][-1]["test_accuracy"]
    first = f"{b_steps[1]['train_loss']:.6f} vs {t_steps[0]['train_loss']:.6f}"
    print(f"{model}: first step loss {first}; max relative loss difference over the first "
          f"{len(t_steps)} steps {worst:.2e} (tolerance {LOSS_TOL:g}); test accuracy after the "
          f"epoch: blueprint {b_acc:.2f}%, PyTorch {t_acc:.2f}% (tolerance {ACC_POINTS:g} point); "
          f"relative difference per step: {' '.join(per_step)}", flush=True)
    return len(t_steps) == STEPS and worst <= LOSS_TOL and abs(b_acc - t_acc) <= ACC_POINTS


def main():
    args = sys.argv[1:]
    limit = 0
    if "--train-limit" in args:
        i = args.index("--train-limit")
        limit = int(args[i + 1])
        del args[i:i + 2]
    if len(args) < 3:
        sys.exit(__doc__)
    blueprint, repo, work = args[:3]
    models = args[3:] or ["mlp", "cnn", "resnet8"]
    os.makedirs(work, exist_ok=True)
    failed = [m for m in models if not check(blueprint, repo, work, m, limit)]
    if failed:
        sys.exit(f"FAIL: {', '.join(failed)} disagree")
    print("PASS")


if __name__ == "__main__":
    main()
