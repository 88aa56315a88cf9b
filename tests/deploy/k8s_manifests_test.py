#!/usr/bin/env python3
"""The Kubernetes overlays render, parse, and every object has what its kind needs.

For each deploy/k8s/overlays/<layout>: `kubectl kustomize` renders it (Debian's
kubernetes-client in CI), every document parses as YAML, and each object is
checked against the fields its kind requires here (the kinds this repository
uses; any other kind is an error until checks for it are written). Then the
objects are checked against each other: selectors find pods, probes and
monitors name ports that exist, the layout numbers repeated across fields
agree, and the PrometheusRule carries exactly the groups of
deploy/prometheus/alerts.yml. The entrypoint scripts must parse (`bash -n`).

What this cannot show: that a cluster accepts the objects (no API server, no
CRD schemas here) or that the pods run. deploy/README.md says what was not run.
"""

import argparse
import glob
import os
import re
import subprocess
import sys

import yaml

DNS1123 = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
API_VERSIONS = {
    "Service": "v1",
    "Job": "batch/v1",
    "LeaderWorkerSet": "leaderworkerset.x-k8s.io/v1",
    "PodMonitor": "monitoring.coreos.com/v1",
    "PrometheusRule": "monitoring.coreos.com/v1",
}
# What the alert rules match on (up{job="e3-teacher"}) and the scrape config names.
JOB_NAMES = {"e3-teacher", "e3-student"}


class Checker:
    def __init__(self, where):
        self.where = where
        self.errors = []

    def error(self, obj, field, msg):
        name = f"{obj.get('kind')}/{obj.get('metadata', {}).get('name')}" if isinstance(obj, dict) else "?"
        self.errors.append(f"{self.where}: {name}: {field}: {msg}")

    def need(self, obj, path, kind=None, ctx=None):
        """The value at dotted `path` under ctx (default obj); an error if absent or of the wrong type."""
        cur = obj if ctx is None else ctx
        for part in path.split("."):
            if not isinstance(cur, dict) or part not in cur:
                self.error(obj, path, "missing")
                return None
            cur = cur[part]
        if kind is not None and not isinstance(cur, kind):
            self.error(obj, path, f"expected {kind.__name__ if isinstance(kind, type) else kind}, "
                                  f"got {type(cur).__name__}")
            return None
        return cur


def env_value(container, name):
    for e in container.get("env", []) or []:
        if e.get("name") == name:
            return e.get("value")
    return None


def check_pod_template(c, obj, path, template, want_gpus=True):
    """Fields every pod this repository runs must have."""
    spec = c.need(obj, f"{path}.spec", dict)
    labels = c.need(obj, f"{path}.metadata.labels", dict)
    if spec is None or labels is None:
        return
    sc = spec.get("securityContext", {})
    if sc.get("runAsNonRoot") is not True or not isinstance(sc.get("runAsUser"), int) or sc["runAsUser"] == 0:
        c.error(obj, f"{path}.spec.securityContext", "must run as a non-root user (runAsNonRoot, runAsUser)")
    volumes = {v.get("name"): v for v in spec.get("volumes", []) or []}
    containers = c.need(obj, f"{path}.spec.containers", list)
    if not containers:
        c.error(obj, f"{path}.spec.containers", "empty")
        return
    for i, ct in enumerate(containers):
        cp = f"{path}.spec.containers[{i}]"
        for f in ("name", "image"):
            if not isinstance(ct.get(f), str) or not ct[f]:
                c.error(obj, f"{cp}.{f}", "missing")
        res = ct.get("resources", {})
        for f in ("cpu", "memory"):
            if f not in res.get("requests", {}):
                c.error(obj, f"{cp}.resources.requests.{f}", "missing (the scheduler needs requests)")
        if "memory" not in res.get("limits", {}):
            c.error(obj, f"{cp}.resources.limits.memory", "missing")
        gpus = res.get("limits", {}).get("nvidia.com/gpu")
        if want_gpus:
            if not (isinstance(gpus, str) and gpus.isdigit() and int(gpus) >= 1):
                c.error(obj, f"{cp}.resources.limits[nvidia.com/gpu]", f"expected a positive count, got {gpus!r}")
        mounts = {m.get("mountPath"): m for m in ct.get("volumeMounts", []) or []}
        for m in mounts.values():
            if m.get("name") not in volumes:
                c.error(obj, f"{cp}.volumeMounts[{m.get('name')}]", "names no volume of the pod")
        shm = mounts.get("/dev/shm")
        if shm is None or volumes.get(shm.get("name"), {}).get("emptyDir", {}).get("medium") != "Memory":
            c.error(obj, f"{cp}.volumeMounts[/dev/shm]", "needs a memory-backed emptyDir (NCCL)")
        auth = mounts.get("/etc/e3/auth")
        secret = volumes.get(auth.get("name"), {}).get("secret", {}) if auth else {}
        if not secret.get("secretName") or secret.get("optional"):
            c.error(obj, f"{cp}.volumeMounts[/etc/e3/auth]", "needs the token Secret mounted (not optional)")
        if "--auth_token_file=/etc/e3/auth/token" not in (ct.get("args") or []):
            c.error(obj, f"{cp}.args", "must pass --auth_token_file=/etc/e3/auth/token")
        ports = {p.get("name"): p.get("containerPort") for p in ct.get("ports", []) or []}
        for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
            pr = ct.get(probe)
            if pr is None:
                continue
            port = (pr.get("grpc") or pr.get("httpGet") or pr.get("tcpSocket") or {}).get("port")
            if port is None:
                c.error(obj, f"{cp}.{probe}", "has no grpc, httpGet or tcpSocket port")
            elif port not in ports and port not in ports.values():
                c.error(obj, f"{cp}.{probe}", f"port {port!r} is not a port of the container {ports}")
        if "metrics" in ports:  # a serving process: it must be probed
            for probe in ("startupProbe", "livenessProbe"):
                if probe not in ct:
                    c.error(obj, f"{cp}.{probe}", "missing on a container that serves /metrics")
        if "grpc" in ports and "grpc" not in (ct.get("readinessProbe") or {}):
            c.error(obj, f"{cp}.readinessProbe", "a gRPC server is ready when grpc.health.v1 says so")
        for e in ct.get("env", []) or []:
            if "name" not in e or ("value" not in e and "valueFrom" not in e):
                c.error(obj, f"{cp}.env", f"entry {e} needs name and value or valueFrom")


