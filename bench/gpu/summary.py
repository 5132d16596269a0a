#!/usr/bin/env python3
"""The GPU bench's table (bench/gpu/README.md), from what bench/gpu/run.sh
wrote in DIR: rows.txt, bp-ROW.jsonl, arena-ROW.txt, torch.jsonl.

    summary.py DIR      prints a Markdown table and notes on stdout

Per row: blueprint's images/s over the timed steps (the step lines of
--log-every WARM: samples and seconds between the first line, after the
warm-up, and the last), PyTorch eager and torch.compile images/s, the
ratio of blueprint to PyTorch's best, the target, MFU of both sides, the
arena bytes (`blueprint plan --json`) against PyTorch's peak allocated
memory, and blueprint's graph launches and host syncs per step (its epoch
line, warm-up steps included).

MFU = images/s * training FLOPs per image (bench/gpu/model_flops.py: conv
and fc MACs x 2 x 3) / the peak of the unit the precision runs on. Peaks:
NVIDIA H200 (SXM) datasheet, dense (the datasheet's Tensor Core figures are
with 2:4 sparsity; dense is half): FP16/BF16 Tensor Core 989.5 TFLOP/s
(AMP rows), TF32 Tensor Core 494.5 TFLOP/s (FP32 rows: both sides allow
TF32 by default), FP32 without Tensor Cores 67 TFLOP/s (also shown for FP32
rows). On another GPU the percentages are still against the H200's peaks.
"""
import json
import math
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, HERE)

import model_flops  # noqa: E402

PEAK = {"amp": 989.5e12, "tf32": 494.5e12, "fp32": 67e12}
TARGET = {"cnn": 2.0, "vgg16bn": 1.25, "resnet18": 1.25}


def read_jsonl(path):
    rows = []
    if not os.path.exists(path):
        return rows
    with open(path) as f:
        for line in f:
            line = line.strip()
            if line.startswith("{"):
                try:
                    rows.append(json.loads(line))
                except json.JSONDecodeError:
                    pass
    return rows


def blueprint_rate(lines):
    """(images/s over the timed steps, epoch line or None, why when no rate)."""
    steps = [x for x in lines if x.get("event") == "step"]
    epoch = next((x for x in lines if x.get("event") == "epoch"), None)
    if len(steps) < 2:
        return None, epoch, "fewer than two step lines"
    a, b = steps[0], steps[-1]
    ds, dt = b["samples"] - a["samples"], b["seconds"] - a["seconds"]
    if ds <= 0 or dt <= 0:
        return None, epoch, "no time between the step lines"
    return ds / dt, epoch, ""


def fmt(x, spec=",.0f", suffix=""):
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return "—"
    return format(x, spec) + suffix


def main():
    if len(sys.argv) != 2:
        sys.exit("usage: summary.py DIR")
    d = sys.argv[1]
    torch_rows = read_jsonl(os.path.join(d, "torch.jsonl"))
    device = next((t["device"] for t in torch_rows if "device" in t), "unknown GPU")
    torch_version = next((t["torch"] for t in torch_rows if "torch" in t), "?")
    print(f"GPU bench on {device} (PyTorch {torch_version})\n")
    print("| model | batch | precision | blueprint img/s | PyTorch eager | PyTorch compile | ratio to best"
          " | target | MFU blueprint | MFU PyTorch best | arena MiB | PyTorch peak MiB"
          " | launches/step | syncs/step |")
    print("| --- | ---: | --- | ---: | ---: | ---: | ---: | --- | ---: | ---: | ---: | ---: | ---: | ---: |")
    notes = []
    for t in torch_rows:
        if "skipped" in t:
            notes.append(f"PyTorch skipped: {t['skipped']}")
            break
    rows_path = os.path.join(d, "rows.txt")
    rows = [ln.split() for ln in open(rows_path)] if os.path.exists(rows_path) else []
    for row, model, batch, prec, _warm, _timed in rows:
        batch, amp = int(batch), prec == "amp"
        flops = model_flops.train_flops_per_image(model_flops.load(os.path.join(REPO, "models",
                                                                                  model + ".yaml")))
        peak = PEAK["amp"] if amp else PEAK["tf32"]
        bp_ips, epoch, why = blueprint_rate(read_jsonl(os.path.join(d, f"bp-{row}.jsonl")))
        if why:
            notes.append(f"{row}: no blueprint rate ({why}; see bp-{row}.log)")
        mine = [t for t in torch_rows if t.get("model") == model and t.get("batch") == batch
                and bool(t.get("amp")) == amp]
        got = {t["mode"]: t for t in mine if "images_per_second" in t}
        for t in mine:
            if "error" in t:
                notes.append(f"{row}: PyTorch {t['mode']} failed: {t['error']}")
        best = max(got.values(), key=lambda t: t["images_per_second"], default=None)
        ratio = bp_ips / best["images_per_second"] if bp_ips and best else None
        arena = None
        try:
            with open(os.path.join(d, f"arena-{row}.txt")) as f:
                arena = int(f.read().strip())
        except (OSError, ValueError):
            notes.append(f"{row}: no arena bytes (arena-{row}.err)")
        target = TARGET.get(model)
        ok = ""
        if ratio is not None and target is not None:
            ok = " met" if ratio >= target else " missed"
        mfu_bp = bp_ips * flops / peak if bp_ips else None
        mfu_t = best["images_per_second"] * flops / peak if best else None
        launches = epoch.get("graph_launches_per_step") if epoch else None
        syncs = epoch.get("syncs_per_step") if epoch else None
        print(f"| {model} | {batch} | {'AMP' if amp else 'FP32'} | {fmt(bp_ips)} "
              f"| {fmt(got.get('eager', {}).get('images_per_second'))} "
              f"| {fmt(got.get('compile', {}).get('images_per_second'))} "
              f"| {fmt(ratio, '.2f', 'x')} | ≥ {target}x{ok} "
              f"| {fmt(mfu_bp and 100 * mfu_bp, '.2f', '%')} | {fmt(mfu_t and 100 * mfu_t, '.2f', '%')} "
              f"| {fmt(arena and arena / 2**20, ',.0f')} "
              f"| {fmt(best and best['peak_bytes'] / 2**20, ',.0f')} "
              f"| {fmt(launches, '.2f')} | {fmt(syncs, '.2f')} |")
        if not amp and bp_ips:
            notes.append(f"{row}: against plain FP32 (67 TFLOP/s) blueprint's MFU is "
                         f"{100 * bp_ips * flops / PEAK['fp32']:.1f}%")
    print()
    print("FLOPs per training image: conv and fc MACs x 2 x 3 (bench/gpu/model_flops.py). "
          "Peaks (NVIDIA H200 SXM datasheet, dense): AMP rows FP16 Tensor Core 989.5 TFLOP/s, "
          "FP32 rows TF32 Tensor Core 494.5 TFLOP/s. blueprint img/s: timed steps after the "
          "warm-up (step lines); PyTorch: CUDA events over the timed steps; launches and syncs "
          "per step: blueprint's epoch line (warm-up included).")
    for n in notes:
        print(f"- {n}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
