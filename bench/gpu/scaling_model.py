#!/usr/bin/env python3
"""What N GPUs would give for one model, on paper (bench/RESULTS-gpu.md,
"Scaling on paper"): a model from one GPU's measured inputs, not a
measurement. Python 3 standard library only.

    scaling_model.py --plan PLAN.json --profile METRICS.jsonl
                     [--throughput METRICS.jsonl | --step-ms MS] [--comm METRICS.jsonl]
                     [--batch B] [--gpus 1,2,4,8] [--busbw-gbs 360] [--latency-us 1.5]
                     [--compare-busbw-gbs 240] [--claim 9310] [--node-times auto|profile|flops]
                     [--save-inputs FILE] [--json FILE]
    scaling_model.py --inputs FILE [the same model options]

Inputs (all from one GPU, or from the CPU for a dry run):
  --plan        `blueprint plan MODEL --batch B [--amp] --json` (docs/plan-json.md):
                the gradient buckets the COMM segment all-reduces, in its order
                (core/src/graph_build.c): G_CONV_DEEP ("deep conv"), then
                G_BN_BIAS..G_CONV_FIRST ("rest"), then B (BN running statistics,
                averaged); their bytes are the regions' bytes, and each gradient
                tensor (region G_*) names its layer
  --profile     a --profile --metrics file (docs/metrics-jsonl.md, "profile"
                lines; docs/profile.md): the train variant's nodes in execution
                order, their time per step and FLOPs per call
  --throughput  a --log-every W --metrics file of graph-replayed steps: the
                step time (samples and seconds between the first and the last
                step line); else --step-ms, else the profile's own step time
  --comm        a --ranks 2 --no-graph --metrics file of FP32 steps, whose
                epoch line has comm_ms_per_step and comm_overlap_ms_per_step
                (docs/metrics-jsonl.md: the bucket collectives timed on the
                update stream, and the part inside backward); optional
Node times: a node's share of the step is its profiled time (--node-times
profile; the default on the cpu device) or its FLOPs' share of the step's
conv and fc FLOPs (flops; the default on other devices, whose profile times
only the enqueueing: docs/profile.md). Shares are scaled to the step time.

The model, per GPU count N (1 GPU: no COMM segment, nothing to reduce):
  ring all-reduce of S bytes: t(S, N) = 2(N-1)/N * S / busbw + 2(N-1) * latency
  (busbw as nccl-tests defines it; the comm stream runs the buckets one after
  another in COMM order);
  exposed comm = what of the comm stream's work ends after the compute stream
  reaches UPDATE (the end of CAST_GRAD), in three schedules:
    serial     every bucket starts after CAST_GRAD: no overlap (the graph as
               built under AMP, where one unscale node writes the whole G span
               after backward)
    bucket     each bucket starts once its last gradient writer in backward
               has run (and the previous bucket is done)
    layer      what-if: one bucket per layer, in the order backward writes them
  with a measured one-GPU overlap fraction f = comm_overlap_ms_per_step /
  comm_ms_per_step (the same buckets, FP32: each reduced after its last
  writer), the bucket schedule hides at most f of the comm time (the overlap
  clamp: hidden = min(the schedule's hidden time, f * comm)); the layer
  what-if stays a bound of its schedule;
  step(N) = step(1) + exposed(N); img/s = N * batch / step(N);
  efficiency = img/s(N) / (N * img/s(1)).
Not modelled: the compute slowdown while NCCL's kernels share the SMs, the
input pipeline, stragglers between GPUs; backward is one sequence in the
profile's node order (a weight-gradient stream of its own may finish a
layer's gradient earlier).
"""
import argparse
import json
import os
import sys

BUCKET_REST = ("G_BN_BIAS", "G_BN_WEIGHT", "G_FC_BIAS", "G_FC_WEIGHT", "G_CONV_FIRST")
CONV_FC = ("conv2d.", "fc.")


def read_jsonl(path):
    out = []
    with open(path) as f:
        for line in f:
            line = line.strip()
            if line.startswith("{"):
                try:
                    out.append(json.loads(line))
                except json.JSONDecodeError:
                    pass
    return out