def gpu_limit(ct):
    return int(ct["resources"]["limits"]["nvidia.com/gpu"])


def check_object(c, obj):
    if not isinstance(obj, dict):
        c.errors.append(f"{c.where}: a document is not a mapping: {obj!r}")
        return
    kind = obj.get("kind")
    if kind not in API_VERSIONS:
        c.error(obj, "kind", f"no checks for kind {kind!r} (known: {sorted(API_VERSIONS)})")
        return
    if obj.get("apiVersion") != API_VERSIONS[kind]:
        c.error(obj, "apiVersion", f"expected {API_VERSIONS[kind]}, got {obj.get('apiVersion')!r}")
    name = c.need(obj, "metadata.name", str)
    if name is not None and not DNS1123.match(name):
        c.error(obj, "metadata.name", f"{name!r} is not a DNS-1123 label")
    if kind == "Service":
        c.need(obj, "spec.selector", dict)
        for i, p in enumerate(c.need(obj, "spec.ports", list) or []):
            if not isinstance(p.get("port"), int) or not p.get("name"):
                c.error(obj, f"spec.ports[{i}]", "needs a name and an integer port")
    elif kind == "Job":
        spec = c.need(obj, "spec", dict) or {}
        if spec.get("completionMode") != "Indexed":
            c.error(obj, "spec.completionMode", "must be Indexed (RANK is the completion index)")
        for f in ("completions", "parallelism"):
            if not isinstance(spec.get(f), int) or spec[f] < 1:
                c.error(obj, f"spec.{f}", f"expected a positive integer, got {spec.get(f)!r}")
        if c.need(obj, "spec.template.spec.restartPolicy", str) not in (None, "Never", "OnFailure"):
            c.error(obj, "spec.template.spec.restartPolicy", "a Job's pods restart Never or OnFailure")
        check_pod_template(c, obj, "spec.template", spec.get("template", {}))
        ct = (spec.get("template", {}).get("spec", {}).get("containers") or [{}])[0]
        world = env_value(ct, "WORLD_SIZE")
        if world != str(spec.get("completions")) or spec.get("completions") != spec.get("parallelism"):
            c.error(obj, "spec.completions", f"completions {spec.get('completions')}, parallelism "
                                             f"{spec.get('parallelism')} and WORLD_SIZE {world!r} must agree")
    elif kind == "LeaderWorkerSet":
        lwt = c.need(obj, "spec.leaderWorkerTemplate", dict) or {}
        size = lwt.get("size")
        if not isinstance(size, int) or size < 1:
            c.error(obj, "spec.leaderWorkerTemplate.size", f"expected a positive integer, got {size!r}")
        if not isinstance(obj.get("spec", {}).get("replicas"), int):
            c.error(obj, "spec.replicas", "expected an integer")
        for t in ("leaderTemplate", "workerTemplate"):
            check_pod_template(c, obj, f"spec.leaderWorkerTemplate.{t}", lwt.get(t, {}))
            for i, ct in enumerate(lwt.get(t, {}).get("spec", {}).get("containers", []) or []):
                try:
                    g = gpu_limit(ct)
                except (KeyError, ValueError, TypeError):
                    continue
                if env_value(ct, "E3_GPUS_PER_POD") != str(g):
                    c.error(obj, f"spec.leaderWorkerTemplate.{t}.spec.containers[{i}].env[E3_GPUS_PER_POD]",
                            f"{env_value(ct, 'E3_GPUS_PER_POD')!r} differs from the GPU limit {g}")
        leader = lwt.get("leaderTemplate", {}).get("spec", {}).get("containers", [{}])[0]
        if not any(p.get("name") == "grpc" for p in leader.get("ports", []) or []):
            c.error(obj, "spec.leaderWorkerTemplate.leaderTemplate", "the leader (rank 0) must expose port grpc")
    elif kind == "PodMonitor":
        c.need(obj, "spec.selector.matchLabels", dict)
        eps = c.need(obj, "spec.podMetricsEndpoints", list) or []
        if not eps:
            c.error(obj, "spec.podMetricsEndpoints", "empty")
        for i, ep in enumerate(eps):
            if not ep.get("port"):
                c.error(obj, f"spec.podMetricsEndpoints[{i}].port", "missing")
    elif kind == "PrometheusRule":
        for i, g in enumerate(c.need(obj, "spec.groups", list) or []):
            if not g.get("name") or not g.get("rules"):
                c.error(obj, f"spec.groups[{i}]", "needs a name and rules")
            for j, r in enumerate(g.get("rules", [])):
                if not r.get("expr") or not (r.get("alert") or r.get("record")):
                    c.error(obj, f"spec.groups[{i}].rules[{j}]", "needs expr and alert or record")


