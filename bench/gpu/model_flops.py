#!/usr/bin/env python3
"""FLOPs of one training image of a blueprint model file (models/README.md).

Counts the multiply-accumulates (MACs) of every conv and fc layer from the
layer list and the input shape, as the shapes rule of models/README.md
gives them:
    conv  OH * OW * filters * kh * kw * (C / groups)
    fc    H * W * C * units
Training FLOPs per image = 2 * MACs (a MAC is two FLOPs) * 3 (forward,
backward-data and backward-filter each cost one forward's MACs). The first
layer's backward-data is counted too (the usual MFU convention), and
batch norm, ReLU, pooling, add, the loss and the update are left out: they
are a few percent of the arithmetic and none of it runs on Tensor Cores.

Usage: model_flops.py MODEL.yaml [...]   prints MACs and training FLOPs per image.
"""
import sys

import yaml


def _pair(v):
    if isinstance(v, list):
        return int(v[0]), int(v[1])
    return int(v), int(v)


def forward_macs(spec):
    """MACs of one image's forward pass, and a per-layer list (name, macs)."""
    inp = spec["input"]
    shape = {"input": (int(inp["height"]), int(inp["width"]), int(inp["channels"]))}
    prev, total, rows = "input", 0, []
    for idx, layer in enumerate(spec["layers"]):
        t = layer["type"]
        name = layer.get("name", f"{t}{idx}")
        src = layer["inputs"][0] if t == "add" else layer.get("input", prev)
        h, w, c = shape[src]
        macs = 0
        if t == "conv":
            kh, kw = _pair(layer["kernel"])
            s, p = int(layer.get("stride", 1)), int(layer.get("pad", 0))
            d, g = int(layer.get("dilation", 1)), int(layer.get("groups", 1))
            f = int(layer["filters"])
            h = (h + 2 * p - d * (kh - 1) - 1) // s + 1
            w = (w + 2 * p - d * (kw - 1) - 1) // s + 1
            macs = h * w * f * kh * kw * (c // g)
            c = f
        elif t in ("maxpool", "avgpool"):
            kh, kw = _pair(layer["kernel"])
            st = layer.get("stride")
            sh, sw = (kh, kw) if st is None else _pair(st)
            p = int(layer.get("pad", 0))
            h = (h + 2 * p - kh) // sh + 1
            w = (w + 2 * p - kw) // sw + 1
        elif t == "global_avgpool":
            h = w = 1
        elif t == "fc":
            u = int(layer["units"])
            macs = h * w * c * u
            h, w, c = 1, 1, u
        shape[name] = (h, w, c)
        prev = name
        total += macs
        if macs:
            rows.append((name, macs))
    return total, rows


def train_flops_per_image(spec):
    macs, _ = forward_macs(spec)
    return 2 * 3 * macs


def load(path):
    with open(path) as f:
        return yaml.safe_load(f)


if __name__ == "__main__":
    if len(sys.argv) < 2:
        sys.exit(__doc__.strip().splitlines()[-1])
    for path in sys.argv[1:]:
        spec = load(path)
        macs, _ = forward_macs(spec)
        print(f"{spec.get('name', path)}: {macs / 1e9:.4f} GMACs forward per image, "
              f"{train_flops_per_image(spec) / 1e9:.3f} GFLOPs per training image")
