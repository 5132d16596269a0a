#!/usr/bin/python3
"""PyTorch twin of a blueprint training recipe (issue 4, "Evidence against
the outside world").

Reads the same model file (models/*.yaml, format: models/README.md) and
trains the same network with the same recipe, so that test accuracy and
images/s can be compared side by side with `blueprint train`:

  model    layers, order, channels, bias flags, BN eps/momentum (defaults
           1e-5 / 0.1 as core/src/model.c), max/avg pool, add, fc (which
           flattens H*W*C in NHWC order, as blueprint does); the ViT's
           layernorm (over the channels of each position), gelu / gelu_tanh,
           pos_embed (a learned [H, W, C] added to every sample) and
           attention (hand-written: [q | k | v] channels, heads over
           contiguous channel groups, tokens t = h*W + w; models/vit.yaml)
  init     the same scheme, not the same numbers (core/src/compile.c,
           core/src/init.c): Kaiming normal, fan_in, gain sqrt(2), for every
           conv and fc weight (the last fc and the ViT's 1x1 convs included);
           zero biases; BN and layernorm weight 1, bias 0; pos_embed
           normal(0, 0.02)
  data     Fashion-MNIST from the Debian package (gzip IDX, read here with
           gzip + struct), pixel p -> (float32(p) / 255 - 0.2860) / 0.3530 in
           float32 (data/include/blueprint/data.h; another --data set: its
           training set's own mean and std, as bp_dataset_stats), the same
           per-epoch permutation bit for bit (bp_data_permutation: Fisher-Yates
           driven by the counter-based SplitMix64 stream keyed by (seed, epoch),
           epochs from 0, see data/src/data_batch.c), the same batches in the
           same order, the last partial batch kept (no drop_last); the first
           --train-limit / --test-limit images; --crop-pad / --flip with the
           same per-sample draws (bp_data_augment_params)
  optim    SGD, momentum, coupled weight decay as PyTorch's SGD
           (abi/bp_abi_ops.h range.sgd) applied only to conv and fc weights:
           blueprint updates bias-like parameters (biases, BN weight and bias)
           as a span without decay (core/src/region.c); `--decay-all` decays
           everything instead; --nesterov; AdamW with PyTorch's defaults,
           decoupled decay w -= lr*wd*w on the same conv and fc weights only
           (layernorm gain and bias and pos_embed undecayed, as bias-like)
  schedule the learning rate of every step as bp_schedule_lr
           (trainer/src/schedule.c): constant, step, cosine, linear warmup;
           from the model file's train: schedule / warmup_epochs, the
           options overriding them as blueprint's do
  loss     mean softmax cross-entropy over the batch (grad_scale = 1/batch,
           the last partial batch by its own size), label smoothing as the
           model file says
  eval     the test images in batches of eval_batch, BN in eval mode

The options are blueprint train's (cli/train_args.c) where they exist.
--peak-memory trains nothing and prints PyTorch's peak allocated memory
over one training step instead (peak_step_memory).
Run with Debian's python3 (/usr/bin/python3), where python3-torch lives.
One JSON object per epoch with --json (see bench/README.md).
"""
import argparse
import gzip
import json
import math
import os
import struct
import sys
import time


def _thread_env(argv):
    """--threads T governs every pool, so it is set before torch (and with it
    libgomp and OpenBLAS) is loaded: OMP_NUM_THREADS=T for torch's OpenMP
    and oneDNN, OPENBLAS_NUM_THREADS=T for the GEMMs of fc layers (Debian's
    torch calls OpenBLAS, whose pthread pool torch.set_num_threads does not
    size), and OMP_WAIT_POLICY=PASSIVE unless set, so OpenMP threads do not
    spin while OpenBLAS threads work: with T=2 on 2 cores, spinning OpenMP
    threads halved the MLP's images/s."""
    threads = None
    for k, a in enumerate(argv):
        if a == "--threads" and k + 1 < len(argv):
            threads = argv[k + 1]
        elif a.startswith("--threads="):
            threads = a.split("=", 1)[1]
    if threads is None:
        threads = str(os.cpu_count() or 1)
    if threads.isdigit() and int(threads) > 0:
        os.environ["OMP_NUM_THREADS"] = threads
        os.environ["OPENBLAS_NUM_THREADS"] = threads
        os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")


if __name__ == "__main__":
    _thread_env(sys.argv[1:])

