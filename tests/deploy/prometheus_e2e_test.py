#!/usr/bin/env python3
"""A real Prometheus scrapes a real training run, and holds what the student logged.

Starts Debian's `prometheus` on loopback with deploy/prometheus/prometheus.yml
(targets replaced by this run's ports, a 1 s scrape interval, the rules of
deploy/prometheus/alerts.yml), then a teacher_server on the bundled tiny model
with eval prompts and a student_trainer that trains 30 steps and measures the
real acceptance length every 10. Afterwards it reads every sample Prometheus
stored through its HTTP API (/api/v1/query) and compares each scrape with the
student's --step_log and --summary_json.

The comparison is exact. prometheus-cpp writes a sample with 16 significant
digits (`%.16g`), Prometheus parses that to the nearest double and its API
prints it back exactly (Go's shortest round-trip format); the step log
(nlohmann::json) prints every double exactly. So the value Prometheus holds
must be float('%.16g' % logged), bit for bit, and a counter must be that of
the sum of the logged per-step values in step order (the counter adds them in
the same order). The student updates its families under the lock its
/metrics collection takes, so one scrape is one step: steps_total = n in a
scrape means every other sample of that scrape is step n's.

It also writes the metric names the two binaries actually served on /metrics
(--names_out), which deploy_metric_names_test checks the dashboard and the
alert rules against. A missing `prometheus` binary fails the test: CI
installs it (tools/install_deps.sh).
"""

import argparse
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.parse
import urllib.request

import yaml

MAX_STEPS = 30
EVAL_EVERY = 10
TTT_LENGTH = 7


class Failure(Exception):
    pass


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def http_get(url, timeout=5):
    with urllib.request.urlopen(url, timeout=timeout) as r:
        return r.read().decode()


def f16(x):
    """The double Prometheus holds for a sample prometheus-cpp wrote from x."""
    return float("%.16g" % x)


def write_prometheus_config(source, out_path, rules, teacher, student):
    with open(source) as f:
        cfg = yaml.safe_load(f)
    jobs = {j.get("job_name"): j for j in cfg.get("scrape_configs", [])}
    for name in ("e3-teacher", "e3-student"):
        if name not in jobs:
            raise Failure(f"{source}: scrape_configs has no job_name {name!r} (the alert rules use it)")
        if not jobs[name].get("static_configs"):
            raise Failure(f"{source}: job {name!r} has no static_configs to point at this run's ports")
    jobs["e3-teacher"]["static_configs"] = [{"targets": [teacher]}]
    jobs["e3-student"]["static_configs"] = [{"targets": [student]}]
    cfg.setdefault("global", {})
    cfg["global"]["scrape_interval"] = "1s"
    cfg["global"]["evaluation_interval"] = "1s"
    if cfg.get("rule_files") != ["alerts.yml"]:
        raise Failure(f"{source}: rule_files must be [alerts.yml] (the rules shipped beside it), "
                      f"found {cfg.get('rule_files')!r}")
    cfg["rule_files"] = [rules]
    with open(out_path, "w") as f:
        yaml.safe_dump(cfg, f)


def exported_names(text):
    """Sample names in a Prometheus text exposition."""
    names = set()
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        names.add(line.split("{", 1)[0].split(" ", 1)[0])
    return names


class Procs:
    def __init__(self, tmp):
        self.tmp = tmp
        self.procs = {}

    def start(self, name, argv):
        log = open(os.path.join(self.tmp, name + ".log"), "w")
        self.procs[name] = (subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT), log)
        return self.procs[name][0]

    def log_tail(self, name, lines=30):
        path = os.path.join(self.tmp, name + ".log")
        if not os.path.exists(path):
            return ""
        with open(path, errors="replace") as f:
            return "".join(f.readlines()[-lines:])

    def stop_all(self):
        for p, log in self.procs.values():
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
        for p, log in self.procs.values():
            try:
                p.wait(timeout=20)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
            log.close()


def wait_for(what, check, timeout, procs=None):
    deadline = time.time() + timeout
    while time.time() < deadline:
        if procs is not None:
            for name, (p, _) in procs.procs.items():
                if p.poll() is not None and p.returncode != 0:
                    raise Failure(f"{name} exited with {p.returncode} while waiting for {what}:\n"
                                  + procs.log_tail(name))
        v = check()
        if v:
            return v
        time.sleep(0.2)
    raise Failure(f"timed out after {timeout}s waiting for {what}")


