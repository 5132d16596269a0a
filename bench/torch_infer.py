#!/usr/bin/python3
"""PyTorch 1.13 inference timings beside `blueprint predict` (issue 14):
batch-1 latency and batch-200 throughput of a model file's network, built
by torch_twin.py's Twin (same layers, NCHW), in eval mode under
torch.inference_mode(), with random weights (timing does not depend on
them) and random inputs.

  /usr/bin/python3 bench/torch_infer.py --model cnn [--threads 1,2] [--seconds 2]

For each thread count: the median of per-image times over a batch-1 loop
(milliseconds), and images/s of batch-200 forward passes (the best of the
runs in the time given). Prints one JSON object per thread count.
"""
import argparse
import json
import os
import sys
import time


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="cnn")
    ap.add_argument("--threads", default="1")
    ap.add_argument("--seconds", type=float, default=2.0)
    args = ap.parse_args()
    threads = [int(t) for t in args.threads.split(",")]
    # torch_twin sets the pools from --threads before torch loads; here the
    # counts vary, so OpenMP waits passively and torch.set_num_threads sizes
    # each run (OpenBLAS's pool is sized by OPENBLAS_NUM_THREADS only)
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    os.environ.setdefault("OPENBLAS_NUM_THREADS", str(max(threads)))
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import torch  # noqa: E402
    import yaml  # noqa: E402
    import torch_twin  # noqa: E402

    with open(torch_twin.resolve_model(args.model)) as f:
        spec = yaml.safe_load(f)
    net = torch_twin.Twin(spec).eval()
    inp = spec["input"]
    shape = (int(inp["channels"]), int(inp["height"]), int(inp["width"]))
    for t in threads:
        torch.set_num_threads(t)
        with torch.inference_mode():
            one = torch.randn(1, *shape)
            for _ in range(20):
                net(one)
            times, end = [], time.perf_counter() + args.seconds
            while time.perf_counter() < end or len(times) < 20:
                t0 = time.perf_counter()
                net(one)
                times.append(time.perf_counter() - t0)
            times.sort()
            batch = torch.randn(200, *shape)
            net(batch)
            best, end, runs = float("inf"), time.perf_counter() + args.seconds, 0
            while time.perf_counter() < end or runs < 3:
                t0 = time.perf_counter()
                net(batch)
                best = min(best, time.perf_counter() - t0)
                runs += 1
        print(json.dumps({"model": spec["name"], "threads": t, "torch": torch.__version__,
                          "batch1_ms_median": times[len(times) // 2] * 1e3,
                          "batch1_ms_min": times[0] * 1e3,
                          "batch200_images_per_s": 200 / best}), flush=True)


if __name__ == "__main__":
    main()
