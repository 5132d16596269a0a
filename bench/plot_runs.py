#!/usr/bin/python3
"""Draws training runs from their JSON lines: blueprint's metrics files
(`blueprint train --metrics FILE --log-every N`, docs/metrics-jsonl.md) and
the PyTorch twin's output (`bench/torch_twin.py --json [--log-steps N]`,
the same schema), overlaid.

Three panels: the training loss (the running mean over the epoch that
"step" lines carry, and each epoch's mean), the accuracy (training and
test, per epoch), and images/s per epoch; against global steps (--x
steps, the default) or epochs (--x epochs). Writes PNG or SVG by the
output's extension (matplotlib, Debian's python3-matplotlib).

  bench/plot_runs.py -o run.png blueprint=bp.jsonl pytorch=twin.jsonl

A run is LABEL=FILE or FILE (labelled by its file name). Lines that are
not JSON objects (the twin's table without --json, a kernel line of
another kind) are skipped.
"""
import argparse
import json
import os
import sys

import matplotlib

matplotlib.use("Agg")  # files only, no display
import matplotlib.pyplot as plt  # noqa: E402


def read_run(path):
    steps, epochs = [], []
    with open(path) as f:
        for line in f:
            line = line.strip()
            if not line.startswith("{"):
                continue
            try:
                rec = json.loads(line)
            except json.JSONDecodeError:
                continue
            if rec.get("event") == "step":
                steps.append(rec)
            elif rec.get("event") == "epoch":
                epochs.append(rec)
    if not steps and not epochs:
        sys.exit(f"plot_runs: {path}: no 'step' or 'epoch' lines (docs/metrics-jsonl.md)")
    return steps, epochs


def epoch_x(rec, by_steps):
    return rec.get("global_step", rec["epoch"]) if by_steps else rec["epoch"]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("runs", nargs="+", help="LABEL=FILE.jsonl or FILE.jsonl")
    ap.add_argument("-o", "--output", required=True, help="the picture: .png or .svg")
    ap.add_argument("--x", choices=["steps", "epochs"], default="steps",
                    help="the horizontal axis of the loss and accuracy (default: steps)")
    ap.add_argument("--title", help="the figure's title")
    args = ap.parse_args()
    ext = os.path.splitext(args.output)[1].lower()
    if ext not in (".png", ".svg"):
        sys.exit(f"plot_runs: {args.output}: write .png or .svg")
    by_steps = args.x == "steps"

    fig, (ax_loss, ax_acc, ax_speed) = plt.subplots(1, 3, figsize=(13, 3.8))
    names, max_epochs = [], 1
    for i, spec in enumerate(args.runs):
        label, _, path = spec.rpartition("=")
        label = label or os.path.splitext(os.path.basename(path))[0]
        names.append(label)
        steps, epochs = read_run(path)
        max_epochs = max(max_epochs, len(epochs))
        color = f"C{i}"
        if by_steps and steps:
            ax_loss.plot([s["global_step"] for s in steps], [s["train_loss"] for s in steps],
                         color=color, lw=1.2, label=f"{label} (running mean)")
        if by_steps and steps:
            ax_acc.plot([s["global_step"] for s in steps],
                        [100 * s["train_accuracy"] for s in steps], color=color, lw=1.0,
                        alpha=0.6, label=f"{label} train (running mean)")
        if epochs:
            ax_loss.plot([epoch_x(e, by_steps) for e in epochs],
                         [e["train_loss"] for e in epochs], "o", color=color,
                         label=f"{label} epoch mean")
            xs = [epoch_x(e, by_steps) for e in epochs]
            ax_acc.plot(xs, [100 * e["train_accuracy"] for e in epochs], "s--", color=color,
                        label=f"{label} train")
            ax_acc.plot(xs, [100 * e["test_accuracy"] for e in epochs], "o-", color=color,
                        label=f"{label} test")
            for e in epochs:
                ax_acc.annotate(f"{100 * e['test_accuracy']:.2f}%", (epoch_x(e, by_steps),
                                100 * e["test_accuracy"]), textcoords="offset points",
                                xytext=(4, -12 - 10 * i), fontsize=8, color=color)
            width = 0.8 / len(args.runs)
            ex = [e["epoch"] - 0.4 + width * (i + 0.5) for e in epochs]
            ax_speed.bar(ex, [e["images_per_second"] for e in epochs], width, color=color,
                         label=label)
            for x, e in zip(ex, epochs):
                ax_speed.annotate(f"{e['images_per_second']:.0f}", (x, e["images_per_second"]),
                                  ha="center", va="bottom", fontsize=8)
    xlabel = "global step" if by_steps else "epoch"
    ax_loss.set(xlabel=xlabel, ylabel="training loss", title="loss")
    ax_loss.set_yscale("log")
    ax_acc.set(xlabel=xlabel, ylabel="accuracy (%)", title="accuracy")
    ax_speed.set(xlabel="epoch", ylabel="training images/s", title="speed")
    ax_speed.set_xticks(range(1, 1 + max_epochs))
    for ax in (ax_loss, ax_acc, ax_speed):
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    fig.suptitle(args.title or " vs ".join(names))
    fig.tight_layout()
    fig.savefig(args.output, dpi=110)
    print(f"plot_runs: wrote {args.output}")


if __name__ == "__main__":
    main()