import numpy as np  # noqa: E402
import torch  # noqa: E402
import torch.nn as nn  # noqa: E402
import torch.nn.functional as F  # noqa: E402
import yaml  # noqa: E402

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DEFAULT_DATA = "/usr/share/datasets/fashion-mnist"
FASHION_MNIST_MEAN = np.float32(0.2860)  # BP_FASHION_MNIST_MEAN
FASHION_MNIST_STD = np.float32(0.3530)   # BP_FASHION_MNIST_STD

# ---- the permutation: data/src/data_batch.c, bit for bit -------------------

M64 = (1 << 64) - 1
GOLDEN = 0x9E3779B97F4A7C15
DOMAIN_PERMUTATION = 1


def mix64(z):
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & M64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & M64
    return z ^ (z >> 31)


def hash64(x):
    return mix64((x + GOLDEN) & M64)


def rng_key(seed, domain, a, b):
    return hash64(hash64(hash64(hash64(seed & M64) ^ domain) ^ (a & M64)) ^ (b & M64))


def permutation(seed, epoch, n, shuffle=True):
    """bp_data_permutation(seed, epoch, shuffle, n): Durstenfeld's Fisher-Yates
    (i = n-1 down to 1, swap i with j uniform in [0, i]); draw k of the stream
    is mix(key + (k+1)*GOLDEN); a bounded draw below m rejects draws under
    2^64 mod m, then takes draw mod m."""
    perm = list(range(n))
    if not shuffle:
        return perm
    state = rng_key(seed, DOMAIN_PERMUTATION, epoch, 0)
    for i in range(n - 1, 0, -1):
        m = i + 1
        threshold = ((1 << 64) - m) % m
        while True:
            state = (state + GOLDEN) & M64
            x = mix64(state)
            if x >= threshold:
                break
        j = x % m
        perm[i], perm[j] = perm[j], perm[i]
    return perm


# ---- data --------------------------------------------------------------------


def _open_idx(directory, name):
    for candidate in (name + ".gz", name):
        path = os.path.join(directory, candidate)
        if os.path.exists(path):
            return path, (gzip.open if candidate.endswith(".gz") else open)
    sys.exit(f"torch_twin: {os.path.join(directory, name)}[.gz]: no such file")


def read_idx(directory, name):
    path, opener = _open_idx(directory, name)
    with opener(path, "rb") as f:
        data = f.read()
    if len(data) < 8:
        sys.exit(f"torch_twin: {path}: truncated header")
    magic, = struct.unpack(">I", data[:4])
    if magic >> 8 != 0x08:
        sys.exit(f"torch_twin: {path}: wrong magic 0x{magic:08x} (unsigned-byte IDX expected)")
    ndim = magic & 0xFF
    dims = struct.unpack(">" + "I" * ndim, data[4:4 + 4 * ndim])
    body = np.frombuffer(data, dtype=np.uint8, offset=4 + 4 * ndim)
    if body.size != int(np.prod(dims)):
        sys.exit(f"torch_twin: {path}: {body.size} data bytes, header promises {int(np.prod(dims))}")
    return body.reshape(dims)


def load_split(directory, split):
    prefix = "train" if split == "train" else "t10k"
    images = read_idx(directory, f"{prefix}-images-idx3-ubyte")
    labels = read_idx(directory, f"{prefix}-labels-idx1-ubyte")
    if images.shape[0] != labels.shape[0]:
        sys.exit(f"torch_twin: {directory}: {images.shape[0]} images but {labels.shape[0]} labels")
    if images.ndim == 3:
        images = images[:, :, :, None]  # NHWC, one channel
    return images, labels


def norm_lut(mean, std):
    """bp_data_fill's look-up table, in float32: (p / 255 - mean) / std."""
    p = np.arange(256, dtype=np.float32)
    return ((p / np.float32(255.0) - np.float32(mean)) / np.float32(std)).astype(np.float32)


def normalize(images_nhwc, mean=FASHION_MNIST_MEAN, std=FASHION_MNIST_STD):
    return to_nchw(norm_lut(mean, std)[images_nhwc])


def to_nchw(x_nhwc):
    return torch.from_numpy(np.ascontiguousarray(x_nhwc.transpose(0, 3, 1, 2)))


def dataset_stats(images_nhwc):
    """bp_dataset_stats for one channel: mean and population std of p / 255,
    summed in double over a histogram, rounded to float."""
    if images_nhwc.shape[3] != 1:
        sys.exit("torch_twin: only one-channel data sets are supported")
    hist = np.bincount(images_nhwc.reshape(-1), minlength=256).astype(np.float64)
    pixels = float(images_nhwc.size)
    mean = float(np.sum(hist * np.arange(256))) / 255.0 / pixels
    d = np.arange(256) / 255.0 - mean
    var = float(np.sum(hist * d * d)) / pixels
    return np.float32(mean), np.float32(math.sqrt(var) if var > 0 else 1.0)


