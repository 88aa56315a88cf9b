#!/usr/bin/python3
"""The documentation's cheap CPU commands, run as written from the root.

- `e3_launch --config=examples/configs/X.yaml --plan` for every bundled
  config: the plan is printed; the bundled demo's exits 0; a config for
  another machine (a model under /models, data under /data) exits 2 naming
  only those inputs, each outside the repository.
- `teacher_server --config=examples/configs/demo.yaml --preview_data=2`
  (docs/guides/data.md): exits 0 with two previewed samples
  (tests/teacher_server/preview_data_test.py checks the preview itself).
- The demo's main job (`tools/demo.sh` without its apt and build steps,
  which CI runs itself), shortened to 24 steps: `e3_launch
  --config=examples/configs/demo.yaml` exits 0, exports the draft and
  its summary shows the loss falling.

  readme_commands_test.py --build_dir=build --source_dir=.
"""
import argparse
import glob
import json
import os
import re
import subprocess
import sys
import tempfile

MISSING = re.compile(r"^e3_launch: error: (?P<config>\S+): (?P<key>[a-z_]+\.[a-z_]+): (?P<path>/\S+): "
                     r"(not a directory|no such file)$")


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--build_dir", required=True)
    parser.add_argument("--source_dir", required=True)
    args = parser.parse_args()
    build = os.path.abspath(args.build_dir)
    src = os.path.abspath(args.source_dir)
    launcher = os.path.join(build, "launcher", "e3_launch")
    failures = []
    configs = sorted(os.path.relpath(p, src) for p in glob.glob(os.path.join(src, "examples/configs/*.yaml")))
    if "examples/configs/demo.yaml" not in configs:
        failures.append(f"examples/configs/demo.yaml is missing; configs: {configs}")
    for config in configs:
        r = subprocess.run([launcher, f"--config={config}", "--plan"], cwd=src, capture_output=True, text=True,
                           timeout=60)
        print(f"$ e3_launch --config={config} --plan  -> exit {r.returncode}")
        if not r.stdout.startswith(f"e3_launch plan ({config})"):
            failures.append(f"{config}: no plan printed:\n{r.stdout}{r.stderr}")
        errors = [line for line in r.stderr.splitlines() if line.strip()]
        if config == "examples/configs/demo.yaml":
            if r.returncode != 0:
                failures.append(f"{config}: exit {r.returncode}, expected 0 (every input is bundled):\n{r.stderr}")
            continue
        if r.returncode not in (0, 2):
            failures.append(f"{config}: exit {r.returncode}:\n{r.stderr}")
        for line in errors:
            m = MISSING.match(line)
            if not m or m["config"] != config or m["path"].startswith(src + "/"):
                failures.append(f"{config}: an error other than an input of another machine: {line}")
        if r.returncode == 2 and not errors:
            failures.append(f"{config}: exit 2 without naming what is missing")

    teacher = os.path.join(build, "teacher_server", "teacher_server")
    r = subprocess.run([teacher, "--config=examples/configs/demo.yaml", "--preview_data=2"], cwd=src,
                       capture_output=True, text=True, timeout=120)
    print(f"$ teacher_server --config=examples/configs/demo.yaml --preview_data=2  -> exit {r.returncode}")
    headers = re.findall(r"^--- examples/data/train_conversations.jsonl:\d+: conversation, .*$", r.stdout, re.M)
    if r.returncode != 0 or len(headers) != 2 or "[[" not in r.stdout:
        failures.append(f"the data preview: exit {r.returncode}, {len(headers)} samples:\n{r.stdout[-2000:]}"
                        f"{r.stderr}")

    failures += demo_run(launcher, src)

    for f in failures:
        print("FAIL: " + f)
    print(f"readme_commands_test: {len(configs)} plan(s), the preview and the demo run, {len(failures)} failure(s)")
    return 1 if failures else 0


def demo_run(launcher, src):
    """The demo's run config through the launcher, shortened; its failures."""
    with tempfile.TemporaryDirectory() as out:
        cmd = [launcher, "--config=examples/configs/demo.yaml", f"run.out={out}", "schedule.max_steps=24",
               "schedule.eval_every=0", "schedule.checkpoint_every=12", "data.eval_samples=4",
               "data.eval_max_new_tokens=16"]
        r = subprocess.run(cmd, cwd=src, capture_output=True, text=True, timeout=300)
        print(f"$ e3_launch --config=examples/configs/demo.yaml (24 steps)  -> exit {r.returncode}")
        if r.returncode != 0:
            return [f"the demo run: exit {r.returncode}:\n{r.stdout[-3000:]}{r.stderr[-2000:]}"]
        summary_path = os.path.join(out, "summary-0.json")
        if not os.path.isfile(summary_path) or not os.path.isfile(os.path.join(out, "draft", "model.safetensors")):
            return [f"the demo run: no summary-0.json or exported draft in {os.listdir(out)}"]
        with open(summary_path, encoding="utf-8") as f:
            summary = json.load(f)
        first, last = summary["first"]["loss"], summary["last"]["loss"]
        print(f"  demo: {summary['steps']} steps, loss {first:.3f} -> {last:.3f}")
        if not last < first:
            return [f"the demo run: the loss did not fall ({first} -> {last})"]
    return []


if __name__ == "__main__":
    sys.exit(main())
