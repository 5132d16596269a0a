#!/usr/bin/python3
"""ONNX export, checked against the outside world (docs/onnx.md).

For each model: train it briefly (a checkpoint), `blueprint export` it,
then
  1. ONNX's checker accepts the file (full_check: shapes inferred);
  2. ONNX Runtime's logits on the Fashion-MNIST test images, normalized as
     the file's metadata says, against `blueprint predict --json --top 10`
     (one image at a time): the same top-1 class for every image, and the
     log-probabilities (the logits less their log-sum-exp, which is what
     predict prints as probabilities with 6 significant digits) within
     TOL of each other;
  3. the round trip: `blueprint eval` of the ONNX file (its initializers)
     gives the checkpoint's test accuracy to the printed digit.
Prints one line of figures per model. Exit 77 (skipped, with the reason)
where onnx or onnxruntime is missing; 1 on a disagreement.

The vit trains on 1,280 images and is compared on the first 500 test
images (VIT_IMAGES; BP_ONNX_VIT_IMAGES=10000 compares all): its
one-image-at-a-time predict is slow on a small machine; the others train
on 3,000 and use all 10,000.

usage: export_agreement.py BLUEPRINT MODELS_DIR WORKDIR [model ...]
"""
import gzip
import json
import math
import os
import re
import struct
import subprocess
import sys

TOL = 1e-3  # |log p_blueprint - log p_ort| per class, where p > 1e-30
DATA = os.environ.get("BP_ONNX_DATA", "/usr/share/datasets/fashion-mnist")
VIT_IMAGES = int(os.environ.get("BP_ONNX_VIT_IMAGES", "500"))  # 10000: all
# model: (training images, test images compared; None = all 10,000)
LIMITS = {"vit": (1280, VIT_IMAGES)}  # and vit_* variants


def skip(why):
    print(f"SKIP: {why}")
    sys.exit(77)


try:
    import numpy as np
    import onnx
except ImportError as e:
    skip(f"python3-onnx / numpy missing ({e}): apt-get install python3-onnx")
try:
    import onnxruntime as ort
except ImportError:
    skip("onnxruntime missing: ci/install-deps.sh installs it into .venv (pip install onnxruntime);"
         " run this test with that venv's python")


def read_images(path):
    with gzip.open(path) if path.endswith(".gz") else open(path, "rb") as f:
        magic, n, h, w = struct.unpack(">IIII", f.read(16))
        assert magic == 2051, path
        return np.frombuffer(f.read(n * h * w), np.uint8).reshape(n, 1, h, w)


def test_images():
    for name in ("t10k-images-idx3-ubyte.gz", "t10k-images-idx3-ubyte"):
        p = os.path.join(DATA, name)
        if os.path.exists(p):
            return p
    skip(f"no Fashion-MNIST test images in {DATA} (apt-get install dataset-fashion-mnist)")


def run(cmd):
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode != 0:
        sys.exit(f"FAIL: {' '.join(cmd)} exited {r.returncode}: {r.stderr.strip()}")
    return r.stdout


def accuracy(out):
    m = re.search(r"test accuracy ([0-9.]+)%", out)
    if not m:
        sys.exit(f"FAIL: no test accuracy in: {out}")
    return float(m.group(1))


def check(blueprint, models_dir, work, model):
    yaml = os.path.join(models_dir, model + ".yaml")
    ckpt = os.path.join(work, model + ".ckpt")
    path = os.path.join(work, model + ".onnx")
    train_limit, test_limit = LIMITS.get(model.split("_")[0], (3000, None))
    limit = ["--test-limit", str(test_limit)] if test_limit else []
    run([blueprint, "train", yaml, "--epochs", "1", "--train-limit", str(train_limit), "--quiet",
         "--checkpoint", ckpt] + limit)
    run([blueprint, "export", yaml, "--checkpoint", ckpt, "-o", path])

    m = onnx.load(path)
    onnx.checker.check_model(m, full_check=True)
    meta = {p.key: p.value for p in m.metadata_props}
    mean = np.array([float(v) for v in meta["input_mean"].split(",")], np.float32)
    std = np.array([float(v) for v in meta["input_std"].split(",")], np.float32)

    images_path = test_images()
    x = read_images(images_path)[:test_limit].astype(np.float32) / np.float32(255)
    x = (x - mean.reshape(1, -1, 1, 1)) / std.reshape(1, -1, 1, 1)
    sess = ort.InferenceSession(path, providers=["CPUExecutionProvider"])
    logits = np.concatenate([sess.run(["logits"], {"input": x[i:i + 500]})[0]
                             for i in range(0, len(x), 500)])
    lse = np.log(np.exp(logits - logits.max(1, keepdims=True)).sum(1)) + logits.max(1)
    ort_logp = logits - lse[:, None]

    pred = json.loads(run([blueprint, "predict", yaml, "--checkpoint", ckpt, "--input",
                           images_path, "--top", "10", "--json"]
                          + (["--limit", str(test_limit)] if test_limit else [])))
    n = len(pred["predictions"])
    agree, worst = 0, 0.0
    for i, p in enumerate(pred["predictions"]):
        top = p["top"]
        agree += top[0]["class"] == int(np.argmax(logits[i]))
        for t in top:
            if t["probability"] > 1e-30:
                worst = max(worst, abs(math.log(t["probability"]) - float(ort_logp[i, t["class"]])))

    acc_ckpt = accuracy(run([blueprint, "eval", yaml, "--checkpoint", ckpt, "--quiet"] + limit))
    acc_onnx = accuracy(run([blueprint, "eval", path, "--quiet"] + limit))
    acc_ort = 100.0 * float(np.mean(np.argmax(logits, 1) == read_labels()[:len(x)]))
    print(f"{model}: checker ok; top-1 agreement {agree}/{n}; max |log p diff| {worst:.2e} "
          f"(tolerance {TOL:g}); test accuracy: checkpoint {acc_ckpt:.2f}%, ONNX file in "
          f"blueprint {acc_onnx:.2f}%, ONNX Runtime {acc_ort:.2f}%")
    ok = agree == n == len(x) and worst <= TOL and acc_ckpt == acc_onnx and abs(acc_ort - acc_ckpt) < 0.015
    return ok


def read_labels():
    for name in ("t10k-labels-idx1-ubyte.gz", "t10k-labels-idx1-ubyte"):
        p = os.path.join(DATA, name)
        if os.path.exists(p):
            with gzip.open(p) if p.endswith(".gz") else open(p, "rb") as f:
                f.read(8)
                return np.frombuffer(f.read(), np.uint8)
    skip("no Fashion-MNIST test labels")


def main():
    if len(sys.argv) < 4:
        sys.exit(__doc__)
    blueprint, models_dir, work = sys.argv[1:4]
    models = sys.argv[4:] or ["mlp", "cnn", "resnet8", "vit"]
    os.makedirs(work, exist_ok=True)
    failed = [m for m in models if not check(blueprint, models_dir, work, m)]
    if failed:
        sys.exit(f"FAIL: {', '.join(failed)} disagree")
    print("PASS")


if __name__ == "__main__":
    main()
