#!/usr/bin/env python3
"""Draws the real acceptance length (tau, chain 7) over training steps for
each run of bench/acceptance_choices.sh, from their step logs (the lines
with an "eval" entry), into a PNG.

    python3 bench/plot_acceptance.py RUN_DIR bench/acceptance_curve.png
"""
import glob
import json
import os
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt


def curve(path, chain="7"):
    points = {}
    with open(path) as f:
        for line in f:
            row = json.loads(line)
            if "eval" in row:
                points[row["step"]] = row["eval"]["tau"][chain]
    return sorted(points.items())


def main(run_dir, out_png):
    fig, ax = plt.subplots(figsize=(8, 4.5))
    for path in sorted(glob.glob(os.path.join(run_dir, "*.steps.jsonl"))):
        name = os.path.basename(path)[: -len(".steps.jsonl")]
        pts = curve(path)
        if pts:
            ax.plot([s for s, _ in pts], [t for _, t in pts], marker="o", markersize=3, label=name)
    ax.set_xlabel("training step (2048-token batches)")
    ax.set_ylabel("real acceptance length tau, chain 7")
    ax.set_title("tiny-code-llama, 100 eval prompts x 256 greedy tokens (nvidia-h200)")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(out_png, dpi=110)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
