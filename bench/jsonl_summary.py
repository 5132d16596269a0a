#!/usr/bin/python3
"""Summarizes a per-epoch metrics JSONL file (blueprint's --metrics output or
bench/torch_twin.py --json) as one line of shell-friendly fields:

    final_test_acc_percent median_images_per_s median_epoch_seconds epochs per_epoch_acc

per_epoch_acc is a comma-separated list of test accuracies in percent. A
missing value is printed as "n/a". Accuracies given as fractions (<= 1) are
scaled to percent. Lines that are not per-epoch records (per-step lines
written with --log-every, which carry no test accuracy) are skipped.

Field names are looked up among a few spellings so the script survives small
schema differences; docs/metrics-jsonl.md is the reference for blueprint's.

Usage: jsonl_summary.py FILE.jsonl"""
import json
import statistics
import sys

ACC = ("test_acc", "test_accuracy", "eval_acc", "eval_accuracy", "accuracy")
IPS = ("images_per_s", "images_per_sec", "images_per_second", "train_images_per_s", "ips",
       "throughput")
SEC = ("seconds", "epoch_seconds", "time_s", "elapsed_s", "wall_s")
KIND = ("kind", "type", "event", "record")


def pick(rec, names):
    for n in names:
        v = rec.get(n)
        if isinstance(v, (int, float)) and not isinstance(v, bool):
            return float(v)
    return None


def main():
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    recs = []
    try:
        with open(sys.argv[1]) as f:
            for line in f:
                line = line.strip()
                if not line:
                    continue
                try:
                    rec = json.loads(line)
                except json.JSONDecodeError:
                    continue
                if not isinstance(rec, dict):
                    continue
                kind = next((rec[k] for k in KIND if isinstance(rec.get(k), str)), "epoch")
                if kind != "epoch" or pick(rec, ACC) is None:
                    continue
                recs.append(rec)
    except OSError:
        recs = []
    if not recs:
        print("n/a n/a n/a 0 n/a")
        return
    accs = [pick(r, ACC) for r in recs]
    accs = [a * 100.0 if a <= 1.0 else a for a in accs]
    ips = [v for v in (pick(r, IPS) for r in recs) if v is not None]
    sec = [v for v in (pick(r, SEC) for r in recs) if v is not None]
    fmt = lambda v, p: "n/a" if v is None else f"{v:.{p}f}"  # noqa: E731
    print(fmt(accs[-1], 2), fmt(statistics.median(ips) if ips else None, 0),
          fmt(statistics.median(sec) if sec else None, 1), len(recs),
          ",".join(f"{a:.2f}" for a in accs))


if __name__ == "__main__":
    main()