def pod_templates(obj):
    """(labels, pod spec) of every pod an object makes."""
    if obj.get("kind") == "Job":
        t = obj["spec"]["template"]
        yield t["metadata"].get("labels", {}), t["spec"]
    elif obj.get("kind") == "LeaderWorkerSet":
        for k in ("leaderTemplate", "workerTemplate"):
            t = obj["spec"]["leaderWorkerTemplate"].get(k)
            if t:
                yield t["metadata"].get("labels", {}), t["spec"]


def check_together(c, objs, alerts_groups):
    pods = [(o, labels, spec) for o in objs for labels, spec in pod_templates(o)]

    def matching(selector):
        return [(o, l, s) for o, l, s in pods if all(l.get(k) == v for k, v in selector.items())]

    by_kind = {}
    for o in objs:
        by_kind.setdefault(o.get("kind"), []).append(o)
    for svc in by_kind.get("Service", []):
        if not matching(svc["spec"].get("selector", {})):
            c.error(svc, "spec.selector", "selects no pod template of this overlay")
    for pm in by_kind.get("PodMonitor", []):
        found = matching(pm["spec"]["selector"]["matchLabels"])
        if not found:
            c.error(pm, "spec.selector.matchLabels", "selects no pod template of this overlay")
        job_label = pm["spec"].get("jobLabel")
        for o, labels, spec in found:
            names = {p.get("name") for ct in spec.get("containers", []) for p in ct.get("ports", []) or []}
            for ep in pm["spec"]["podMetricsEndpoints"]:
                if ep.get("port") not in names:
                    c.error(pm, "spec.podMetricsEndpoints.port", f"{ep.get('port')!r} is no port of {o['kind']}/"
                                                                 f"{o['metadata']['name']} ({sorted(names)})")
            if labels.get(job_label) not in JOB_NAMES:
                c.error(pm, "spec.jobLabel", f"pod label {job_label!r} = {labels.get(job_label)!r}: the alert "
                                             f"rules expect the job to be one of {sorted(JOB_NAMES)}")
    rules = by_kind.get("PrometheusRule", [])
    if len(rules) != 1:
        c.errors.append(f"{c.where}: expected one PrometheusRule, found {len(rules)}")
    elif rules[0]["spec"].get("groups") != alerts_groups:
        c.error(rules[0], "spec.groups", "differs from deploy/prometheus/alerts.yml; run "
                                         "python3 tools/make_prometheus_rule.py")
    # Students reach the teacher's leader and rank 0 of their own Job by DNS.
    lws = {o["metadata"]["name"] for o in by_kind.get("LeaderWorkerSet", [])}
    services = {o["metadata"]["name"] for o in by_kind.get("Service", [])}
    for job in by_kind.get("Job", []):
        spec = job["spec"]["template"]["spec"]
        ct = spec["containers"][0]
        teachers = [a.split("=", 1)[1] for a in ct.get("args", []) if a.startswith("--teacher=")]
        for t in ",".join(teachers).split(",") if teachers else []:
            m = re.fullmatch(r"([a-z0-9-]+)-0\.([a-z0-9-]+):50051", t)
            if not m or m.group(1) not in lws or m.group(2) != m.group(1):
                c.error(job, "args --teacher", f"{t!r} is not <LeaderWorkerSet>-0.<LeaderWorkerSet>:50051 "
                                               f"of this overlay ({sorted(lws)})")
        if not teachers:
            c.error(job, "args", "no --teacher")
        sub = spec.get("subdomain")
        if sub not in services:
            c.error(job, "spec.template.spec.subdomain", f"{sub!r} is no Service of this overlay")
        want = f"{job['metadata']['name']}-0.{sub}"
        if env_value(ct, "MASTER_ADDR") != want:
            c.error(job, "env MASTER_ADDR", f"{env_value(ct, 'MASTER_ADDR')!r}, expected rank 0's name {want!r}")


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--source_dir", required=True)
    p.add_argument("--kubectl", default="kubectl")
    args = p.parse_args()
    src = args.source_dir
    errors = []
    for script in sorted(glob.glob(f"{src}/deploy/k8s/*.sh")):
        r = subprocess.run(["bash", "-n", script], capture_output=True, text=True)
        if r.returncode != 0:
            errors.append(f"{script}: bash -n: {r.stderr.strip()}")
    with open(f"{src}/deploy/prometheus/alerts.yml") as f:
        alerts_groups = yaml.safe_load(f)["groups"]
    overlays = sorted(glob.glob(f"{src}/deploy/k8s/overlays/*/kustomization.yaml"))
    if not overlays:
        errors.append(f"{src}/deploy/k8s/overlays: no overlays")
    summary = []
    for k in overlays:
        d = os.path.dirname(k)
        where = os.path.relpath(d, src)
        try:
            r = subprocess.run([args.kubectl, "kustomize", d], capture_output=True, text=True, timeout=60)
        except FileNotFoundError:
            print(f"k8s_manifests: FAIL: {args.kubectl!r} not found: install Debian's kubernetes-client "
                  "(tools/install_deps.sh)", file=sys.stderr)
            return 1
        if r.returncode != 0:
            errors.append(f"{where}: kubectl kustomize failed: {r.stderr.strip()}")
            continue
        try:
            objs = [o for o in yaml.safe_load_all(r.stdout) if o is not None]
        except yaml.YAMLError as e:
            errors.append(f"{where}: the rendered manifests do not parse: {e}")
            continue
        c = Checker(where)
        for o in objs:
            check_object(c, o)
        try:
            check_together(c, objs, alerts_groups)
        except (KeyError, IndexError, TypeError, AttributeError) as e:
            if not c.errors:  # a field check above names what is missing
                raise
            c.errors.append(f"{where}: cross-object checks stopped at a missing field ({e!r})")
        errors += c.errors
        lws = [o for o in objs if o.get("kind") == "LeaderWorkerSet"]
        jobs = [o for o in objs if o.get("kind") == "Job"]
        if lws and jobs and not c.errors:
            t = lws[0]["spec"]["leaderWorkerTemplate"]
            g = gpu_limit(t["leaderTemplate"]["spec"]["containers"][0])
            summary.append(f"{os.path.basename(d)}: {len(objs)} objects, teacher TP={t['size'] * g} "
                           f"({t['size']} pod(s) x {g} GPUs), {jobs[0]['spec']['completions']} students")
    if errors:
        print("k8s_manifests: FAIL\n  " + "\n  ".join(errors), file=sys.stderr)
        return 1
    print("k8s_manifests: " + "; ".join(summary))
    return 0


if __name__ == "__main__":
    sys.exit(main())
