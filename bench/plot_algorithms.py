#!/usr/bin/env python3
"""Draws the runs of bench/algorithm_curves.sh side by side into one PNG:
training loss against step (faint per step, a moving average over it) and
the real acceptance length tau against step (the step log's eval lines;
step 0 is the untrained draft of summary-0.json), one line per run. The
title names the model, steps, tokens per batch, device and date, read
from each run's resolved run.yaml and its files. It also prints a
Markdown table per run: final loss, tau at each measurement, rounds.

    python3 bench/plot_algorithms.py --out=bench/algorithm_curves.png OUT/eagle3 OUT/eagle3.1 ...

A run is named by its directory; the launcher's <run.out>/steps.jsonl,
summary-0.json and run.yaml are read. Needs matplotlib (Debian
python3-matplotlib), as tools/plot_run.py does.
"""
import argparse
import datetime
import json
import os
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
from matplotlib.lines import Line2D
import yaml

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tools"))
import plot_run  # noqa: E402  (the step log reader)


def read_run(run_dir):
    """Returns a dict: name, config, steps (step lines), evals ({step: eval}), summary."""
    path = os.path.join(run_dir, "steps.jsonl")
    steps, eval_lines = plot_run.read_step_log(path)
    evals = {r["step"]: r["eval"] for r in eval_lines}  # a resumed run's repeat replaces the first
    by_step = {s["step"]: s for s in steps}
    steps = [by_step[k] for k in sorted(by_step)]
    summary_path = os.path.join(run_dir, "summary-0.json")
    summary = json.load(open(summary_path)) if os.path.exists(summary_path) else {}
    with open(os.path.join(run_dir, "run.yaml")) as f:
        config = yaml.safe_load(f)
    untrained = summary.get("eval_untrained")
    if untrained is not None and 0 not in evals:
        evals[0] = untrained
    return {"name": os.path.basename(os.path.normpath(run_dir)), "dir": run_dir, "config": config,
            "steps": steps, "evals": dict(sorted(evals.items())), "summary": summary,
            "date": datetime.datetime.fromtimestamp(os.path.getmtime(path), datetime.timezone.utc)}


def chain_key(run):
    """The longest chain measured (eval_chain, 7 by default)."""
    for e in run["evals"].values():
        return max(e["tau"], key=int)
    return "7"


def moving_average(values, window):
    out, total = [], 0.0
    for i, v in enumerate(values):
        total += v
        if i >= window:
            total -= values[i - window]
        out.append(total / min(i + 1, window))
    return out


def label(run):
    d = run["config"]["draft"]
    if d["algorithm"] != "dflash":
        return run["name"]
    return (f"{run['name']} ({d['dflash_layers']} layers, block {d['dflash_block_size']}, "
            f"{d['dflash_loss']} loss)")


def title(runs):
    def same(get):
        values = sorted({str(get(r)) for r in runs})
        return values[0] if len(values) == 1 else "/".join(values)
    model = same(lambda r: os.path.basename(os.path.normpath(r["config"]["model"]["dir"])))
    steps = same(lambda r: r["steps"][-1]["step"])
    tokens = same(lambda r: r["config"]["schedule"]["tokens_per_batch"])
    lr = same(lambda r: r["config"]["schedule"]["lr"])
    device = same(lambda r: r["summary"].get("device") or r["config"]["students"]["devices"])
    prompts = same(lambda r: r["config"]["data"]["eval_samples"])
    new_tokens = same(lambda r: r["config"]["data"]["eval_max_new_tokens"])
    date = same(lambda r: r["date"].strftime("%Y-%m-%d"))
    return (f"{model}: {steps} steps x {tokens} tokens, lr {lr}, same data and seed; "
            f"real tau on {prompts} prompts x {new_tokens} greedy tokens; {device}, {date}")


def table(run):
    key = chain_key(run)
    s = run["summary"]
    last = s.get("last", {})
    lines = [f"{run['name']}: final loss {run['steps'][-1]['loss']:.3f} (step {run['steps'][-1]['step']}), "
             f"last {last.get('steps', '?')} steps {last.get('loss', float('nan')):.3f}, "
             f"simulated tau {last.get('simulated_tau', float('nan')):.3f}, "
             f"{s.get('seconds', float('nan')):.0f} s",
             f"| step | real tau, chain 3 / 5 / {key} | rounds (chain {key}) |", "|---|---|---|"]
    for step, e in run["evals"].items():
        t = e["tau"]
        what = " (untrained)" if step == 0 else ""
        lines.append(f"| {step}{what} | {t.get('3', float('nan')):.3f} / {t.get('5', float('nan')):.3f} / "
                     f"{t[key]:.3f} | {e['rounds'][key]} |")
    return "\n".join(lines)


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("runs", nargs="+", help="run directories (the launcher's run.out)")
    p.add_argument("--out", default="bench/algorithm_curves.png")
    p.add_argument("--window", type=int, default=8, help="moving average of the loss, in steps")
    args = p.parse_args()
    runs = [read_run(d) for d in args.runs]

    fig, (ax_loss, ax_tau) = plt.subplots(1, 2, figsize=(12, 4.6))
    gaps, handles = False, []
    for i, run in enumerate(runs):
        color = f"C{i}"
        x = [s["step"] for s in run["steps"]]
        y = [s["loss"] for s in run["steps"]]
        ax_loss.plot(x, y, color=color, alpha=0.2, linewidth=0.8)
        ax_loss.plot(x, moving_average(y, args.window), color=color, linewidth=1.6, label=label(run))
        key = chain_key(run)
        pts = [(step, e["tau"][key]) for step, e in run["evals"].items()]
        ax_tau.plot([s for s, _ in pts], [t for _, t in pts], color=color, marker="o", markersize=4,
                    linestyle="None")
        handles.append(Line2D([], [], color=color, marker="o", markersize=4, linewidth=1.6,
                              label=f"{run['name']} (chain {key})"))
        # A gap wider than eval_every (a measurement skipped) is drawn dotted.
        every = int(run["config"]["schedule"].get("eval_every") or 0)
        for (s0, t0), (s1, t1) in zip(pts, pts[1:]):
            skipped = every > 0 and s1 - s0 > every and s1 % every == 0
            gaps |= skipped
            ax_tau.plot([s0, s1], [t0, t1], color=color, linewidth=1.0 if skipped else 1.6,
                        linestyle=":" if skipped else "-")
    ax_loss.set_title("training loss (each algorithm's own scale)", fontsize=10)
    ax_loss.set_xlabel("step")
    ax_loss.set_ylabel(f"loss (faint: per step; line: mean of {args.window})")
    ax_loss.grid(alpha=0.3)
    ax_loss.legend(fontsize=8)
    ax_tau.set_title("real acceptance length tau (step 0: untrained draft)" +
                     ("\ndotted: measurements skipped, the teacher's eval set not ready" if gaps else ""),
                     fontsize=10)
    ax_tau.set_xlabel("step")
    ax_tau.set_ylabel("tokens per verify round")
    ax_tau.grid(alpha=0.3)
    ax_tau.legend(handles=handles, fontsize=8)
    fig.suptitle(title(runs), fontsize=10)
    fig.tight_layout()
    fig.savefig(args.out, dpi=80)
    plt.close(fig)
    print(f"curves: {args.out} ({os.path.getsize(args.out) // 1024} KiB)")
    for run in runs:
        print()
        print(table(run))
    return 0


if __name__ == "__main__":
    sys.exit(main())