def fail(msg):
    sys.exit("scaling_model: " + msg)


# ---- inputs -----------------------------------------------------------------


def plan_inputs(path):
    """Buckets (COMM order) and each layer's FP32 gradient bytes and bucket."""
    with open(path) as f:
        plan = json.load(f)
    v = plan["variants"][0]
    regions = {r["name"]: r["bytes"] for r in v["regions"]}
    if "G_CONV_DEEP" not in regions:
        fail(f"{path}: no G_CONV_DEEP region: not a plan document (docs/plan-json.md)")
    buckets = [{"name": "deep conv", "bytes": regions.get("G_CONV_DEEP", 0)},
               {"name": "rest", "bytes": sum(regions.get(r, 0) for r in BUCKET_REST)},
               {"name": "BN statistics", "bytes": regions.get("B", 0)}]
    layers = {}
    for t in v["tensors"]:
        reg = t["region"]
        if not reg.startswith("G_"):
            continue
        name = t["name"].split(".")[0]
        lay = layers.setdefault(name, {"layer": name, "bytes": 0, "bucket": None})
        lay["bytes"] += t["slot_bytes"]
        lay["bucket"] = "deep conv" if reg == "G_CONV_DEEP" else "rest"
    amp = any(r.startswith("G16_") and b > 0 for r, b in regions.items())
    return {"batch": v["batch"], "amp": amp, "buckets": buckets, "layers": list(layers.values())}


def profile_inputs(path, mode):
    """The train variant's nodes: name, segment, ms per step, FLOPs per step."""
    lines = read_jsonl(path)
    prof = [x for x in lines if x.get("event") == "profile"]
    if not prof:
        fail(f"{path}: no profile line (run with --profile --metrics)")
    var = next((v for v in prof[-1]["variants"] if v["variant"] == "train"), None)
    if not var or not var.get("steps"):
        fail(f"{path}: the profile has no timed train step")
    device = next((x.get("device") for x in lines if x.get("event") == "kernels"), "cpu")
    if mode == "auto":
        mode = "profile" if device == "cpu" else "flops"
    steps = var["steps"]
    nodes = [{"node": n["node"], "segment": n["segment"], "ms": n["ns"] / steps / 1e6,
              "flops": n.get("flops_per_call", 0) * n["calls"] / steps} for n in var["nodes"]]
    return {"device": device, "node_times": mode, "profile_step_ms": var["step_ns"] / steps / 1e6,
            "nodes": nodes}


def throughput_step_ms(path, batch):
    steps = [x for x in read_jsonl(path) if x.get("event") == "step"]
    if len(steps) < 2:
        return None
    ds = steps[-1]["samples"] - steps[0]["samples"]
    dt = steps[-1]["seconds"] - steps[0]["seconds"]
    return 1000.0 * dt * batch / ds if ds > 0 and dt > 0 else None


def comm_inputs(path):
    """The last epoch line's comm_ms_per_step and comm_overlap_ms_per_step, or
    None when absent or 0 (no timed collectives: graph steps, one stream)."""
    ep = [x for x in read_jsonl(path) if x.get("event") == "epoch"
          and x.get("comm_ms_per_step") is not None and x.get("comm_overlap_ms_per_step") is not None]
    if not ep or ep[-1]["comm_ms_per_step"] <= 0:
        return None
    return {"comm_ms": ep[-1]["comm_ms_per_step"], "comm_overlap_ms": ep[-1]["comm_overlap_ms_per_step"]}


