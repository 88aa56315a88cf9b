#!/usr/bin/env python3
"""Every metric the Grafana dashboard and the alert rules name is one the binaries export.

The exported names are not a list kept by hand: prometheus_e2e_test reads them
from the /metrics of the real teacher_server and student_trainer it runs and
writes them to --names (this test's ctest fixture). The queries checked:
every panel target's `expr` and every query variable of
deploy/grafana/e3-dashboard.json, every rule's `expr` in
deploy/prometheus/alerts.yml and in the PrometheusRule of deploy/k8s/base.
Besides the exported names, a query may use `up`, the series Prometheus
itself writes for every target.
"""

import argparse
import json
import re
import sys

import yaml

# Series Prometheus adds to every scrape target itself.
PROMETHEUS_SERIES = {"up"}
KEYWORDS = {"by", "without", "on", "ignoring", "group_left", "group_right", "bool", "and", "or", "unless",
            "offset", "atan2", "inf", "nan"}
IDENT = re.compile(r"[A-Za-z_:][A-Za-z0-9_:]*")


def metric_names(expr):
    """The metric names a PromQL expression selects (Grafana variables allowed)."""
    e = re.sub(r'"(?:[^"\\]|\\.)*"|\'(?:[^\'\\]|\\.)*\'', '""', expr)  # string literals
    e = re.sub(r"\$\{?[A-Za-z0-9_]+\}?", "0", e)                        # $var, ${var}, $__rate_interval
    e = re.sub(r"\{[^}]*\}", " ", e)                                   # label matchers
    e = re.sub(r"\[[^\]]*\]", " ", e)                                  # ranges and subqueries
    # Label lists of grouping and matching clauses: by (a, b), on(a) ...
    e = re.sub(r"\b(by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", " ", e)
    names = set()
    for m in IDENT.finditer(e):
        word = m.group(0)
        rest = e[m.end():].lstrip()
        if rest.startswith("("):  # a function or aggregation
            continue
        if word.lower() in KEYWORDS:
            continue
        if re.fullmatch(r"[0-9.]+[smhdwy]?", word) or (m.start() > 0 and e[m.start() - 1].isdigit()):
            continue  # a number or a duration like 5m
        names.add(word)
    return names


def label_values_metric(query):
    """label_values(metric, label) -> metric (Grafana's variable query)."""
    m = re.fullmatch(r"\s*label_values\(\s*([^,]+?)\s*,\s*[A-Za-z_]+\s*\)\s*", query)
    return metric_names(m.group(1)) if m else metric_names(query)


def dashboard_queries(path):
    with open(path) as f:
        d = json.load(f)
    out = []

    def panels(ps):
        for p in ps:
            for t in p.get("targets", []):
                if "expr" in t:
                    out.append((f"panel {p.get('title')!r} target {t.get('refId')}", t["expr"], metric_names))
            panels(p.get("panels", []))

    panels(d.get("panels", []))
    for v in d.get("templating", {}).get("list", []):
        if v.get("type") != "query":
            continue
        q = v.get("query")
        q = q.get("query") if isinstance(q, dict) else q
        if q:
            out.append((f"variable {v.get('name')!r}", q, label_values_metric))
    if not out:
        raise SystemExit(f"{path}: no panel targets with `expr` found")
    return out


def rule_queries(path, groups):
    out = []
    for g in groups:
        for r in g.get("rules", []):
            out.append((f"{path}: rule {r.get('alert') or r.get('record')!r}", r["expr"], metric_names))
    if not out:
        raise SystemExit(f"{path}: no rules found")
    return out


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--names", required=True, help="JSON written by prometheus_e2e_test --names_out")
    p.add_argument("--source_dir", required=True)
    args = p.parse_args()
    with open(args.names) as f:
        exported = json.load(f)
    known = set(PROMETHEUS_SERIES)
    for binary, names in exported.items():
        known |= set(names)
    src = args.source_dir
    queries = [(f"deploy/grafana/e3-dashboard.json: {w}", q, fn)
               for w, q, fn in dashboard_queries(f"{src}/deploy/grafana/e3-dashboard.json")]
    alerts = f"{src}/deploy/prometheus/alerts.yml"
    with open(alerts) as f:
        queries += rule_queries("deploy/prometheus/alerts.yml", yaml.safe_load(f)["groups"])
    k8s_rule = f"{src}/deploy/k8s/base/prometheusrule.yaml"
    with open(k8s_rule) as f:
        queries += rule_queries("deploy/k8s/base/prometheusrule.yaml", yaml.safe_load(f)["spec"]["groups"])

    errors, used = [], set()
    for where, q, extract in queries:
        names = extract(q)
        if not names:
            errors.append(f"{where}: names no metric: {q!r}")
        for n in sorted(names):
            used.add(n)
            if n not in known:
                errors.append(f"{where}: {n} is exported by no binary (query {q!r})")
    if errors:
        print("deploy_metric_names: FAIL\n  " + "\n  ".join(errors), file=sys.stderr)
        print(f"  exported: {sorted(known)}", file=sys.stderr)
        return 1
    print(f"deploy_metric_names: {len(queries)} queries name {len(used)} metrics, all exported "
          f"({', '.join(f'{b}: {len(n)}' for b, n in exported.items())})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
