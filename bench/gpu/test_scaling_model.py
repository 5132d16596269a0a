#!/usr/bin/env python3
"""bench/gpu/scaling_model.py against hand-computed figures on a small
fixture: three layers, a 100 ms step, 100 GB/s bus bandwidth.

The fixture's step (ms per node, in execution order): conv1.fwd 10,
conv2.fwd 10, fc.fwd 10, loss 0, fc.bwd_filter 10 (ends at 40),
fc.bwd_data 10, conv2.bwd_filter 10 (60), conv2.bwd_data 10,
conv1.bwd_filter 10 (80: the end of backward), unscale 2 (82: the COMM
point), update 18. Buckets: deep conv = conv2's 4e8 bytes (ready at 60),
rest = fc's 2e8 + conv1's 1e8 (ready at 80), BN statistics 1e8.
Ring factor 2(N-1)/N: 1 at N=2, 1.5 at N=4, 1.75 at N=8, so at 100 GB/s
the buckets take 4, 3, 1 ms at N=2 (8 in all), 12 ms at N=4, 14 at N=8.
"""
import json
import os
import subprocess
import sys
import tempfile
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
SCRIPT = os.path.join(HERE, "scaling_model.py")
sys.path.insert(0, HERE)

import scaling_model  # noqa: E402

NODES = [("conv1.fwd", "forward", 10), ("conv2.fwd", "forward", 10), ("fc.fwd", "forward", 10),
         ("loss.fwd_bwd", "loss", 0), ("fc.bwd_filter", "backward", 10),
         ("fc.bwd_data", "backward", 10), ("conv2.bwd_filter", "backward", 10),
         ("conv2.bwd_data", "backward", 10), ("conv1.bwd_filter", "backward", 10),
         ("unscale G16->G", "cast_grad", 2), ("update.decay", "update", 18)]
STEPS = 2


def plan_doc():
    regions = [("B", 1e8), ("W_CONV_FIRST", 256), ("G_BN_BIAS", 0), ("G_BN_WEIGHT", 0),
               ("G_FC_BIAS", 0), ("G_FC_WEIGHT", 2e8), ("G_CONV_FIRST", 1e8), ("G_CONV_DEEP", 4e8)]
    tensors = [("conv1.w", "W_CONV_FIRST", 256), ("fc.w.grad", "G_FC_WEIGHT", 2e8),
               ("conv1.w.grad", "G_CONV_FIRST", 1e8), ("conv2.w.grad", "G_CONV_DEEP", 4e8)]
    return {"variants": [{"name": "train", "batch": 4, "height": 8, "width": 8,
                          "total_bytes": 0,
                          "regions": [{"name": n, "base": 0, "bytes": int(b)} for n, b in regions],
                          "tensors": [{"id": i, "name": n, "region": r, "dtype": "fp32",
                                       "shape": [1, 1, 1, 1], "padded_c": 1, "offset": 0,
                                       "slot_bytes": int(b)}
                                      for i, (n, r, b) in enumerate(tensors)]}]}


def profile_lines(device="cpu"):
    nodes = []
    for name, seg, ms in NODES:
        conv_fc = name.split(".")[0] in ("conv1", "conv2", "fc") and seg in ("forward", "backward")
        nodes.append({"node": name, "segment": seg, "op": "x", "impl": "x",
                      "flops_per_call": 10 if conv_fc else 0, "calls": STEPS,
                      "ns": int(ms * 1e6 * STEPS)})
    step_ns = int(100e6 * STEPS)
    return [{"event": "kernels", "device": device},
            {"event": "epoch", "epoch": 1},
            {"event": "profile", "rank": 0,
             "variants": [{"variant": "train", "steps": STEPS, "step_ns": step_ns,
                           "kernel_ns": step_ns, "nodes": nodes}]}]