def gather_inputs(a):
    if a.inputs:
        with open(a.inputs) as f:
            inp = json.load(f)
        if a.step_ms:
            inp["step_ms"], inp["step_source"] = a.step_ms, "--step-ms"
    else:
        if not a.plan or not a.profile:
            fail("--plan and --profile are needed (or --inputs)")
        inp = plan_inputs(a.plan)
        inp.update(profile_inputs(a.profile, a.node_times))
        inp["notes"] = []
        step, src = None, None
        if a.step_ms:
            step, src = a.step_ms, "--step-ms"
        elif a.throughput:
            step = throughput_step_ms(a.throughput, a.batch or inp["batch"])
            src = f"the graph steps of {os.path.basename(a.throughput)}" if step else None
            if not step:
                inp["notes"].append(f"{os.path.basename(a.throughput)}: fewer than two step lines; the profiled "
                                    "step time stands in")
        if not step:
            step, src = inp["profile_step_ms"], "the profiled steps (eager, timed per node)"
        inp["step_ms"], inp["step_source"] = step, src
        inp["comm"] = None
        if a.comm:
            try:
                inp["comm"] = comm_inputs(a.comm)
            except OSError as e:
                inp["notes"].append(f"--comm {os.path.basename(a.comm)}: {e.strerror}: the "
                                    "overlap was not measured, the schedules' own bounds stand")
            else:
                if inp["comm"] is None:
                    inp["notes"].append(f"{os.path.basename(a.comm)}: no epoch line with "
                                        "comm_ms_per_step > 0: the overlap was not measured, "
                                        "the schedules' own bounds stand")
    if a.batch:
        inp["batch"] = a.batch
    return inp


# ---- the model ------------------------------------------------------------------


def ring_ms(nbytes, n, busbw_gbs, latency_us):
    """Ring all-reduce of nbytes over n GPUs, in ms."""
    if n <= 1 or nbytes <= 0:
        return 0.0
    return (2.0 * (n - 1) / n * nbytes / (busbw_gbs * 1e9) + 2 * (n - 1) * latency_us * 1e-6) * 1e3


def timeline(inp):
    """(end of each node in ms from the step's start, the COMM point, notes):
    node times are shares of the step scaled to inp['step_ms']."""
    nodes = inp["nodes"]
    if inp["node_times"] == "flops":
        total = sum(n["flops"] for n in nodes)
        if total <= 0:
            fail("no conv or fc FLOPs in the profile: --node-times flops has nothing to share")
        times = [inp["step_ms"] * n["flops"] / total for n in nodes]
    else:
        scale = inp["step_ms"] / inp["profile_step_ms"]
        times = [n["ms"] * scale for n in nodes]
    ends, t = [], 0.0
    for x in times:
        t += x
        ends.append(t)
    bwd = [i for i, n in enumerate(nodes) if n["segment"] == "backward"]
    if not bwd:
        fail("the profile has no backward node")
    comm_at = ends[bwd[-1]]
    for i, n in enumerate(nodes):
        if n["segment"] == "cast_grad" and i > bwd[-1]:
            comm_at = ends[i]
    return ends, comm_at, bwd


def ready_times(inp, ends, comm_at, bwd):
    """When each layer's gradient is complete: the end of its last backward
    node other than .bwd_data (which writes only the data gradient)."""
    nodes = inp["nodes"]
    last = {}
    for i in bwd:
        name = nodes[i]["node"]
        if not name.endswith(".bwd_data"):
            last[name.split(".")[0]] = ends[i]
    notes, ready = [], {}
    for lay in inp["layers"]:
        if lay["layer"] in last:
            ready[lay["layer"]] = last[lay["layer"]]
        else:
            ready[lay["layer"]] = comm_at
            notes.append(f"no backward node of layer {lay['layer']}: its gradient counts as "
                         "ready at the end of backward")
    return ready, notes


def schedule_end(jobs):
    """jobs: (ready ms, duration ms) in stream order -> when the last ends."""
    t = 0.0
    for r, d in jobs:
        t = max(t, r) + d
    return t


