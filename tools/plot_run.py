#!/usr/bin/env python3
"""Draws a training run's curves from a student's --step_log into a PNG.

Panels, against the training step: loss; acc_j per TTT step; tau, both
the simulated one (1 + sum_k prod_{i<=k} acc_i, from training accuracy)
and the real acceptance length measured on the teacher's eval set (one
series per chain length); throughput (trained tokens per second); the
share of each step spent waiting for data; the learning rate. Noisy
per-step series are drawn faint with a moving average over them.

Beside the PNG it writes <png>.json listing the panels drawn (the axes'
titles, read back from the figure), the steps and the measurements, so
that tests and tools can check the picture without looking at it.

    python3 tools/plot_run.py --step_log=run/steps.jsonl --out=run/run.png

Needs matplotlib (Debian python3-matplotlib); e3_launch and tools/demo.sh
call it at the end of a run.
"""
import argparse
import json
import sys

PANELS = ["loss", "acc_j per TTT step", "tau: simulated and real",
          "throughput (tokens/s)", "data wait (% of step time)", "learning rate"]


def read_step_log(path):
    """Returns (steps, evals): the step lines and the acceptance lines."""
    steps, evals = [], []
    with open(path) as f:
        for number, line in enumerate(f, 1):
            line = line.strip()
            if not line:
                continue
            try:
                record = json.loads(line)
            except json.JSONDecodeError as e:
                raise ValueError(f"{path}:{number}: not JSON ({e.msg})")
            if "eval" in record:
                evals.append(record)
            elif "loss" in record:
                for key in ("step", "acc", "simulated_tau", "tokens", "seconds"):
                    if key not in record:
                        raise ValueError(f"{path}:{number}: a step line without \"{key}\"")
                steps.append(record)
    if not steps:
        raise ValueError(f"{path}: no training steps (expected JSON lines with \"step\" and \"loss\")")
    return steps, evals


def moving_average(values, window):
    out, total = [], 0.0
    for i, v in enumerate(values):
        total += v
        if i >= window:
            total -= values[i - window]
        out.append(total / min(i + 1, window))
    return out


def plot(steps, evals, out, title, smooth):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    x = [s["step"] for s in steps]
    window = max(1, min(smooth, len(steps) // 4 or 1))
    fig, axes = plt.subplots(2, 3, figsize=(15, 8))
    ax = dict(zip(PANELS, axes.flat))

    def series(a, values, label=None, color=None):
        a.plot(x, values, color=color, alpha=0.25, linewidth=0.8)
        a.plot(x, moving_average(values, window), color=color, label=label, linewidth=1.6)

    series(ax["loss"], [s["loss"] for s in steps], color="C0")
    ttt = len(steps[0]["acc"])
    for j in range(ttt):
        values = [s["acc"][j] if j < len(s["acc"]) else 0.0 for s in steps]
        ax["acc_j per TTT step"].plot(x, moving_average(values, window), label=f"acc_{j}",
                                      color=plt.cm.viridis(j / max(ttt - 1, 1)))
    ax["acc_j per TTT step"].legend(fontsize=7, ncol=2)
    series(ax["tau: simulated and real"], [s["simulated_tau"] for s in steps], label="simulated", color="C1")
    chains = sorted({int(c) for e in evals for c in e["eval"].get("tau", {})})
    for i, chain in enumerate(chains):
        points = [(e["step"], e["eval"]["tau"][str(chain)]) for e in evals if str(chain) in e["eval"].get("tau", {})]
        # Shorter chains get larger markers: equal taus stay visible as rings.
        ax["tau: simulated and real"].plot([p[0] for p in points], [p[1] for p in points], marker="o",
                                           markersize=9 - 2 * i, linestyle="--", color=f"C{i + 2}",
                                           label=f"real, chain {chain}")
    ax["tau: simulated and real"].legend(fontsize=7)
    series(ax["throughput (tokens/s)"], [s["tokens"] / max(s["seconds"], 1e-9) for s in steps], color="C4")
    series(ax["data wait (% of step time)"],
           [100.0 * s.get("data_wait_seconds", 0.0) / max(s["seconds"], 1e-9) for s in steps], color="C5")
    ax["learning rate"].plot(x, [s.get("lr", 0.0) for s in steps], color="C6")
    ax["learning rate"].ticklabel_format(axis="y", style="sci", scilimits=(0, 0))
    for name, a in ax.items():
        a.set_title(name)
        a.set_xlabel("step")
        a.grid(alpha=0.3)
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(out, dpi=100)
    panels = [a.get_title() for a in fig.axes if a.get_title()]
    plt.close(fig)
    return panels


def main(argv):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--step_log", required=True, help="a student's --step_log (JSON lines)")
    p.add_argument("--out", default="", help="the PNG (default: <step_log>.png)")
    p.add_argument("--title", default="", help="the figure's title (default: the step log's path)")
    p.add_argument("--smooth", type=int, default=10, help="steps in the moving average")
    args = p.parse_args(argv)
    out = args.out or args.step_log + ".png"
    try:
        steps, evals = read_step_log(args.step_log)
    except (OSError, ValueError) as e:
        print(f"plot_run: error: {e}", file=sys.stderr)
        return 1
    panels = plot(steps, evals, out, args.title or args.step_log, args.smooth)
    with open(out + ".json", "w") as f:
        json.dump({"png": out, "panels": panels, "steps": len(steps), "evals": len(evals),
                   "first_step": steps[0]["step"], "last_step": steps[-1]["step"]}, f, indent=2)
    print(f"plot_run: {out} ({len(steps)} steps, {len(evals)} acceptance measurements)")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