def query(prom, expr, at):
    url = f"{prom}/api/v1/query?" + urllib.parse.urlencode({"query": expr, "time": f"{at:.3f}"})
    reply = json.loads(http_get(url))
    if reply.get("status") != "success":
        raise Failure(f"Prometheus query {expr!r}: {reply}")
    return reply["data"]


def samples_by_time(prom, expr, at, key_label=None):
    """{scrape timestamp: value} (or {ts: {label value: value}}) of a range query."""
    data = query(prom, expr, at)
    if data["resultType"] != "matrix":
        raise Failure(f"{expr}: expected a matrix, got {data['resultType']}")
    out = {}
    for series in data["result"]:
        for ts, v in series["values"]:
            if key_label is None:
                if ts in out:
                    raise Failure(f"{expr}: more than one series ({series['metric']})")
                out[ts] = float(v)
            else:
                out.setdefault(ts, {})[series["metric"][key_label]] = float(v)
    return out


def read_step_log(path):
    steps, evals = {}, []
    with open(path) as f:
        for n, line in enumerate(f, 1):
            j = json.loads(line)
            if "eval" in j:
                evals.append(j)
            elif "loss" in j:
                steps[j["step"]] = j
            else:
                raise Failure(f"{path}:{n}: neither a step nor an eval line: {line.strip()}")
    if sorted(steps) != list(range(1, MAX_STEPS + 1)):
        raise Failure(f"{path}: expected steps 1..{MAX_STEPS}, found {sorted(steps)}")
    return steps, evals


def expect_equal(what, got, want):
    if got != want:
        raise Failure(f"{what}: Prometheus holds {got!r}, the student logged {want!r}")


def check_scrapes(prom, at, steps, evals, summary):
    rng = "[10m]"
    sel = '{job="e3-student"}'
    steps_total = samples_by_time(prom, f"e3_student_steps_total{sel}{rng}", at)
    series = {
        "tokens": samples_by_time(prom, f"e3_student_tokens_total{sel}{rng}", at),
        "seconds": samples_by_time(prom, f"e3_student_step_seconds_total{sel}{rng}", at),
        "data_wait_seconds": samples_by_time(prom, f"e3_student_data_wait_seconds_total{sel}{rng}", at),
        "loss": samples_by_time(prom, f"e3_student_loss{sel}{rng}", at),
        "lr": samples_by_time(prom, f"e3_student_learning_rate{sel}{rng}", at),
        "simulated_tau": samples_by_time(prom, f"e3_student_tau{sel}{rng}", at),
    }
    acc = samples_by_time(prom, f"e3_student_acc{sel}{rng}", at, key_label="step")
    real_tau = samples_by_time(prom, f"e3_student_eval_acceptance_length{sel}{rng}", at, key_label="chain")

    # Cumulative sums in step order, as the counters add them.
    cum = {"tokens": [0.0], "seconds": [0.0], "data_wait_seconds": [0.0]}
    for s in range(1, MAX_STEPS + 1):
        for k in cum:
            cum[k].append(cum[k][-1] + steps[s][k])

    trained = sorted(ts for ts, n in steps_total.items() if n >= 1)
    if len(trained) < 5:
        raise Failure(f"only {len(trained)} scrapes after the first step; Prometheus did not follow the run")
    for ts in sorted(steps_total):
        n = int(steps_total[ts])
        if n != steps_total[ts] or not 0 <= n <= MAX_STEPS:
            raise Failure(f"scrape at {ts}: e3_student_steps_total {steps_total[ts]} is not a step of the run")
        for k in cum:
            expect_equal(f"scrape at {ts} (step {n}): {k} total", series[k].get(ts), f16(cum[k][n]))
        if n == 0:
            continue
        for k in ("loss", "lr", "simulated_tau"):
            expect_equal(f"scrape at {ts} (step {n}): {k}", series[k].get(ts), f16(steps[n][k]))
        want_acc = {str(j): f16(a) for j, a in enumerate(steps[n]["acc"])}
        expect_equal(f"scrape at {ts} (step {n}): acc_j", acc.get(ts), want_acc)
        # The real tau at step n: the last measurement before step n, or one
        # made at step n (recorded after the step itself).
        if ts in real_tau:
            allowed = []
            before = [e for e in evals if e["step"] < n]
            if before:
                allowed.append(before[-1])
            allowed += [e for e in evals if e["step"] == n]
            wants = [{c: f16(t) for c, t in e["eval"]["tau"].items()} for e in allowed]
            if real_tau[ts] not in wants:
                raise Failure(f"scrape at {ts} (step {n}): real acceptance length {real_tau[ts]}, "
                              f"the student logged {wants} for that step")

    last = trained[-1]
    if steps_total[last] != MAX_STEPS:
        raise Failure(f"the last scrape shows step {steps_total[last]}, not {MAX_STEPS}: the student's final "
                      "state (served for --metrics_linger_s after the run) was never scraped")
    scraped_evals = {json.dumps(v, sort_keys=True) for v in real_tau.values()}
    if len(scraped_evals) < 2:
        raise Failure(f"Prometheus saw {len(scraped_evals)} real acceptance measurement(s); expected the "
                      f"periodic ones (every {EVAL_EVERY} steps) and the final one")
    # The summary's totals and final measurement against the last scrape.
    expect_equal("summary tokens", series["tokens"][last], f16(summary["tokens"]))
    expect_equal("summary data_wait_seconds", series["data_wait_seconds"][last], f16(summary["data_wait_seconds"]))
    expect_equal("summary eval (final real acceptance length)", real_tau.get(last),
                 {c: f16(t) for c, t in summary["eval"]["tau"].items()})
    if real_tau[last]["7"] <= 1.0:
        raise Failure(f"final real acceptance length {real_tau[last]} is not above 1 (the untrained value)")

    # Throughput and data-wait share as PromQL computes them from the same
    # samples: an IEEE division of the two exact values.
    tput = query(prom, f"e3_student_tokens_total{sel} / e3_student_step_seconds_total{sel}", last)["result"]
    expect_equal("throughput (tokens/s)", float(tput[0]["value"][1]),
                 f16(cum["tokens"][MAX_STEPS]) / f16(cum["seconds"][MAX_STEPS]))
    share = query(prom, f"e3_student_data_wait_seconds_total{sel} / e3_student_step_seconds_total{sel}",
                  last)["result"]
    expect_equal("data-wait share", float(share[0]["value"][1]),
                 f16(cum["data_wait_seconds"][MAX_STEPS]) / f16(cum["seconds"][MAX_STEPS]))
    return len(steps_total), len(trained)