def model(inp, gpus, busbw_gbs, latency_us):
    ends, comm_at, bwd = timeline(inp)
    ready, notes = ready_times(inp, ends, comm_at, bwd)
    step, batch = inp["step_ms"], inp["batch"]
    f = None
    if inp.get("comm") and inp["comm"]["comm_ms"] > 0:
        f = min(1.0, max(0.0, inp["comm"]["comm_overlap_ms"] / inp["comm"]["comm_ms"]))
    layers_in_order = sorted(inp["layers"], key=lambda lay: ready[lay["layer"]])
    rows = []
    for n in gpus:
        b = {x["name"]: ring_ms(x["bytes"], n, busbw_gbs, latency_us) for x in inp["buckets"]}
        total = sum(b.values())
        bucket_ready = {}
        for name in ("deep conv", "rest"):
            rs = [ready[lay["layer"]] for lay in inp["layers"] if lay["bucket"] == name]
            bucket_ready[name] = max(rs) if rs else comm_at
        bucket_ready["BN statistics"] = 0.0  # written in forward; queued after the others
        sched = {
            "serial": total,
            "bucket": schedule_end([(bucket_ready[x["name"]], b[x["name"]])
                                    for x in inp["buckets"]]) - comm_at,
            "layer": schedule_end([(ready[lay["layer"]],
                                    ring_ms(lay["bytes"], n, busbw_gbs, latency_us))
                                   for lay in layers_in_order] +
                                  [(0.0, b["BN statistics"])]) - comm_at,
        }
        row = {"gpus": n, "comm_ms": total, "bucket_ms": b, "scenarios": {}}
        for name, exp in sched.items():
            exp = min(total, max(0.0, exp)) if name != "serial" else total
            if name == "bucket" and f is not None and n > 1:
                hidden = min(total - exp, f * total)  # the overlap clamp
                exp = total - hidden
            st = step + exp
            ips = n * batch * 1000.0 / st
            row["scenarios"][name] = {"exposed_ms": exp, "step_ms": st, "img_s": ips,
                                      "efficiency": step / st}
        rows.append(row)
    info = {"comm_point_ms": comm_at, "backward_end_ms": ends[bwd[-1]], "overlap_fraction": f,
            "bucket_ready_ms": {x["name"]: None for x in inp["buckets"]}, "notes": notes}
    for name in ("deep conv", "rest"):
        rs = [ready[lay["layer"]] for lay in inp["layers"] if lay["bucket"] == name]
        info["bucket_ready_ms"][name] = max(rs) if rs else comm_at
    return rows, info


# ---- output ---------------------------------------------------------------------