DOMAIN_CROP, DOMAIN_FLIP = 2, 3


def _below(state, m):
    threshold = ((1 << 64) - m) % m
    while True:
        state = (state + GOLDEN) & M64
        x = mix64(state)
        if x >= threshold:
            return state, x % m


def augment_draw(seed, epoch, index, crop_pad, flip):
    """bp_data_augment_params: (dy, dx, flip) of sample `index` in `epoch`."""
    dy = dx = f = 0
    if crop_pad > 0:
        st = rng_key(seed, DOMAIN_CROP, epoch, index)
        st, a = _below(st, 2 * crop_pad + 1)
        st, b = _below(st, 2 * crop_pad + 1)
        dy, dx = a - crop_pad, b - crop_pad
    if flip:
        st = (rng_key(seed, DOMAIN_FLIP, epoch, index) + GOLDEN) & M64
        f = mix64(st) >> 63
    return dy, dx, f


def augment_batch(images_u8, indices, seed, epoch, crop_pad, flip):
    """Raw bytes of the augmented samples, as bp_data_fill writes them:
    out(y, x) = in(y + dy, x' + dx), x' = flip ? W-1-x : x, byte 0 outside."""
    _, h, w, _ = images_u8.shape
    p = crop_pad
    out = np.empty((len(indices),) + images_u8.shape[1:], dtype=np.uint8)
    for row, i in enumerate(indices):
        dy, dx, f = augment_draw(seed, epoch, int(i), crop_pad, flip)
        src = images_u8[i]
        if p:
            src = np.pad(src, ((p, p), (p, p), (0, 0)))
        win = src[dy + p:dy + p + h, dx + p:dx + p + w]
        out[row] = win[:, ::-1] if f else win
    return out


# ---- model -----------------------------------------------------------------


def _kernel(v):
    if isinstance(v, list):
        return int(v[0]), int(v[1])
    return int(v), int(v)


class FC(nn.Linear):
    """blueprint's fc: flattens NCHW input in NHWC element order (H*W*C, as
    blueprint's [out, 1, 1, in] weight sees it) and returns [N, units, 1, 1].
    With --export-onnx: PyTorch's own torch.flatten (NCHW order) and [N,
    units], the form torch.onnx exports as Flatten + Gemm (blueprint's ONNX
    import permutes the weight to its order)."""

    nchw = False  # set by --export-onnx before the model is built

    def forward(self, x):
        if FC.nchw:
            return super().forward(torch.flatten(x, 1))
        y = super().forward(x.permute(0, 2, 3, 1).reshape(x.shape[0], -1))
        return y.reshape(y.shape[0], y.shape[1], 1, 1)


class LayerNorm(nn.LayerNorm):
    """blueprint's layernorm on NCHW: normalizes over the C channels of
    every position (the NHWC tensor's last dimension), gain 1 and bias 0 at
    init (PyTorch's own init)."""

    def forward(self, x):
        return super().forward(x.permute(0, 2, 3, 1)).permute(0, 3, 1, 2)


class PosEmbed(nn.Module):
    """blueprint's pos_embed: a learned P[H, W, C] (NCHW here: [1, C, H, W])
    added to every sample; init normal(0, 0.02)."""

    def __init__(self, c, h, w):
        super().__init__()
        self.weight = nn.Parameter(torch.empty(1, c, h, w))
        nn.init.normal_(self.weight, 0.0, 0.02)

    def forward(self, x):
        return x + self.weight


class Attention(nn.Module):
    """blueprint's attention, by hand (PyTorch 1.13 has no fused SDPA): the
    NCHW input [N, 3D, H, W] is the token tensor [N, T, 3D], T = H*W in
    row-major order; q, k, v = its three D-channel thirds; head j takes
    channels j*dh..j*dh+dh-1 of each; softmax(q k^T / sqrt(dh)) v, keys
    t' > t masked when causal; heads concatenated back to [N, D, H, W]."""

    def __init__(self, heads, causal):
        super().__init__()
        self.heads, self.causal = heads, causal

    def forward(self, x):
        n, c3, h, w = x.shape
        d, t = c3 // 3, h * w
        dh = d // self.heads
        q, k, v = x.permute(0, 2, 3, 1).reshape(n, t, c3).chunk(3, -1)
        q, k, v = (z.reshape(n, t, self.heads, dh).transpose(1, 2) for z in (q, k, v))
        scores = torch.matmul(q, k.transpose(-2, -1)) / math.sqrt(dh)
        if self.causal:
            mask = torch.ones(t, t, dtype=torch.bool, device=x.device).triu(1)
            scores = scores.masked_fill(mask, float("-inf"))
        out = torch.matmul(scores.softmax(-1), v)  # [N, heads, T, dh]
        return out.transpose(1, 2).reshape(n, h, w, d).permute(0, 3, 1, 2)