class ScalingModel(unittest.TestCase):
    def setUp(self):
        self.tmp = tempfile.TemporaryDirectory()
        self.plan = self.write("plan.json", [plan_doc()])
        self.profile = self.write("profile.jsonl", profile_lines())

    def tearDown(self):
        self.tmp.cleanup()

    def write(self, name, docs):
        path = os.path.join(self.tmp.name, name)
        with open(path, "w") as f:
            for d in docs:
                f.write(json.dumps(d) + "\n")
        return path

    def run_model(self, *extra, profile=None):
        out = os.path.join(self.tmp.name, "out.json")
        args = ["--plan", self.plan, "--profile", profile or self.profile, "--busbw-gbs", "100",
                "--latency-us", "0", "--compare-busbw-gbs", "0", "--json", out, *extra]
        r = subprocess.run([sys.executable, SCRIPT, *args], capture_output=True, text=True)
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertIn("Model, not a measurement", r.stdout)
        self.assertIn("9,310 img/s on 8xA100", r.stdout)
        with open(out) as f:
            doc = json.load(f)
        return {row["gpus"]: row for row in doc["rows"]}, doc

    def exposed(self, rows, scenario):
        return {n: round(r["scenarios"][scenario]["exposed_ms"], 9) for n, r in rows.items()}

    def test_ring_formula(self):
        self.assertEqual(scaling_model.ring_ms(4e8, 1, 100, 5), 0.0)
        self.assertAlmostEqual(scaling_model.ring_ms(4e8, 2, 100, 0), 4.0)
        self.assertAlmostEqual(scaling_model.ring_ms(4e8, 8, 100, 0), 7.0)
        # latency: 2(N-1) ring steps of 10 us at N = 8
        self.assertAlmostEqual(scaling_model.ring_ms(4e8, 8, 100, 10), 7.14)

    def test_bucket_times_and_the_three_schedules(self):
        rows, doc = self.run_model()
        self.assertEqual({n: round(r["comm_ms"], 9) for n, r in rows.items()},
                         {1: 0.0, 2: 8.0, 4: 12.0, 8: 14.0})
        self.assertAlmostEqual(rows[8]["bucket_ms"]["deep conv"], 7.0)
        self.assertAlmostEqual(doc["info"]["comm_point_ms"], 82.0)
        self.assertAlmostEqual(doc["info"]["bucket_ready_ms"]["deep conv"], 60.0)
        self.assertAlmostEqual(doc["info"]["bucket_ready_ms"]["rest"], 80.0)
        self.assertEqual(self.exposed(rows, "serial"), {1: 0.0, 2: 8.0, 4: 12.0, 8: 14.0})
        # deep 60-64, rest 80-83, BN 83-84: 2 ms past 82 (N=4: 86; N=8: 87)
        self.assertEqual(self.exposed(rows, "bucket"), {1: 0.0, 2: 2.0, 4: 4.0, 8: 5.0})
        # fc 40-42, conv2 60-64, conv1 80-81, BN 81-82 (N=4: 83; N=8: 83.5)
        self.assertEqual(self.exposed(rows, "layer"), {1: 0.0, 2: 0.0, 4: 1.0, 8: 1.5})
        s = rows[2]["scenarios"]["serial"]
        self.assertAlmostEqual(s["img_s"], 2 * 4 * 1000 / 108)
        self.assertAlmostEqual(s["efficiency"], 100 / 108)
        self.assertAlmostEqual(rows[1]["scenarios"]["bucket"]["img_s"], 40.0)

    def test_measured_overlap_clamps_the_hidden_time(self):
        half = self.write("comm.jsonl", [
            {"event": "epoch", "comm_ms_per_step": 12.0, "comm_overlap_ms_per_step": 4.0},
            {"event": "epoch", "comm_ms_per_step": 10.0, "comm_overlap_ms_per_step": 5.0}])
        rows, doc = self.run_model("--comm", half)
        self.assertAlmostEqual(doc["info"]["overlap_fraction"], 0.5)  # the last epoch line's
        # hidden = min(schedule's hidden, 0.5 * comm): N=8 bucket min(9, 7) -> 7 exposed
        self.assertEqual(self.exposed(rows, "bucket"), {1: 0.0, 2: 4.0, 4: 6.0, 8: 7.0})
        # the layer what-if and serial keep their schedules' figures
        self.assertEqual(self.exposed(rows, "layer"), {1: 0.0, 2: 0.0, 4: 1.0, 8: 1.5})
        self.assertEqual(self.exposed(rows, "serial"), {1: 0.0, 2: 8.0, 4: 12.0, 8: 14.0})
        most = self.write("comm2.jsonl", [{"event": "epoch", "comm_ms_per_step": 10.0,
                                           "comm_overlap_ms_per_step": 9.0}])
        rows, _ = self.run_model("--comm", most)
        # 0.9 * comm exceeds what the schedule can hide: the schedule's bound stands
        self.assertEqual(self.exposed(rows, "bucket"), {1: 0.0, 2: 2.0, 4: 4.0, 8: 5.0})

    def test_missing_overlap_metrics_leave_a_note(self):
        # graph steps (or one stream) time no collectives: 0, as absent
        for i, line in enumerate([{"event": "epoch", "train_loss": 1.0},
                                  {"event": "epoch", "comm_ms_per_step": 0,
                                   "comm_overlap_ms_per_step": 0}]):
            rows, doc = self.run_model("--comm", self.write(f"comm{i}.jsonl", [line]))
            self.assertIsNone(doc["info"]["overlap_fraction"])
            self.assertTrue(any("not measured" in n for n in doc["inputs"]["notes"]))
            self.assertEqual(self.exposed(rows, "bucket"), {1: 0.0, 2: 2.0, 4: 4.0, 8: 5.0})

    def test_the_graph_steps_set_the_step_time(self):
        rate = self.write("rate.jsonl", [{"event": "step", "samples": 8, "seconds": 1.0},
                                         {"event": "step", "samples": 48, "seconds": 1.5}])
        rows, doc = self.run_model("--throughput", rate)
        self.assertAlmostEqual(doc["inputs"]["step_ms"], 50.0)  # 40 images in 0.5 s, batch 4
        # every node time halves: deep 30-34, rest 40-43, BN 43-44, COMM point 41
        self.assertEqual(self.exposed(rows, "bucket")[2], 3.0)
        self.assertAlmostEqual(rows[1]["scenarios"]["serial"]["img_s"], 80.0)

    def test_flop_shares_on_a_device_without_node_times(self):
        cuda = self.write("cuda.jsonl", profile_lines("cuda"))
        rows, doc = self.run_model(profile=cuda)
        self.assertEqual(doc["inputs"]["node_times"], "flops")
        # eight conv/fc nodes of equal FLOPs, 12.5 ms each: deep ready at 75, rest at 100
        self.assertAlmostEqual(doc["info"]["bucket_ready_ms"]["deep conv"], 75.0)
        self.assertAlmostEqual(doc["info"]["comm_point_ms"], 100.0)
        self.assertEqual(self.exposed(rows, "bucket")[2], 4.0)

    def test_efficiency_never_rises_with_more_gpus(self):
        rows, _ = self.run_model("--gpus", "1,2,3,4,5,6,7,8", "--latency-us", "3")
        for s in ("serial", "bucket", "layer"):
            eff = [rows[n]["scenarios"][s]["efficiency"] for n in range(1, 9)]
            self.assertEqual(eff[0], 1.0)
            for a, b in zip(eff, eff[1:]):
                self.assertLessEqual(b, a + 1e-12, s)
            ips = [rows[n]["scenarios"][s]["img_s"] for n in range(1, 9)]
            self.assertEqual(ips, sorted(ips), s)

    def test_bad_inputs_fail_with_one_line(self):
        bad = self.write("bad.json", [{"variants": [{"batch": 1, "regions": [], "tensors": []}]}])
        r = subprocess.run([sys.executable, SCRIPT, "--plan", bad, "--profile", self.profile],
                           capture_output=True, text=True)
        self.assertNotEqual(r.returncode, 0)
        self.assertIn("scaling_model: ", r.stderr)
        self.assertEqual(len(r.stderr.strip().splitlines()), 1)
        noprof = self.write("noprof.jsonl", [{"event": "epoch"}])
        r = subprocess.run([sys.executable, SCRIPT, "--plan", self.plan, "--profile", noprof],
                           capture_output=True, text=True)
        self.assertNotEqual(r.returncode, 0)
        self.assertIn("no profile line", r.stderr)

    def test_saved_inputs_give_the_same_model(self):
        saved = os.path.join(self.tmp.name, "inputs.json")
        rows, _ = self.run_model("--save-inputs", saved)
        out = os.path.join(self.tmp.name, "again.json")
        r = subprocess.run([sys.executable, SCRIPT, "--inputs", saved, "--busbw-gbs", "100",
                            "--latency-us", "0", "--compare-busbw-gbs", "0", "--json", out],
                           capture_output=True, text=True)
        self.assertEqual(r.returncode, 0, r.stderr)
        with open(out) as f:
            again = {row["gpus"]: row for row in json.load(f)["rows"]}
        self.assertEqual(again, rows)