def check_rules(prom):
    groups = json.loads(http_get(f"{prom}/api/v1/rules"))["data"]["groups"]
    rules = {r["name"]: r for g in groups for r in g["rules"]}
    want = {"E3StudentStalled", "E3StudentDataWaitHigh", "E3TeacherNotServing", "E3AcceptanceLengthFalling"}
    if set(rules) != want:
        raise Failure(f"Prometheus loaded rules {sorted(rules)}, expected {sorted(want)}")
    for name, r in rules.items():
        if r.get("health") != "ok":
            raise Failure(f"rule {name}: health {r.get('health')!r} ({r.get('lastError')})")
        if r.get("state") == "firing":
            raise Failure(f"rule {name} fired during a healthy run")


def run(args):
    prometheus = shutil.which("prometheus")
    if prometheus is None:
        raise Failure("`prometheus` is not on PATH: install Debian's prometheus package (tools/install_deps.sh)")
    src = args.source_dir
    tmp = tempfile.mkdtemp(prefix="e3-prom-e2e-")
    procs = Procs(tmp)
    ok = False
    try:
        prom_port, teacher_mport, student_mport = free_port(), free_port(), free_port()
        prom = f"http://127.0.0.1:{prom_port}"
        cfg = os.path.join(tmp, "prometheus.yml")
        write_prometheus_config(os.path.join(src, "deploy/prometheus/prometheus.yml"), cfg,
                                os.path.join(src, "deploy/prometheus/alerts.yml"),
                                f"127.0.0.1:{teacher_mport}", f"127.0.0.1:{student_mport}")
        procs.start("prometheus", [prometheus, f"--config.file={cfg}", f"--storage.tsdb.path={tmp}/tsdb",
                                   f"--web.listen-address=127.0.0.1:{prom_port}", "--log.level=warn"])

        def ready():
            try:
                return http_get(f"{prom}/-/ready", timeout=1) is not None
            except (urllib.error.URLError, ConnectionError, OSError):
                return False

        wait_for("Prometheus /-/ready", ready, 30, procs)

        port_file = os.path.join(tmp, "port")
        procs.start("teacher", [
            args.teacher_bin, f"--model_dir={src}/examples/tiny-code-llama",
            f"--data={src}/examples/data/train_conversations.jsonl", "--max_samples=120", "--max_seq_len=256",
            "--tokens_per_batch=512", "--draft_vocab_size=512",
            f"--eval_prompts={src}/examples/data/eval_prompts.jsonl", "--eval_samples=8",
            "--eval_max_new_tokens=48", "--listen=127.0.0.1:0", f"--port_file={port_file}",
            "--metrics_host=127.0.0.1", f"--metrics_port={teacher_mport}", "--threads=1"])
        port = wait_for("the teacher's port file",
                        lambda: os.path.exists(port_file) and open(port_file).read().strip(), 60, procs)
        step_log, summary_path = os.path.join(tmp, "steps.jsonl"), os.path.join(tmp, "summary.json")
        student = procs.start("student", [
            args.student_bin, f"--teacher=127.0.0.1:{port}", "--lr=2e-3", "--warmup_steps=2",
            f"--max_steps={MAX_STEPS}", f"--eval_every={EVAL_EVERY}", f"--output_dir={tmp}/export",
            f"--checkpoint_dir={tmp}/ckpt", f"--summary_json={summary_path}", f"--step_log={step_log}",
            "--log_every=10", "--threads=1", "--metrics_host=127.0.0.1", f"--metrics_port={student_mport}",
            "--metrics_linger_s=5"])

        # Keep the latest exposition of each binary for the names it exports.
        texts = {}
        deadline = time.time() + 150
        while student.poll() is None:
            if time.time() > deadline:
                raise Failure("the student did not finish in 150 s:\n" + procs.log_tail("student"))
            for name, mport in (("student", student_mport), ("teacher", teacher_mport)):
                try:
                    texts[name] = http_get(f"http://127.0.0.1:{mport}/metrics", timeout=1)
                except (urllib.error.URLError, ConnectionError, OSError):
                    pass
            time.sleep(0.5)
        if student.returncode != 0:
            raise Failure(f"student exited with {student.returncode}:\n" + procs.log_tail("student"))
        texts["teacher"] = http_get(f"http://127.0.0.1:{teacher_mport}/metrics")
        if "student" not in texts:
            raise Failure("never read the student's /metrics while it ran")
        # Two more scrape intervals so the teacher's last state is stored, then query.
        time.sleep(2.5)
        at = time.time()

        steps, evals = read_step_log(step_log)
        with open(summary_path) as f:
            summary = json.load(f)
        n_scrapes, n_trained = check_scrapes(prom, at, steps, evals, summary)
        serving = query(prom, 'e3_teacher_serving{job="e3-teacher"}', at)["result"]
        if not serving or float(serving[0]["value"][1]) != 1.0:
            raise Failure(f"e3_teacher_serving of the running teacher: {serving}, expected 1")
        check_rules(prom)

        names = {"teacher_server": sorted(exported_names(texts["teacher"])),
                 "student_trainer": sorted(exported_names(texts["student"]))}
        for binary, ns in names.items():
            if not ns:
                raise Failure(f"{binary}'s /metrics served no samples")
        if args.names_out:
            with open(args.names_out, "w") as f:
                json.dump(names, f, indent=1)
        print(f"prometheus_e2e: {n_scrapes} scrapes of the student ({n_trained} after step 1), every sample "
              f"equal to the step log; {len(evals)} real acceptance measurements logged; names of "
              f"{sum(len(v) for v in names.values())} exported series written")
        ok = True
    finally:
        procs.stop_all()
        if ok:
            shutil.rmtree(tmp, ignore_errors=True)
        else:
            print(f"prometheus_e2e: logs kept in {tmp}", file=sys.stderr)


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--teacher_bin", required=True)
    p.add_argument("--student_bin", required=True)
    p.add_argument("--source_dir", required=True)
    p.add_argument("--names_out", help="write the metric names each binary served here (JSON)")
    args = p.parse_args()
    try:
        run(args)
    except Failure as e:
        print(f"prometheus_e2e: FAIL: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