class Twin(nn.Module):
    """The layer graph of a blueprint model file, NCHW."""

    def __init__(self, spec):
        super().__init__()
        inp = spec["input"]
        shape = {"input": (int(inp["channels"]), int(inp["height"]), int(inp["width"]))}
        self.classes = int(inp["classes"])
        self.steps = []  # (name, type, [inputs])
        self.label_smoothing = 0.0
        self.mods = nn.ModuleDict()
        self.conv_fc_weights, self.bias_like = [], []
        prev = "input"
        layers = spec["layers"]
        for idx, layer in enumerate(layers):
            t = layer["type"]
            name = layer.get("name", f"{t}{idx}")
            if t == "add":
                srcs = list(layer["inputs"])
            else:
                srcs = [layer.get("input", prev)]
            c, h, w = shape[srcs[0]]
            if t == "conv":
                kh, kw = _kernel(layer["kernel"])
                s, p = int(layer.get("stride", 1)), int(layer.get("pad", 0))
                d, g = int(layer.get("dilation", 1)), int(layer.get("groups", 1))
                bias = bool(layer.get("bias", True))
                m = nn.Conv2d(c, int(layer["filters"]), (kh, kw), s, p, d, g, bias=bias)
                c = int(layer["filters"])
                h = (h + 2 * p - d * (kh - 1) - 1) // s + 1
                w = (w + 2 * p - d * (kw - 1) - 1) // s + 1
            elif t == "batchnorm":
                m = nn.BatchNorm2d(c, eps=float(layer.get("eps", 1e-5)),
                                   momentum=float(layer.get("momentum", 0.1)))
            elif t == "relu":
                m = nn.ReLU(inplace=False)
            elif t == "gelu":
                m = nn.GELU()
            elif t == "gelu_tanh":
                m = nn.GELU(approximate="tanh")
            elif t == "layernorm":
                m = LayerNorm(c, eps=float(layer.get("eps", 1e-5)))
            elif t == "pos_embed":
                m = PosEmbed(c, h, w)
            elif t == "attention":
                heads = int(layer["heads"])
                if c % 3 or (c // 3) % heads:
                    sys.exit(f"torch_twin: attention '{name}': {c} input channels are not "
                             f"3 x D with D divisible by {heads} heads")
                m = Attention(heads, bool(layer.get("causal", False)))
                c //= 3
            elif t in ("maxpool", "avgpool"):
                kh, kw = _kernel(layer["kernel"])
                s = layer.get("stride")
                sh, sw = (kh, kw) if s is None else _kernel(s)
                p = int(layer.get("pad", 0))
                if t == "maxpool":
                    m = nn.MaxPool2d((kh, kw), (sh, sw), p)
                else:  # blueprint's padding convention for avgpool is not documented yet
                    m = nn.AvgPool2d((kh, kw), (sh, sw), p)
                h = (h + 2 * p - kh) // sh + 1
                w = (w + 2 * p - kw) // sw + 1
            elif t == "global_avgpool":
                m = nn.AdaptiveAvgPool2d(1)
                h = w = 1
            elif t == "fc":
                units = int(layer["units"])
                m = FC(c * h * w, units, bias=bool(layer.get("bias", True)))
                c, h, w = units, 1, 1
            elif t == "add":
                m = None
                if shape[srcs[1]] != (c, h, w):
                    sys.exit(f"torch_twin: add '{name}': shapes {shape[srcs[0]]} and {shape[srcs[1]]}")
            elif t == "softmax_ce":
                if idx != len(layers) - 1:
                    sys.exit("torch_twin: softmax_ce must be the last layer")
                if (c, h, w) != (self.classes, 1, 1):
                    sys.exit(f"torch_twin: softmax_ce input is {(c, h, w)}, [{self.classes},1,1] expected")
                self.label_smoothing = float(layer.get("label_smoothing", 0.0))
                m = None
            else:
                sys.exit(f"torch_twin: layer type '{t}' is not supported")
            if m is not None:
                self.mods[name] = m
            self.steps.append((name, t, srcs))
            shape[name] = (c, h, w)
            prev = name
        self._init()

    def _init(self):
        # core/src/compile.c: conv and fc weights BP_INIT_KAIMING_NORMAL
        # (std = sqrt(2) / sqrt(fan_in), fan_in = kh*kw*in_c/groups), biases
        # zeros, BN bias zeros and weight ones.
        for m in self.modules():
            if isinstance(m, (nn.Conv2d, nn.Linear)):
                nn.init.kaiming_normal_(m.weight, mode="fan_in", nonlinearity="relu")
                self.conv_fc_weights.append(m.weight)
                if m.bias is not None:
                    nn.init.zeros_(m.bias)
                    self.bias_like.append(m.bias)
            elif isinstance(m, (nn.BatchNorm2d, nn.LayerNorm)):
                nn.init.ones_(m.weight)
                nn.init.zeros_(m.bias)
                self.bias_like += [m.weight, m.bias]
            elif isinstance(m, PosEmbed):  # normal(0, 0.02) at construction
                self.bias_like.append(m.weight)

    def forward(self, x):
        outs = {"input": x}
        for name, t, srcs in self.steps:
            if t == "softmax_ce":
                y = outs[srcs[0]]
                return y if y.dim() == 2 else y.reshape(x.shape[0], self.classes)
            if t == "add":
                outs[name] = outs[srcs[0]] + outs[srcs[1]]
            else:
                outs[name] = self.mods[name](outs[srcs[0]])
        raise RuntimeError("no softmax_ce layer")


# ---- recipe --------------------------------------------------------------------

KNOWN_TRAIN = {"batch", "eval_batch", "train_size", "epochs", "optimizer", "lr", "momentum",
               "weight_decay", "amp", "ema", "schedule", "warmup_epochs"}
SCHEDULES = ("constant", "step", "cosine")


def schedule_lr(kind, lr, gamma, step_epochs, warmup_epochs, steps_per_epoch, epochs, t):
    """bp_schedule_lr (trainer/src/schedule.c): the learning rate of step t of the
    run, t = epoch * steps_per_epoch + step (from 0)."""
    spe = max(steps_per_epoch, 1)
    total = spe * max(epochs, 1)
    # llround: halves away from zero (Python's round() would go to even)
    warm = int(math.floor(warmup_epochs * spe + 0.5))
    warm = min(max(warm, 0), total)
    t = max(t, 0)
    if t < warm:
        return lr * (t + 1) / warm
    if kind == "step":
        return lr * math.pow(gamma, (t // spe) // max(step_epochs, 1))
    if kind == "cosine":
        span = total - warm
        if span <= 0:
            return lr
        progress = (t - warm) / span
        return 0.5 * lr * (1.0 + math.cos(math.pi * min(progress, 1.0)))
    return lr


def tensor_bytes(tensors):
    """Bytes of the distinct storages behind `tensors`."""
    seen = {}
    for t in tensors:
        if torch.is_tensor(t):
            s = t.storage()
            seen[s.data_ptr()] = s.nbytes()
    return sum(seen.values())


def peak_step_memory(model, opt, x, y):
    """PyTorch's peak allocated CPU memory over one training step (zero_grad,
    forward, loss, backward, optimizer step) after a first step, so the
    optimizer's state exists as in every later step. What is live when the
    step starts (parameters, optimizer state, the batch; the gradients are
    None after zero_grad(set_to_none=True)) plus the highest running sum of
    the allocations and frees torch.profiler records during the step (its
    "[memory]" events, in time order). Returns a dict of bytes."""
    from torch.profiler import ProfilerActivity, profile

    def step():
        opt.zero_grad(set_to_none=True)
        loss = F.cross_entropy(model(x), y, label_smoothing=model.label_smoothing)
        loss.backward()
        opt.step()

    model.train()
    step()
    opt.zero_grad(set_to_none=True)
    params = list(model.parameters())
    state = [v for st in opt.state.values() for v in st.values()]
    base = {"parameters": tensor_bytes(params), "optimizer_state": tensor_bytes(state),
            "batch_bytes": tensor_bytes([x, y])}
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        step()
    events = [(e.start_us(), k, e.nbytes()) for k, e in
              enumerate(prof.profiler.kineto_results.events())
              if e.name() == "[memory]" and str(e.device_type()) == "DeviceType.CPU"]
    events.sort()
    live = peak = 0
    for _, _, nbytes in events:
        live += nbytes
        peak = max(peak, live)
    start = sum(base.values())
    return dict(base, live_at_start=start, step_peak_above_start=peak,
                peak_allocated=start + peak, step_net=live, memory_events=len(events))


def resolve_model(arg):
    if os.path.exists(arg):
        return arg
    path = os.path.join(REPO, "models", arg + ".yaml")
    if os.path.exists(path):
        return path
    sys.exit(f"torch_twin: no model file '{arg}' (nor {path})")


def positive(v):
    i = int(v)
    if i < 1:
        raise argparse.ArgumentTypeError(f"'{v}' is not a positive integer")
    return i


def nonneg(v):
    i = int(v)
    if i < 0:
        raise argparse.ArgumentTypeError(f"'{v}' is not an integer >= 0")
    return i


def main():
    ap = argparse.ArgumentParser(
        description="PyTorch twin of `blueprint train`; the options mirror blueprint's "
                    "(docs: bench/README.md).")
    ap.add_argument("--model", default="mlp", help="mlp, cnn, resnet8 or a model file path")
    # the same names and meanings as `blueprint train` (cli/train_args.c)
    ap.add_argument("--data", help="MNIST-format directory (default: Fashion-MNIST, "
                                   f"{DEFAULT_DATA}); another set is normalized with its "
                                   "training set's own mean and std, as blueprint does")
    ap.add_argument("--epochs", type=positive, help="default: the model file's")
    ap.add_argument("--batch", type=positive, help="default: the model file's")
    ap.add_argument("--eval-batch", type=positive, help="default: the model file's")
    ap.add_argument("--train-limit", type=nonneg, default=0,
                    help="use the first N training images (0: all)")
    ap.add_argument("--test-limit", type=nonneg, default=0,
                    help="use the first N test images (0: all)")
    ap.add_argument("--seed", type=int, default=1,
                    help="data-order and augmentation seed as blueprint's --seed (default 1); "
                         "also torch.manual_seed for the initial weights")
    ap.add_argument("--optimizer", choices=["sgd", "adamw"])
    ap.add_argument("--lr", type=float)
    ap.add_argument("--momentum", type=float)
    ap.add_argument("--weight-decay", type=float)
    ap.add_argument("--nesterov", action="store_true")
    ap.add_argument("--schedule", choices=SCHEDULES, help="default: the model file's (constant)")
    ap.add_argument("--warmup-epochs", type=float, help="default: the model file's (0)")
    ap.add_argument("--step-gamma", type=float, default=0.1)
    ap.add_argument("--step-every", type=positive, default=1)
    ap.add_argument("--crop-pad", type=nonneg, default=0,
                    help="random crop with this zero padding (the same draws as blueprint)")
    ap.add_argument("--flip", action="store_true", help="random horizontal flip (same draws)")
    # the twin's own
    ap.add_argument("--threads", type=positive, default=os.cpu_count(),
                    help="torch.set_num_threads (default: the CPUs)")
    ap.add_argument("--decay-all", action="store_true",
                    help="weight decay on every parameter (PyTorch's habit) instead of conv "
                         "and fc weights only (blueprint's)")
    ap.add_argument("--json", action="store_true",
                    help="one JSON object per epoch on stdout, blueprint's metrics schema")
    ap.add_argument("--export-onnx", metavar="FILE",
                    help="write the initial network (before any step) as ONNX (torch.onnx, "
                         "BatchNormalization kept, fc as Flatten + Gemm) and train that form; "
                         "`blueprint train FILE` starts from the same weights (docs/onnx.md)")
    ap.add_argument("--log-steps", type=nonneg, default=0,
                    help="with --json: a 'step' line (running train_loss) for each of the "
                         "first N steps")
    ap.add_argument("--peak-memory", action="store_true",
                    help="train nothing: print PyTorch's peak allocated CPU memory over one "
                         "training step at the batch (the first batch of epoch 0, after one "
                         "step), measured with torch.profiler(profile_memory=True)")
    args = ap.parse_args()
    FC.nchw = bool(args.export_onnx)

    path = resolve_model(args.model)
    with open(path) as f:
        spec = yaml.safe_load(f)
    tr = dict(spec.get("train") or {})
    unknown = set(tr) - KNOWN_TRAIN
    if unknown:
        sys.exit(f"torch_twin: {path}: unknown train fields: {', '.join(sorted(unknown))}")
    if tr.get("amp") or tr.get("ema"):
        print("torch_twin: warning: amp/ema are not reproduced by the twin", file=sys.stderr)
    batch = args.batch or int(tr.get("batch", 128))
    eval_batch = args.eval_batch or int(tr.get("eval_batch", 200))
    epochs = args.epochs or int(tr.get("epochs", 3))
    opt_name = args.optimizer or tr.get("optimizer", "sgd")
    lr = args.lr if args.lr is not None else float(tr.get("lr", 0.05))
    momentum = args.momentum if args.momentum is not None else float(tr.get("momentum", 0.9))
    wd = args.weight_decay if args.weight_decay is not None else float(tr.get("weight_decay", 5e-4))
    args.schedule = args.schedule or str(tr.get("schedule", "constant"))
    if args.schedule not in SCHEDULES:
        sys.exit(f"torch_twin: {path}: unknown schedule '{args.schedule}'")
    if args.warmup_epochs is None:
        args.warmup_epochs = float(tr.get("warmup_epochs", 0.0))

    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    model_name = spec.get("name") or os.path.splitext(os.path.basename(path))[0]

    data_dir = args.data or DEFAULT_DATA
    train_u8, train_y = load_split(data_dir, "train")
    test_u8, test_y = load_split(data_dir, "test")
    if args.data:  # blueprint: bp_dataset_stats of the whole training set (before --train-limit)
        mean, std = dataset_stats(train_u8)
    else:
        mean, std = FASHION_MNIST_MEAN, FASHION_MNIST_STD
    lut = norm_lut(mean, std)
    if args.train_limit:
        train_u8, train_y = train_u8[:args.train_limit], train_y[:args.train_limit]
    if args.test_limit:
        test_u8, test_y = test_u8[:args.test_limit], test_y[:args.test_limit]
    n = train_u8.shape[0]
    if "train_size" in tr and int(tr["train_size"]) != n:
        print(f"torch_twin: note: the model file's train_size {tr['train_size']} is not used; "
              f"the {n} training images set the epoch (as blueprint train does)", file=sys.stderr)
    augment = args.crop_pad > 0 or args.flip
    train_x = None if augment else to_nchw(lut[train_u8])
    train_y = torch.from_numpy(train_y.astype(np.int64))
    test_x = to_nchw(lut[test_u8])
    test_y = torch.from_numpy(test_y.astype(np.int64))

    model = Twin(spec)
    if args.export_onnx:
        inp = spec["input"]
        dummy = torch.zeros(1, int(inp["channels"]), int(inp["height"]), int(inp["width"]))
        model.train()
        torch.onnx.export(model, dummy, args.export_onnx, input_names=["input"],
                          output_names=["logits"], opset_version=13, do_constant_folding=False,
                          training=torch.onnx.TrainingMode.TRAINING)
    if args.decay_all:
        groups = [{"params": list(model.parameters()), "weight_decay": wd}]
    else:
        groups = [{"params": model.conv_fc_weights, "weight_decay": wd},
                  {"params": model.bias_like, "weight_decay": 0.0}]
    if opt_name == "sgd":
        opt = torch.optim.SGD(groups, lr=lr, momentum=momentum, nesterov=args.nesterov)
    elif opt_name == "adamw":  # blueprint's defaults are PyTorch's: 0.9, 0.999, 1e-8
        opt = torch.optim.AdamW(groups, lr=lr, betas=(0.9, 0.999), eps=1e-8)
    else:
        sys.exit(f"torch_twin: optimizer '{opt_name}' has no twin here (sgd, adamw)")

    steps = (n + batch - 1) // batch
    if args.peak_memory:
        idx = torch.tensor(permutation(args.seed, 0, n)[:batch], dtype=torch.int64)
        x = (to_nchw(lut[augment_batch(train_u8, idx.numpy(), args.seed, 0, args.crop_pad,
                                       args.flip)]) if augment else train_x.index_select(0, idx))
        m = peak_step_memory(model, opt, x, train_y.index_select(0, idx))
        m.update(model=model_name, batch=int(idx.numel()), optimizer=opt_name,
                 threads=torch.get_num_threads(), torch=torch.__version__)
        if args.json:
            print(json.dumps(dict(event="peak_memory", **m)), flush=True)
        else:
            mib = 1.0 / 1048576
            print(f"# {model_name}: batch {m['batch']}, {opt_name}, torch {torch.__version__}: "
                  f"peak allocated {m['peak_allocated'] * mib:.2f} MiB over one training step "
                  f"= live at start {m['live_at_start'] * mib:.2f} MiB (parameters "
                  f"{m['parameters'] * mib:.2f}, optimizer state {m['optimizer_state'] * mib:.2f}, "
                  f"batch {m['batch_bytes'] * mib:.2f}) + "
                  f"{m['step_peak_above_start'] * mib:.2f} MiB at the step's peak "
                  f"({m['memory_events']} allocator events)", flush=True)
        return
    if not args.json:
        print(f"# {model_name}: {path}, {sum(p.numel() for p in model.parameters())} parameters, "
              f"{n} training images, batch {batch} ({steps} steps/epoch, last "
              f"{n - (steps - 1) * batch}), eval batch {eval_batch}, {opt_name} lr {lr} "
              f"momentum {momentum} wd {wd} ({'all' if args.decay_all else 'weights only'}) "
              f"nesterov {args.nesterov}, schedule {args.schedule} warmup {args.warmup_epochs}, crop-pad {args.crop_pad} "
              f"flip {int(args.flip)}, seed {args.seed}, threads {torch.get_num_threads()}, "
              f"torch {torch.__version__}", flush=True)
        print(f"{'epoch':>5} {'train_loss':>10} {'train_acc':>9} {'test_acc':>8} "
              f"{'images/s':>9} {'seconds':>8}", flush=True)

    global_step = 0
    for e in range(epochs):
        t0 = time.perf_counter()
        perm = torch.tensor(permutation(args.seed, e, n), dtype=torch.int64)
        t_prep = time.perf_counter() - t0  # pure-Python Fisher-Yates: not counted as training
        model.train()
        loss_sum, correct = 0.0, 0
        t1 = time.perf_counter()
        for s in range(steps):
            cur = schedule_lr(args.schedule, lr, args.step_gamma, args.step_every,
                              args.warmup_epochs, steps, epochs, e * steps + s)
            for g in opt.param_groups:
                g["lr"] = cur
            idx = perm[s * batch:min((s + 1) * batch, n)]
            if augment:
                x = to_nchw(lut[augment_batch(train_u8, idx.numpy(), args.seed, e,
                                              args.crop_pad, args.flip)])
            else:
                x = train_x.index_select(0, idx)
            y = train_y.index_select(0, idx)
            logits = model(x)
            loss = F.cross_entropy(logits, y, label_smoothing=model.label_smoothing)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            loss_sum += loss.item() * idx.numel()
            correct += int((logits.argmax(1) == y).sum())
            global_step += 1
            if args.json and global_step <= args.log_steps:
                seen = min((s + 1) * batch, n)
                print(json.dumps({"event": "step", "epoch": e + 1, "step": s + 1,
                                  "global_step": global_step, "samples": seen,
                                  "train_loss": loss_sum / seen,
                                  "train_accuracy": correct / seen}), flush=True)
        train_s = time.perf_counter() - t1
        model.eval()
        test_correct, test_loss = 0, 0.0
        t2 = time.perf_counter()
        with torch.no_grad():
            for s in range(0, test_x.shape[0], eval_batch):
                x, y = test_x[s:s + eval_batch], test_y[s:s + eval_batch]
                logits = model(x)
                test_loss += float(F.cross_entropy(logits, y, reduction="sum",
                                                   label_smoothing=model.label_smoothing))
                test_correct += int((logits.argmax(1) == y).sum())
        eval_s = time.perf_counter() - t2
        # blueprint's metrics schema (docs/metrics-jsonl.md), then the twin's own fields
        rec = {
            "event": "epoch", "epoch": e + 1, "epochs": epochs, "global_step": global_step,
            "steps": steps, "samples": n,
            "train_loss": loss_sum / n, "train_accuracy": correct / n,
            "test_loss": test_loss / test_x.shape[0],
            "test_accuracy": test_correct / test_x.shape[0], "test_samples": test_x.shape[0],
            "images_per_second": n / train_s, "train_seconds": train_s, "eval_seconds": eval_s,
            "seconds": train_s + eval_s, "lr": cur, "complete": True, "checkpointed": False,
            "twin": {"model": model_name, "batch": batch, "threads": torch.get_num_threads(),
                     "seed": args.seed, "torch": torch.__version__, "prep_seconds": t_prep,
                     "env": {k: os.environ.get(k) for k in
                             ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "OMP_WAIT_POLICY")}},
        }
        if args.json:
            print(json.dumps(rec), flush=True)
        else:
            print(f"{rec['epoch']:>5} {rec['train_loss']:>10.4f} "
                  f"{100 * rec['train_accuracy']:>8.2f}% {100 * rec['test_accuracy']:>7.2f}% "
                  f"{rec['images_per_second']:>9.0f} {rec['seconds']:>8.1f}", flush=True)


if __name__ == "__main__":
    main()