def table(rows, title):
    out = [f"{title}", "",
           "| GPUs | all-reduce ms/step | exposed: serial | img/s | eff. | exposed: bucket | img/s"
           " | eff. | exposed: layer | img/s | eff. |",
           "| ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"]
    for r in rows:
        cells = [str(r["gpus"]), f"{r['comm_ms']:.2f}"]
        for s in ("serial", "bucket", "layer"):
            x = r["scenarios"][s]
            ips = f"{x['img_s']:,.0f}" if x["img_s"] >= 100 else f"{x['img_s']:.3g}"
            cells += [f"{x['exposed_ms']:.2f}", ips, f"{100 * x['efficiency']:.1f}%"]
        out.append("| " + " | ".join(cells) + " |")
    return "\n".join(out)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--plan")
    p.add_argument("--profile")
    p.add_argument("--throughput")
    p.add_argument("--comm")
    p.add_argument("--inputs")
    p.add_argument("--step-ms", type=float)
    p.add_argument("--batch", type=int, help="images per GPU per step (default: the plan's)")
    p.add_argument("--gpus", default="1,2,4,8")
    p.add_argument("--busbw-gbs", type=float, default=360.0,
                   help="ring all-reduce bus bandwidth, GB/s (default 360: H100/H200 HGX, "
                        "NVLink 4, 450 GB/s each way, 80%% of it)")
    p.add_argument("--compare-busbw-gbs", type=float, default=240.0,
                   help="the comparison's bus bandwidth (default 240: A100 HGX, NVLink 3, "
                        "300 GB/s each way, 80%% of it); 0: none")
    p.add_argument("--latency-us", type=float, default=1.5, help="per ring step (2(N-1) steps)")
    p.add_argument("--claim", type=float, default=9310.0,
                   help="the seed's 8xA100 images/s for the model")
    p.add_argument("--node-times", choices=("auto", "profile", "flops"), default="auto")
    p.add_argument("--save-inputs")
    p.add_argument("--json")
    a = p.parse_args(argv)
    try:
        gpus = [int(x) for x in a.gpus.split(",")]
    except ValueError:
        fail(f"--gpus '{a.gpus}': a list of GPU counts, e.g. 1,2,4,8")
    if not gpus or min(gpus) < 1 or a.busbw_gbs <= 0 or a.latency_us < 0:
        fail("--gpus >= 1, --busbw-gbs > 0 and --latency-us >= 0")
    try:
        inp = gather_inputs(a)
    except (OSError, KeyError, ValueError) as e:
        fail(f"reading the inputs: {e}")
    if a.node_times != "auto":
        inp["node_times"] = a.node_times
    if a.save_inputs:
        with open(a.save_inputs, "w") as f:
            json.dump(inp, f, indent=1)
    rows, info = model(inp, gpus, a.busbw_gbs, a.latency_us)
    cmp_rows = model(inp, gpus, a.compare_busbw_gbs, a.latency_us)[0] if a.compare_busbw_gbs > 0 else []
    doc = {"inputs": {k: v for k, v in inp.items() if k not in ("nodes",)}, "busbw_gbs": a.busbw_gbs,
           "compare_busbw_gbs": a.compare_busbw_gbs, "latency_us": a.latency_us,
           "rows": rows, "compare_rows": cmp_rows, "info": info, "claim_img_s": a.claim}
    if a.json:
        with open(a.json, "w") as f:
            json.dump(doc, f, indent=1)
    mib = {x["name"]: x["bytes"] / 2**20 for x in inp["buckets"]}
    f = info["overlap_fraction"]
    print("**Model, not a measurement.** Scaling on paper (bench/gpu/scaling_model.py): "
          f"batch {inp['batch']} per GPU{', AMP' if inp['amp'] else ''}; step on one GPU "
          f"{inp['step_ms']:.2f} ms from {inp['step_source']} (inputs from the {inp['device']} "
          f"device; node shares: {inp['node_times']}); buckets in COMM order: "
          + ", ".join(f"{k} {v:,.1f} MiB" for k, v in mib.items())
          + f"; ready (ms after the step's start): deep conv {info['bucket_ready_ms']['deep conv']:.2f}, "
          f"rest {info['bucket_ready_ms']['rest']:.2f}; backward ends {info['backward_end_ms']:.2f}, "
          f"COMM point {info['comm_point_ms']:.2f}; measured overlap fraction "
          + (f"{f:.2f}" if f is not None else "none (not measured)") + ".\n")
    hgx = " (H100/H200 HGX, NVLink 4)" if a.busbw_gbs == 360 else ""
    print(table(rows, f"Ring all-reduce at {a.busbw_gbs:g} GB/s bus bandwidth{hgx}, assumed, "
                      f"{a.latency_us:g} us per ring step:"))
    if cmp_rows:
        a100 = " (A100 HGX, NVLink 3)" if a.compare_busbw_gbs == 240 else ""
        print()
        print(table(cmp_rows, f"The same compute, {a.compare_busbw_gbs:g} GB/s{a100}, assumed:"))
    print()
    print(f"The seed's claim: {a.claim:,.0f} img/s on 8xA100 ({a.claim / 8:,.0f} img/s per GPU); "
          "a claim, not measured here. serial: every bucket after CAST_GRAD (no overlap); "
          "bucket: each of the COMM buckets once its last writer in backward ran; layer: "
          "what-if, one bucket per layer in backward order. eff. = img/s(N) / (N x img/s(1)).")
    if inp["amp"]:
        print("As the graph is built, AMP's COMM segment follows CAST_GRAD, whose one unscale "
              "node reads the whole FP16 gradient span: serial is what this build does; bucket "
              "needs the unscale split per bucket (FP32 steps have no unscale).")
    for n in inp.get("notes", []) + info["notes"]:
        print(f"- {n}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
