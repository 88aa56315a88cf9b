#!/usr/bin/env python3
"""Reads the step logs of bench/backend_accuracy.sh (RUN_DIR/{hf,sgl,hf_repeat}/steps.jsonl),
prints acc_j per TTT step j averaged over the last 100 steps of each run, the
sgl - hf difference and the hf - hf_repeat noise floor, checks |delta acc_j| <=
0.5 points at every j, and draws the curves of both backends per j to --out.

    python3 bench/plot_backend_accuracy.py RUN_DIR --out bench/backend_accuracy.png
With --runs reference,fast,fast_repeat it compares the student's kernels
(bench/backend_accuracy.sh's MODE=kernels) instead.
Exit status 1 when the check fails.
"""
import argparse
import json
import os
import sys


def load(path):
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]


def tail_mean(steps, j, n):
    tail = steps[-n:]
    return sum(s["acc"][j] for s in tail) / len(tail)


def smooth(values, window):
    out, acc = [], 0.0
    for i, v in enumerate(values):
        acc += v
        if i >= window:
            acc -= values[i - window]
        out.append(acc / min(i + 1, window))
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("run_dir")
    ap.add_argument("--out", default="bench/backend_accuracy.png")
    ap.add_argument("--last", type=int, default=100, help="steps averaged at the end")
    ap.add_argument("--bound", type=float, default=0.5, help="max |delta acc_j| in points")
    ap.add_argument("--runs", default="hf,sgl,hf_repeat", help="baseline,candidate,baseline repeat")
    ap.add_argument("--what", default="teacher", help="what the runs differ in, for the titles")
    args = ap.parse_args()
    base, other, repeat = args.runs.split(",")

    runs = {}
    for name in (base, other, repeat):
        path = os.path.join(args.run_dir, name, "steps.jsonl")
        if os.path.exists(path):
            runs[name] = load(path)
    if base not in runs or other not in runs:
        sys.exit(f"{args.run_dir}: need {base}/steps.jsonl and {other}/steps.jsonl")
    # The rest of this script names the three runs by their roles.
    runs = {("hf" if k == base else "sgl" if k == other else "hf_repeat"): v for k, v in runs.items()}
    ttt = len(runs["hf"][0]["acc"])
    steps = min(len(r) for r in runs.values())
    print(f"steps: " + ", ".join(f"{k} {len(v)}" for k, v in runs.items()) + f"; mean of the last {args.last}")
    header = (f"| j | {base} acc_j | {other} acc_j | {other} - {base} (points) |"
              + (f" {repeat} - {base} (noise floor) |" if "hf_repeat" in runs else ""))
    print(header)
    print("|---" * (header.count("|") - 1) + "|")
    worst, rows = 0.0, []
    for j in range(ttt):
        hf = tail_mean(runs["hf"][:steps], j, args.last)
        sg = tail_mean(runs["sgl"][:steps], j, args.last)
        d = 100 * (sg - hf)
        worst = max(worst, abs(d))
        row = {"j": j, "hf": hf, "sgl": sg, "delta_points": d}
        line = f"| {j} | {100*hf:.2f}% | {100*sg:.2f}% | {d:+.2f} |"
        if "hf_repeat" in runs:
            noise = 100 * (tail_mean(runs["hf_repeat"][:steps], j, args.last) - hf)
            row["noise_points"] = noise
            line += f" {noise:+.2f} |"
        rows.append(row)
        print(line)
    ok = worst <= args.bound
    print(f"max |{other} - {base}| = {worst:.2f} points (bound {args.bound}): {'PASS' if ok else 'FAIL'}")
    print(json.dumps({"bench": "training_accuracy", "runs": [base, other, repeat], "steps": steps, "last": args.last, "per_j": rows,
                      "max_abs_delta_points": worst, "bound_points": args.bound, "pass": ok}))

    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, (left, right) = plt.subplots(1, 2, figsize=(14, 5.5), gridspec_kw={"width_ratios": [3, 2]})
    colors = plt.cm.viridis([j / max(ttt - 1, 1) for j in range(ttt)])
    x = [s["step"] for s in runs["hf"][:steps]]
    for j in range(ttt):
        for name, style in (("hf", "-"), ("sgl", "--")):
            y = smooth([100 * s["acc"][j] for s in runs[name][:steps]], 50)
            shown = base if name == "hf" else other
            left.plot(x, y, style, color=colors[j], linewidth=1.2, label=f"acc_{j} {shown}" if j in (0, ttt - 1) else None)
    left.set_xlabel("training step")
    left.set_ylabel("acc_j (%), moving mean of 50 steps")
    left.set_title(f"EAGLE-3 draft on tiny-code-llama: {base} {args.what} (solid) vs {other} (dashed)")
    left.legend(loc="lower right", fontsize=8)
    left.grid(alpha=0.3)
    js = list(range(ttt))
    right.plot(js, [100 * r["hf"] for r in rows], "o-", label=base)
    right.plot(js, [100 * r["sgl"] for r in rows], "s--", label=other)
    for r in rows:
        right.annotate(f"{r['delta_points']:+.2f}", (r["j"], 100 * r["sgl"]), textcoords="offset points",
                       xytext=(0, 8), ha="center", fontsize=8)
    right.set_xlabel("TTT step j")
    right.set_ylabel(f"acc_j (%), mean of the last {args.last} steps")
    right.set_title(f"{other} - {base} per j (points); max |delta| {worst:.2f}")
    right.legend()
    right.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(args.out, dpi=110)
    print(f"plot: {args.out}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