@unittest.skipUnless(os.environ.get("BP_BLUEPRINT"), "BP_BLUEPRINT (the blueprint executable) unset")
class Vgg16bnPlan(unittest.TestCase):
    """The live `blueprint plan models/vgg16bn.yaml --amp --json` with a CPU
    profile recorded at batch 2 (testdata/vgg16bn-cpu-profile.jsonl)."""

    def test_buckets_hold_the_models_gradients(self):
        with tempfile.TemporaryDirectory() as tmp:
            plan = os.path.join(tmp, "plan.json")
            with open(plan, "w") as f:
                subprocess.run([os.environ["BP_BLUEPRINT"], "plan",
                                os.path.join(HERE, "..", "..", "models", "vgg16bn.yaml"),
                                "--batch", "128", "--amp", "--json"], stdout=f, check=True)
            out = os.path.join(tmp, "out.json")
            r = subprocess.run([sys.executable, SCRIPT, "--plan", plan, "--profile",
                                os.path.join(HERE, "testdata", "vgg16bn-cpu-profile.jsonl"),
                                "--step-ms", "40", "--json", out], capture_output=True, text=True)
            self.assertEqual(r.returncode, 0, r.stderr)
            with open(out) as f:
                doc = json.load(f)
        b = {x["name"]: x["bytes"] for x in doc["inputs"]["buckets"]}
        # FP32 gradients: conv1_2..conv5_3 (14,708,736 weights); fc6-8 weights and
        # biases, conv1_1, BN weights and biases (123,653,032); BN running mean
        # and var (2 x 4,224); a tensor's slot adds at most 512 bytes (256-byte
        # multiples and 16 readable tail bytes: docs/plan-json.md)
        for name, params, tensors in (("deep conv", 14708736, 12), ("rest", 123653032, 33),
                                      ("BN statistics", 8448, 26)):
            self.assertGreaterEqual(b[name], 4 * params, name)
            self.assertLessEqual(b[name], 4 * params + 512 * tensors, name)
        self.assertTrue(doc["inputs"]["amp"])
        rows = {x["gpus"]: x for x in doc["rows"]}
        self.assertAlmostEqual(rows[8]["comm_ms"], sum(
            scaling_model.ring_ms(v, 8, 360, 1.5) for v in b.values()))
        for s in ("serial", "bucket", "layer"):
            eff = [rows[n]["scenarios"][s]["efficiency"] for n in (1, 2, 4, 8)]
            self.assertEqual(eff, sorted(eff, reverse=True), s)
        # the deep conv gradients are complete before the end of backward, the rest at its end
        info = doc["info"]
        self.assertLess(info["bucket_ready_ms"]["deep conv"], info["bucket_ready_ms"]["rest"])
        self.assertAlmostEqual(info["bucket_ready_ms"]["rest"], info["backward_end_ms"])


if __name__ == "__main__":
    unittest.main()
