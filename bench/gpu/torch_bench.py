#!/usr/bin/env python3
"""PyTorch side of the GPU bench (bench/gpu/README.md): the same model as
`blueprint train`, built from the same model file by bench/torch_twin.py's
Twin (same layers, order, channels, bias flags, BN settings, NHWC fc
flattening), the same batch and the same optimizer as the model's `train:`
block (SGD with momentum and coupled weight decay on conv and fc weights
only, as blueprint; AdamW likewise), timed on one CUDA GPU.

Modes (--mode, default both):
  eager    channels_last, torch.autocast FP16 + GradScaler under --amp
  compile  the same with the model under torch.compile (default options;
           the loss, backward, GradScaler and optimizer step stay eager)
PyTorch's best is the better of the two (bench/gpu/summary.py).

Data: every step copies a batch of random images (N(0, 1), FP32, NCHW in
channels_last) and uniform labels from pinned host memory to the GPU
(non_blocking), as blueprint's loader uploads each batch; 4 host batches
rotate so no copy is of the same bytes twice in a row. No images are
decoded: this is a speed bench (blueprint runs on --data synthetic or
Fashion-MNIST; the arithmetic is the same).

Timing: --warmup steps (compilation, cuDNN autotuning with
torch.backends.cudnn.benchmark) then --steps timed steps between two CUDA
events after a synchronize; images/s = batch * steps / elapsed.
Memory: torch.cuda.max_memory_allocated over the warm-up and timed steps,
after reset_peak_memory_stats (the model and optimizer state included).

FP32: TF32 on for convolutions and matmuls (PyTorch's default for cuDNN
convolutions; turned on for matmuls too) unless --no-tf32.

Prints one JSON object per mode on stdout:
  {"side":"torch","model":..,"mode":..,"batch":..,"amp":..,"images_per_second":..,
   "step_ms":..,"peak_bytes":..,"steps":..,"warmup":..,"torch":..,"device":..}
"""
import argparse
import json
import os
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))  # bench/: torch_twin

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

import torch_twin  # noqa: E402


def build_optimizer(model, train, lr_override=None):
    opt = str(train.get("optimizer", "sgd"))
    lr = float(lr_override if lr_override is not None else train.get("lr", 0.05))
    wd = float(train.get("weight_decay", 5e-4))
    groups = [{"params": model.conv_fc_weights, "weight_decay": wd},
              {"params": model.bias_like, "weight_decay": 0.0}]
    if opt == "sgd":
        return torch.optim.SGD(groups, lr=lr, momentum=float(train.get("momentum", 0.9)))
    if opt == "adamw":
        return torch.optim.AdamW(groups, lr=lr)
    sys.exit(f"torch_bench: optimizer '{opt}' is not benchmarked here (sgd, adamw)")


def run_mode(spec, args, mode):
    torch.manual_seed(args.seed)
    dev = torch.device("cuda")
    model = torch_twin.Twin(spec).to(dev).to(memory_format=torch.channels_last)
    train = spec.get("train", {}) or {}
    opt = build_optimizer(model, train)
    smoothing = model.label_smoothing
    inp = spec["input"]
    c, h, w = int(inp["channels"]), int(inp["height"]), int(inp["width"])
    classes = int(inp["classes"])
    b = args.batch
    host_x = [torch.randn(b, c, h, w).contiguous(memory_format=torch.channels_last).pin_memory()
              for _ in range(4)]
    host_y = [torch.randint(0, classes, (b,)).pin_memory() for _ in range(4)]
    scaler = torch.amp.GradScaler("cuda", enabled=args.amp)
    net = torch.compile(model) if mode == "compile" else model

    def step(x, y):
        opt.zero_grad(set_to_none=True)
        with torch.autocast(device_type="cuda", dtype=torch.float16, enabled=args.amp):
            logits = net(x)
            loss = F.cross_entropy(logits.float(), y, label_smoothing=smoothing)
        scaler.scale(loss).backward()
        scaler.step(opt)
        scaler.update()
        return loss

    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    t0 = time.perf_counter()
    for k in range(args.warmup):
        x = host_x[k % 4].to(dev, non_blocking=True, memory_format=torch.channels_last)
        y = host_y[k % 4].to(dev, non_blocking=True)
        step(x, y)
    torch.cuda.synchronize()
    warm_s = time.perf_counter() - t0
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for k in range(args.steps):
        x = host_x[k % 4].to(dev, non_blocking=True, memory_format=torch.channels_last)
        y = host_y[k % 4].to(dev, non_blocking=True)
        loss = step(x, y)
    end.record()
    torch.cuda.synchronize()
    ms = start.elapsed_time(end)
    out = {
        "side": "torch", "model": spec.get("name", "?"), "mode": mode, "batch": b,
        "amp": bool(args.amp), "tf32": not args.no_tf32,
        "images_per_second": b * args.steps / (ms / 1000.0),
        "step_ms": ms / args.steps, "peak_bytes": torch.cuda.max_memory_allocated(),
        "steps": args.steps, "warmup": args.warmup, "warmup_seconds": warm_s,
        "last_loss": float(loss.detach().float().item()),
        "torch": torch.__version__, "device": torch.cuda.get_device_name(0),
    }
    del model, net, opt
    torch.cuda.empty_cache()
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("model", help="a model file (models/NAME.yaml) or a shipped model's name")
    ap.add_argument("--batch", type=torch_twin.positive, default=None,
                    help="training batch (default: the model file's)")
    ap.add_argument("--amp", action="store_true", help="FP16 autocast with GradScaler")
    ap.add_argument("--no-tf32", action="store_true", help="FP32 without TF32")
    ap.add_argument("--mode", choices=("eager", "compile", "both"), default="both")
    ap.add_argument("--steps", type=torch_twin.positive, default=50)
    ap.add_argument("--warmup", type=torch_twin.positive, default=10)
    ap.add_argument("--seed", type=int, default=1)
    args = ap.parse_args()
    if not torch.cuda.is_available():
        print(json.dumps({"side": "torch", "skipped": "no CUDA device visible to PyTorch"}))
        return 0
    with open(torch_twin.resolve_model(args.model)) as f:
        import yaml
        spec = yaml.safe_load(f)
    if args.batch is None:
        args.batch = int((spec.get("train") or {}).get("batch", 128))
    torch.backends.cudnn.benchmark = True
    torch.backends.cudnn.allow_tf32 = not args.no_tf32
    torch.backends.cuda.matmul.allow_tf32 = not args.no_tf32
    modes = ("eager", "compile") if args.mode == "both" else (args.mode,)
    for mode in modes:
        try:
            print(json.dumps(run_mode(spec, args, mode)), flush=True)
        except Exception as e:  # a failed compile must not hide the eager figure
            print(json.dumps({"side": "torch", "model": spec.get("name", "?"), "mode": mode,
                              "batch": args.batch, "amp": bool(args.amp),
                              "error": f"{type(e).__name__}: {str(e)[:300]}"}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
