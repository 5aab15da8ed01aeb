"""What durapipe's output costs a real control plane at fleet scale, beside minimal Workflows.

    python benchmarks/fleet_scale.py [--nodes 1000] [--sizes 100,200] [--profile SECONDS]
        [--forms minimal,durapipe,minimal-tmpl,durapipe-tmpl] [--state DIR] [--json FILE]
        [--operations]

Starts the e2e control plane (tests/e2e/cluster.py: etcd, API server, scheduler,
controller-manager, Argo v4.1.2's workflow-controller, KWOK) with ``--nodes`` KWOK nodes of the
GKE profile across GPU types (a few H100 nodes, many A100-80GB, L4 and CPU nodes), and the pod
fate watcher of tests/e2e/fates.py playing each pod's end. For each size N and each form it
submits N runs at once and waits until every run has ended. The forms:

- ``minimal``: a hand-written Workflow doing the same work the way a user writes it without
  durapipe: a DAG prep -> train -> eval, artifacts between them, ``retryStrategy`` limit 1
  with a 10 s backoff on each step, the train step asking for 8 GPUs of either type by node
  affinity (no per-type count, no fallback timer, no memoization, no checkpoint store);
- ``durapipe``: ``FLEET_PIPELINE`` below as ``durapipe compile`` writes it (memoized prep and
  train, one application retry with a 10 s backoff, two preemptions, a checkpointing train
  with GPU fallback H100 -> A100-80GB after 30 s);
- ``minimal-tmpl``, ``durapipe-tmpl``: the same, each run created from a WorkflowTemplate
  (``workflowTemplateRef``; ``durapipe compile --kind template``, as GitOps deploys it). Argo
  copies the template's spec into every such run's status, so each is compared in kind;
- ``durapipe-folded`` (only when named): the ``durapipe`` form with each stage's application
  budget folded into one ``retryStrategy`` (benchmarks/what_if.py), a lowering durapipe does
  not have: what building it could save, at most; likewise ``durapipe-<name>`` for every
  other name in what_if's ``WHAT_IFS`` (``durapipe-floor``: the least any lowering of the same
  features could cost).

The same fates for all: train's first pod of every run fails (exit 1), every other pod
succeeds after 2 s (train: 5 s). Every run has its own ``snapshot`` param, so every run misses
the cache and adds entries, as a fleet's first runs do.

Printed per form and size, measured in this run (the machine is shared; compare within it):
Argo's controller CPU seconds (``/proc/<pid>/stat``), the API server's successful
create/update/patch/delete requests by resource (its ``/metrics``), the bytes the API server
sent to etcd and etcd's puts (etcd's ``/metrics``), pods created, each Workflow's stored size,
the seconds from the first create until every run ended (a failed run is listed with
its failed nodes' messages), and the reconcile latency: from a
pod seen ended (a pod watch) to its node in the Workflow seen ended (a Workflow watch), median
and 95th percentile. Then the ratios durapipe / minimal per pipeline (goal: controller CPU <=
1.5x), and per form the per-pipeline cost at the larger size over the smaller (1.0 is
linear). Last, the memoization ConfigMaps in Argo's namespace (entries, bytes, bytes per
entry, how many fit in the API server's 1 MiB) and where 10,000 entries of this pipeline land.
``--profile S`` also saves a CPU profile of the controller over the first S seconds of each
phase (``go tool pprof -top BIN FILE``). After each phase its runs and their pods are deleted
and the next phase waits until they are gone (Argo's informer would hold them: a later phase
would pay for an earlier one's objects). ``--operations`` turns Argo's own metrics on and adds
how many times ``operate`` ran per pipeline and its seconds (wall): whether a form's CPU per
run grows with N because each pass costs more or because there are more passes.

Needs Go, kubectl, openssl, the ``kubernetes`` client and ../shared (as tests/e2e). Not a test
and not part of CI: about 30 minutes on a 2-core machine with the defaults.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO), str(REPO / "tests")]

import yaml  # noqa: E402

from e2e.cluster import ARGO_NAMESPACE, Cluster, build_binaries  # noqa: E402
from e2e.nodes import node, spot_labels  # noqa: E402

from benchmarks.what_if import WHAT_IFS  # noqa: E402

DIGEST = "198657d88e13664112ad27589506b9048bbab9027442726be0daca1290e2157f"
IMAGE = f"ghcr.io/acme/churn:4.1.0@sha256:{DIGEST}"
DURAPIPE_NS = "fleet-durapipe"
MINIMAL_NS = "fleet-minimal"

FLEET_PIPELINE = f"""
pipeline "fleet" {{
  namespace = "{DURAPIPE_NS}"
  storage   = "s3://acme-ml/durapipe"
  profile   = "gke"
}}
params {{
  snapshot: str  = "2026-11-01"
  max_depth: int = 8
}}
defaults {{
  image = "{IMAGE}"
  retry {{ attempts = 1  preemptions = 2  backoff = 10s }}
}}
stage "prep" {{
  command = ["python", "-m", "churn.prep", "--snapshot", params.snapshot, "--out", "/out/data"]
  resources {{ cpu = 4  memory = 16Gi }}
  outputs {{ data = "/out/data" }}
  cache {{ max_age = 7d }}
}}
stage "train" {{
  command = ["python", "-m", "churn.train", "--data", prep.outputs.data,
             "--max-depth", params.max_depth, "--out", "/out/model"]
  resources {{
    cpu = 16
    memory = 64Gi
    gpu {{ count = 8  types = ["H100", "A100-80GB"]  fallback_after = 30s }}
  }}
  outputs {{ model = "/out/model" }}
  cache {{ version = "2" }}
  checkpoint = true
}}
stage "eval" {{
  command = ["python", "-m", "churn.eval", "--model", train.outputs.model,
             "--data", prep.outputs.data, "--report", "/out/report"]
  resources {{ cpu = 4  memory = 16Gi }}
  outputs {{ report = "/out/report" }}
}}
"""

#: Train's GPU types as GKE labels them (durapipe.dsl.catalog's gke profile).
GPU_LABEL = "cloud.google.com/gke-accelerator"
H100, A100 = "nvidia-h100-80gb", "nvidia-a100-80gb"


def fleet_nodes(total: int) -> list[dict[str, Any]]:
    """``total`` GKE nodes: 40% CPU, 2.5% H100 x 8 (scarce: most trains fall back),
    37.5% A100-80GB x 8, 20% L4 x 4 (asked for by nobody, as in a shared fleet)."""
    h100 = max(1, total // 40)
    a100 = total * 3 // 8
    l4 = total // 5
    cpu = total - h100 - a100 - l4
    out = [node(f"cpu-{i}", "gke", False) for i in range(cpu)]
    out += [node(f"h100-{i}", "gke", False, "H100", 8) for i in range(h100)]
    out += [node(f"a100-{i}", "gke", False, "A100-80GB", 8) for i in range(a100)]
    out += [node(f"l4-{i}", "gke", False, "L4", 4) for i in range(l4)]
    return out


def minimal_workflow(snapshot: str) -> dict[str, Any]:
    """The same three steps as a user writes them without durapipe."""
    retry = {"limit": 1, "retryPolicy": "Always", "backoff": {"duration": "10s"}}

    def step(name: str, args: list[str], cpu: str, memory: str, *, inputs: list[str],
             output: str, gpus: int = 0) -> dict[str, Any]:
        resources: dict[str, Any] = {"requests": {"cpu": cpu, "memory": memory},
                                     "limits": {"memory": memory}}
        tmpl: dict[str, Any] = {
            "name": name, "metadata": {"labels": {"durapipe.dev/stage": name}},
            "retryStrategy": retry,
            "inputs": {"artifacts": [{"name": i, "path": f"/in/{i}"} for i in inputs]},
            "outputs": {"artifacts": [{"name": output, "path": f"/out/{output}"}]},
            "container": {"image": IMAGE, "command": ["python", "-m", f"churn.{name}", *args],
                          "resources": resources},
        }
        if gpus:
            resources["limits"]["nvidia.com/gpu"] = str(gpus)
            tmpl["affinity"] = {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
                "nodeSelectorTerms": [{"matchExpressions": [
                    {"key": GPU_LABEL, "operator": "In", "values": [H100, A100]}]}]}}}
            tmpl["tolerations"] = [{"key": "nvidia.com/gpu", "operator": "Exists",
                                    "effect": "NoSchedule"}]
        return tmpl

    def art(name: str, task: str) -> dict[str, str]:
        return {"name": name, "from": f"{{{{tasks.{task}.outputs.artifacts.{name}}}}}"}

    return {
        "apiVersion": "argoproj.io/v1alpha1", "kind": "Workflow",
        "metadata": {"generateName": "fleet-m-", "namespace": MINIMAL_NS},
        "spec": {
            "entrypoint": "main",
            "arguments": {"parameters": [{"name": "snapshot", "value": snapshot},
                                         {"name": "max-depth", "value": "8"}]},
            "templates": [
                {"name": "main", "dag": {"tasks": [
                    {"name": "prep", "template": "prep"},
                    {"name": "train", "template": "train", "depends": "prep",
                     "arguments": {"artifacts": [art("data", "prep")]}},
                    {"name": "eval", "template": "eval", "depends": "train",
                     "arguments": {"artifacts": [art("model", "train"), art("data", "prep")]}},
                ]}},
                step("prep", ["--snapshot", "{{workflow.parameters.snapshot}}", "--out",
                              "/out/data"], "4", "16Gi", inputs=[], output="data"),
                step("train", ["--data", "/in/data", "--max-depth",
                               "{{workflow.parameters.max-depth}}", "--out", "/out/model"],
                     "16", "64Gi", inputs=["data"], output="model", gpus=8),
                step("eval", ["--model", "/in/model", "--data", "/in/data", "--report",
                              "/out/report"], "4", "16Gi", inputs=["model", "data"],
                     output="report"),
            ],
        },
    }


@dataclass
class Form:
    """One way of submitting the same work: its Workflows, and the objects they need first."""

    name: str
    namespace: str
    prefix: str  # generateName: the fate watcher's rules match it
    workflow: Callable[[str], dict[str, Any]]  # snapshot -> the Workflow to create
    setup: list[dict[str, Any]] = field(default_factory=list)


def forms(out: Path) -> dict[str, Form]:
    """The minimal Workflow and durapipe's compiled output, each inline (``durapipe compile``'s
    default kind) and from a WorkflowTemplate (``--kind template``, as GitOps deploys it):
    Argo copies a referenced template's whole spec into every run's status
    (``storedWorkflowTemplateSpec``, ``storedTemplates``), so the two are compared in kind."""
    src = out / "fleet.pipe"
    src.write_text(FLEET_PIPELINE)
    compiled: dict[str, list[dict[str, Any]]] = {}
    for kind in ("workflow", "template"):
        target = out / kind
        proc = subprocess.run([sys.executable, "-m", "durapipe", "compile", "--kind", kind,
                               "-o", str(target) + "/", str(src)],
                              capture_output=True, text=True, cwd=REPO)
        if proc.returncode:
            raise SystemExit(f"durapipe compile failed:\n{proc.stdout}{proc.stderr}")
        compiled[kind] = [d for f in sorted(target.iterdir()) if f.suffix == ".yaml"
                          for d in yaml.safe_load_all(f.read_text()) if d]
    inline = next(d for d in compiled["workflow"] if d["kind"] == "Workflow")
    inline_setup = [d for d in compiled["workflow"] if d["kind"] != "Workflow"]
    template = next(d for d in compiled["template"] if d["kind"] == "WorkflowTemplate")
    minimal_template = {"apiVersion": "argoproj.io/v1alpha1", "kind": "WorkflowTemplate",
                        "metadata": {"name": "fleet-minimal", "namespace": MINIMAL_NS},
                        "spec": minimal_workflow("")["spec"]}

    def args(snapshot: str) -> dict[str, Any]:
        return {"parameters": [{"name": "snapshot", "value": snapshot}]}

    def durapipe_inline(snapshot: str) -> dict[str, Any]:
        wf: dict[str, Any] = json.loads(json.dumps(inline))
        wf["metadata"] = {"generateName": "fleet-d-", "namespace": DURAPIPE_NS,
                          "labels": inline["metadata"].get("labels", {})}
        wf["spec"]["arguments"]["parameters"] = [  # the compiled defaults, snapshot set
            {**param, "value": snapshot} if param["name"] == "snapshot" else param
            for param in wf["spec"]["arguments"]["parameters"]]
        return wf

    def ref(prefix: str, ns: str, name: str) -> Callable[[str], dict[str, Any]]:
        return lambda snapshot: {
            "apiVersion": "argoproj.io/v1alpha1", "kind": "Workflow",
            "metadata": {"generateName": prefix, "namespace": ns},
            "spec": {"workflowTemplateRef": {"name": name}, "arguments": args(snapshot)}}

    def rewritten(what_if: str, prefix: str) -> Callable[[str], dict[str, Any]]:
        def workflow(snapshot: str) -> dict[str, Any]:
            wf = WHAT_IFS[what_if](durapipe_inline(snapshot))
            wf["metadata"]["generateName"] = prefix
            return wf
        return workflow

    # fleet-df- kept for the fold, as the runs recorded in docs/performance.md were named.
    prefixes = {name: "fleet-df-" if name == "folded" else f"fleet-w{index}-"
                for index, name in enumerate(WHAT_IFS)}
    return {
        "minimal": Form("minimal", MINIMAL_NS, "fleet-m-", minimal_workflow),
        "durapipe": Form("durapipe", DURAPIPE_NS, "fleet-d-", durapipe_inline, inline_setup),
        "minimal-tmpl": Form("minimal-tmpl", MINIMAL_NS, "fleet-mt-",
                             ref("fleet-mt-", MINIMAL_NS, "fleet-minimal"), [minimal_template]),
        "durapipe-tmpl": Form("durapipe-tmpl", DURAPIPE_NS, "fleet-dt-",
                              ref("fleet-dt-", DURAPIPE_NS, template["metadata"]["name"]),
                              compiled["template"]),
        **{f"durapipe-{name}": Form(f"durapipe-{name}", DURAPIPE_NS, prefix,
                                    rewritten(name, prefix), inline_setup)
           for name, prefix in prefixes.items()},
    }


# -- measuring --------------------------------------------------------------------------------
def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


_SAMPLE = re.compile(r'^(\w+)\{([^}]*)\} ([0-9.e+]+)$')


def metric_samples(text: str, name: str) -> list[tuple[dict[str, str], float]]:
    out = []
    for line in text.splitlines():
        m = _SAMPLE.match(line)
        if m and m[1] == name:
            labels = dict(re.findall(r'(\w+)="([^"]*)"', m[2]))
            out.append((labels, float(m[3])))
    return out


def metric_total(text: str, name: str) -> float:
    plain = [float(line.split()[-1]) for line in text.splitlines()
             if line.startswith(name + " ")]
    return sum(plain) + sum(v for _, v in metric_samples(text, name))


def operation_metric(text: str, part: str) -> float:
    """The ``count`` or ``sum`` of Argo's ``operation_duration_seconds`` histogram: how many
    times ``operate`` ran, and the seconds it took (wall, not CPU)."""
    return metric_total(text, f"argo_workflows_operation_duration_seconds_{part}")


METRICS_PORT = 9090
METRICS_ON = f"enabled: true\nport: {METRICS_PORT}\nsecure: false\n"


class Probe:
    """Counters of the control plane, read before and after a phase."""

    def __init__(self, cluster: Cluster, controller_metrics: str = "") -> None:
        self.cluster = cluster
        self.controller_metrics = controller_metrics
        self.pids = {p.name: p.popen.pid for p in cluster.procs}
        etcd = next(p for p in cluster.procs if p.name == "etcd")
        url = next(a for a in etcd.popen.args if str(a).startswith("--listen-client-urls="))
        self.etcd = str(url).split("=", 1)[1]

    def read(self) -> dict[str, Any]:
        import urllib.request

        api = self.cluster._get("/metrics")
        etcd = urllib.request.urlopen(self.etcd + "/metrics", timeout=10).read().decode()
        writes: Counter[str] = Counter()
        for labels, value in metric_samples(api, "apiserver_request_total"):
            if labels.get("verb") in ("POST", "PUT", "PATCH", "DELETE", "APPLY") and \
                    labels.get("code", "").startswith("2"):
                sub = f"/{labels['subresource']}" if labels.get("subresource") else ""
                writes[f"{labels['verb']} {labels.get('resource', '?')}{sub}"] += int(value)
        operations = {}
        if self.controller_metrics:
            text = urllib.request.urlopen(self.controller_metrics, timeout=10).read().decode()
            operations = {"operates": operation_metric(text, "count"),
                          "operate_seconds": operation_metric(text, "sum")}
        return {
            **operations,
            "cpu": {name: cpu_seconds(pid) for name, pid in self.pids.items()
                    if Path(f"/proc/{pid}").exists()},
            "writes": writes,
            "etcd_bytes": metric_total(etcd, "etcd_network_client_grpc_received_bytes_total"),
            "etcd_puts": metric_total(etcd, "etcd_mvcc_put_total"),
            "t": time.monotonic(),
        }


class Latency:
    """From a pod seen ended to its Workflow node seen ended (watches in this process)."""

    def __init__(self, kubeconfig: str, namespace: str) -> None:
        from kubernetes import client, config

        api = config.new_client_from_config(kubeconfig)
        self.core, self.custom = client.CoreV1Api(api), client.CustomObjectsApi(api)
        self.ns = namespace
        #: node id -> (workflow, when): the watches list what exists first, earlier phases'
        #: runs included, so only the runs of this phase (``workflows``) count.
        self.pod_end: dict[str, tuple[str, float]] = {}
        self.node_end: dict[str, tuple[str, float]] = {}
        self.workflows: set[str] = set()
        self.stop = threading.Event()
        self.threads = [threading.Thread(target=f, daemon=True)
                        for f in (self._pods, self._workflows)]
        for t in self.threads:
            t.start()

    def _pods(self) -> None:
        from kubernetes import watch

        while not self.stop.is_set():
            try:
                for ev in watch.Watch().stream(self.core.list_namespaced_pod, self.ns,
                                               timeout_seconds=10):
                    pod = ev["object"]
                    node_id = (pod.metadata.annotations or {}).get(
                        "workflows.argoproj.io/node-id")
                    wf = (pod.metadata.labels or {}).get("workflows.argoproj.io/workflow", "")
                    if node_id and pod.status.phase in ("Succeeded", "Failed"):
                        self.pod_end.setdefault(node_id, (wf, time.monotonic()))
            except Exception:
                time.sleep(0.2)

    def _workflows(self) -> None:
        from kubernetes import watch

        while not self.stop.is_set():
            try:
                for ev in watch.Watch().stream(
                        self.custom.list_namespaced_custom_object, "argoproj.io", "v1alpha1",
                        self.ns, "workflows", timeout_seconds=10):
                    nodes = (ev["object"].get("status") or {}).get("nodes") or {}
                    wf = ev["object"]["metadata"]["name"]
                    now = time.monotonic()
                    for node_id, n in nodes.items():
                        if n.get("type") == "Pod" and n.get("phase") in (
                                "Succeeded", "Failed", "Error"):
                            self.node_end.setdefault(node_id, (wf, now))
            except Exception:
                time.sleep(0.2)

    def result(self) -> list[float]:
        self.stop.set()
        return sorted(self.node_end[k][1] - t for k, (wf, t) in self.pod_end.items()
                      if wf in self.workflows and k in self.node_end
                      and self.node_end[k][1] >= t)


def run_phase(cluster: Cluster, probe: Probe, form: Form, n: int) -> dict[str, Any]:
    from kubernetes import client, config

    api = config.new_client_from_config(str(cluster.kubeconfig))
    custom = client.CustomObjectsApi(api)
    ns = form.namespace
    latency = Latency(str(cluster.kubeconfig), ns)
    time.sleep(2)  # the watches are up
    before = probe.read()
    names = []
    for i in range(n):
        # Its own snapshot for every run of every phase: each misses the cache, as first runs do.
        wf = form.workflow(f"{form.name}-{n}-{i:04d}")
        made: Any = custom.create_namespaced_custom_object("argoproj.io", "v1alpha1", ns,
                                                      "workflows", wf)
        names.append(made["metadata"]["name"])
        latency.workflows.add(made["metadata"]["name"])
    deadline = time.monotonic() + 1800
    while True:
        wfs: Any = custom.list_namespaced_custom_object("argoproj.io", "v1alpha1", ns,
                                                        "workflows")
        mine = [w for w in wfs["items"] if w["metadata"]["name"] in set(names)]
        phases = Counter((w.get("status") or {}).get("phase", "") for w in mine)
        ended = sum(phases.get(p, 0) for p in ("Succeeded", "Failed", "Error"))
        if ended == n:
            break
        if time.monotonic() > deadline:
            raise SystemExit(f"{form.name} x{n}: {dict(phases)} after 30 minutes")
        time.sleep(3)
    # A run that failed is reported with its failed nodes' messages, not hidden.
    failed = {w["metadata"]["name"]: sorted({
        n.get("message", "") for n in ((w.get("status") or {}).get("nodes") or {}).values()
        if n.get("phase") in ("Failed", "Error") and n.get("message")})
        for w in mine if (w.get("status") or {}).get("phase") != "Succeeded"}
    done = time.monotonic()
    time.sleep(10)  # the last status writes and task-result cleanups land before reading
    after = probe.read()
    lat = latency.result()
    writes = after["writes"] - before["writes"]
    sizes = [len(json.dumps(w, separators=(",", ":"))) for w in mine]
    return {
        "form": form.name, "n": n, "failed": failed,
        "controller_cpu": after["cpu"]["workflow-controller"] - before["cpu"]["workflow-controller"],
        "apiserver_cpu": after["cpu"]["kube-apiserver"] - before["cpu"]["kube-apiserver"],
        "etcd_cpu": after["cpu"]["etcd"] - before["cpu"]["etcd"],
        "writes": dict(writes),
        "api_writes": sum(writes.values()),
        "creates": sum(v for k, v in writes.items() if k.startswith("POST ")),
        "pods": writes.get("POST pods", 0),
        "etcd_bytes": after["etcd_bytes"] - before["etcd_bytes"],
        "etcd_puts": after["etcd_puts"] - before["etcd_puts"],
        "seconds": done - before["t"],
        "workflow_bytes": statistics.mean(sizes),
        "latency_median": statistics.median(lat) if lat else float("nan"),
        "latency_p95": lat[int(0.95 * (len(lat) - 1))] if lat else float("nan"),
        "latency_samples": len(lat),
        **{k: after[k] - before[k] for k in ("operates", "operate_seconds") if k in after},
    }


def clear_phase(cluster: Cluster, namespace: str) -> None:
    """Delete a phase's runs and wait until they and their pods are gone, so that every phase
    starts from the same state: Argo's informer holds every Workflow it can see, and each one
    left over adds to the heap its garbage collector walks in the next phase (the runs of
    2026-12-06/07 kept them, so a later phase paid for the earlier ones)."""
    cluster.kubectl("delete", "workflows", "--all", "-n", namespace, "--wait=false")
    deadline = time.monotonic() + 600
    while True:
        left = [cluster.kubectl("get", kind, "-n", namespace, "-o", "name").stdout.split()
                for kind in ("workflows", "pods")]
        if not any(left):
            break
        if time.monotonic() > deadline:
            raise SystemExit(f"{namespace}: {sum(map(len, left))} objects left after 10 minutes")
        time.sleep(3)
    time.sleep(10)  # the controller's last reactions to the deletes land before the next phase


def memo_configmaps(cluster: Cluster) -> list[dict[str, Any]]:
    out = []
    cms = json.loads(cluster.kubectl("get", "configmaps", "-n", ARGO_NAMESPACE, "-o",
                                     "json").stdout)["items"]
    for cm in cms:
        if not cm["metadata"]["name"].startswith("durapipe-cache-"):
            continue
        data = cm.get("data") or {}
        size = sum(len(k) + len(v.encode()) for k, v in data.items())
        out.append({"name": cm["metadata"]["name"], "entries": len(data), "bytes": size,
                    "per_entry": size / max(1, len(data)),
                    "fit_1mib": int((1 << 20) / (size / max(1, len(data)))) if data else 0})
    return out


def memo_projection(docs: list[dict[str, Any]], cluster: Cluster,
                    entries: int = 10_000) -> dict[str, Any]:
    """The 10,000 entries of one pipeline: their keys as Argo evaluates them (half prep's,
    one per snapshot; half train's, one per upstream hash; ``memo.evaluate_key_expression``,
    the function the controller tests hold to Argo's own evaluation), so their shards exactly;
    each entry's size the mean that Argo's real entries of that stage measured in this run."""
    import hashlib

    from durapipe.compiler import memo as memo_keys

    template = next(d for d in docs if d["kind"] == "WorkflowTemplate")
    keys = {t["name"]: t["memoize"]["key"] for t in template["spec"]["templates"]
            if "memoize" in t}
    sizes: dict[str, list[int]] = {"prep": [], "train": []}
    for cm in json.loads(cluster.kubectl("get", "configmaps", "-n", ARGO_NAMESPACE, "-o",
                                         "json").stdout)["items"]:
        if cm["metadata"]["name"].startswith("durapipe-cache-"):
            for key, value in (cm.get("data") or {}).items():
                stage = json.loads(_record_of(value))["stage"]
                sizes[stage].append(len(key) + len(value.encode()))
    mean = {stage: statistics.mean(v) for stage, v in sizes.items() if v}
    shards: Counter[str] = Counter()
    bytes_by_shard: Counter[str] = Counter()
    for i in range(entries):
        if i % 2 == 0:
            key = memo_keys.evaluate_key_expression(
                keys["prep"], {"snapshot": f"snap-{i}"}, {})
            stage = "prep"
        else:
            up = "sha256:" + hashlib.sha256(str(i).encode()).hexdigest()
            key = memo_keys.evaluate_key_expression(
                keys["train"], {"max_depth": "8"}, {"prep-data-hash": up})
            stage = "train"
        assert key is not None, keys
        shards[key[0]] += 1
        bytes_by_shard[key[0]] += int(mean[stage])
    return {"entries": entries, "mean_entry": mean, "shards": dict(sorted(shards.items())),
            "max_shard_bytes": max(bytes_by_shard.values()),
            "min_shard_bytes": min(bytes_by_shard.values()),
            "unsharded_bytes": sum(bytes_by_shard.values())}


def _record_of(entry: str) -> str:
    """The ``durapipe-cache-inputs`` record an entry of Argo's cache carries."""
    params = json.loads(entry)["outputs"]["parameters"]
    return str(next(p["value"] for p in params if p["name"] == "durapipe-cache-inputs"))


def report(results: list[dict[str, Any]], memo: list[dict[str, Any]],
           projection: dict[str, Any]) -> None:
    cols = ["controller_cpu", "apiserver_cpu", "etcd_cpu", "api_writes", "creates", "pods",
            "etcd_bytes", "etcd_puts", "workflow_bytes"]
    cols += [c for c in ("operates", "operate_seconds") if all(c in r for r in results)]
    print("\nper pipeline (totals / N):")
    print(f"{'form':13} {'N':>4} " + " ".join(f"{c:>14}" for c in cols)
          + f" {'seconds':>8} {'lat p50':>8} {'lat p95':>8}")
    for r in results:
        per = [r[c] / r["n"] if c != "workflow_bytes" else r[c] for c in cols]
        print(f"{r['form']:13} {r['n']:>4} " + " ".join(f"{v:>14.3f}" for v in per)
              + f" {r['seconds']:>8.1f} {r['latency_median']:>8.3f} {r['latency_p95']:>8.3f}")
    sizes = sorted({r["n"] for r in results})
    by = {(r["form"], r["n"]): r for r in results}
    names = list(dict.fromkeys(r["form"] for r in results))
    for suffix in ("", "-tmpl"):
        if f"durapipe{suffix}" not in names or f"minimal{suffix}" not in names:
            continue
        print(f"\ndurapipe{suffix} / minimal{suffix}, per pipeline:")
        for n in sizes:
            d, m = by[(f"durapipe{suffix}", n)], by[(f"minimal{suffix}", n)]
            ratios = {c: d[c] / m[c] for c in cols if m[c]}
            print(f"  N={n}: " + ", ".join(f"{c} {v:.2f}x" for c, v in ratios.items())
                  + f", seconds {d['seconds'] / m['seconds']:.2f}x")
    if len(sizes) > 1:
        lo, hi = sizes[0], sizes[-1]
        print(f"\ngrowth per pipeline, N={hi} over N={lo} (1.00 = linear):")
        for form in names:
            a, b = by[(form, lo)], by[(form, hi)]
            print(f"  {form}: " + ", ".join(
                f"{c} {(b[c] / hi) / (a[c] / lo):.2f}" for c in cols
                if a[c] and c != "workflow_bytes")
                + f", latency p50 {b['latency_median'] / a['latency_median']:.2f}")
    print("\nwrites by resource, largest size, per pipeline: " + " / ".join(names))
    top = Counter[str]()
    for form in names:
        top.update(by[(form, sizes[-1])]["writes"])
    for k, _ in top.most_common(14):
        print(f"  {k:36} " + " ".join(
            f"{by[(form, sizes[-1])]['writes'].get(k, 0) / sizes[-1]:8.2f}" for form in names))
    print("\nmemoization ConfigMaps in the controller's namespace:")
    for cm in memo:
        print(f"  {cm['name']}: {cm['entries']} entries, {cm['bytes']} bytes, "
              f"{cm['per_entry']:.0f} bytes/entry, about {cm['fit_1mib']} entries fit in 1 MiB")
    p = projection
    print(f"\n{p['entries']} entries of this pipeline (keys as Argo evaluates them, entry sizes "
          f"as measured: " + ", ".join(f"{k} {v:.0f} B" for k, v in p["mean_entry"].items())
          + f"): per shard {min(p['shards'].values())}..{max(p['shards'].values())} entries, "
          f"{p['min_shard_bytes'] / 2**20:.2f}..{p['max_shard_bytes'] / 2**20:.2f} MiB "
          f"(limit 1 MiB); in one ConfigMap {p['unsharded_bytes'] / 2**20:.2f} MiB")


def wait_nodes_ready(cluster: Cluster, count: int, timeout: float = 600) -> None:
    """Every node Ready (one list a second: `kubectl wait` reads 1,000 nodes one by one)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        nodes = json.loads(cluster.kubectl("get", "nodes", "-o", "json").stdout)["items"]
        ready = sum(any(c["type"] == "Ready" and c["status"] == "True"
                        for c in (n.get("status") or {}).get("conditions") or [])
                    for n in nodes)
        if ready == count:
            return
        time.sleep(1)
    raise SystemExit(f"{count} nodes not Ready after {timeout:.0f} s")


def profile_controller(seconds: int, out: Path) -> threading.Thread:
    """A CPU profile of Argo's controller over the next ``seconds`` (Go's pprof, served by
    ARGO_PPROF on 127.0.0.1:6060), written to ``out`` in the background."""
    import urllib.request

    def fetch() -> None:
        url = f"http://127.0.0.1:6060/debug/pprof/profile?seconds={seconds}"
        out.write_bytes(urllib.request.urlopen(url, timeout=seconds + 60).read())

    thread = threading.Thread(target=fetch, daemon=True)
    thread.start()
    return thread


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--nodes", type=int, default=1000)
    ap.add_argument("--sizes", default="100,200")
    ap.add_argument("--forms", default="minimal,durapipe,minimal-tmpl,durapipe-tmpl")
    ap.add_argument("--state", type=Path, default=None,
                    help="keep the control plane's state and logs here")
    ap.add_argument("--json", type=Path, default=None, help="also write the results here")
    ap.add_argument("--profile", type=int, default=0, metavar="SECONDS",
                    help="take a CPU profile of Argo's controller over the first SECONDS of "
                         "each phase, as <state>/<form>-<N>.pprof (`go tool pprof -top`)")
    ap.add_argument("--operations", action="store_true",
                    help="turn Argo's metrics on (port 9090, every interface: for a machine of "
                         "its own) and report how many times operate ran per pipeline")
    args = ap.parse_args()
    sizes = [int(s) for s in args.sizes.split(",")]

    import urllib3

    from e2e.fates import Fate, FateWatcher

    # The control plane's own serving certificate is self-made; the e2e kubeconfig skips its
    # check, which the client would warn about at every request.
    urllib3.disable_warnings(urllib3.exceptions.InsecureRequestWarning)

    bins = build_binaries()
    state = args.state or Path(tempfile.mkdtemp(prefix="fleet-"))
    cluster = Cluster.start(state, bins, controller_env={"ARGO_PPROF": "true"}
                            if args.profile else None,
                            controller_config={"metricsConfig": METRICS_ON}
                            if args.operations else None)
    watcher = FateWatcher(str(cluster.kubeconfig), spot_labels=spot_labels())
    try:
        t0 = time.monotonic()
        nodes = fleet_nodes(args.nodes)
        for i in range(0, len(nodes), 200):
            cluster.kubectl("create", "-f", "-", input=yaml.safe_dump_all(nodes[i:i + 200]),
                            timeout=300)
        wait_nodes_ready(cluster, len(nodes))
        print(f"{len(nodes)} nodes Ready in {time.monotonic() - t0:.0f} s", flush=True)
        fates = {"prep": Fate(seconds=2), "train": Fate(seconds=5, fail_first=1),
                 "eval": Fate(seconds=2)}
        chosen = [forms(state)[name] for name in args.forms.split(",")]
        watcher.fates = {form.prefix: fates for form in chosen}
        watcher.start()
        for form in chosen:
            cluster.ensure_namespace(form.namespace)
            if form.setup:
                cluster.apply(form.setup)
        probe = Probe(cluster, f"http://127.0.0.1:{METRICS_PORT}/metrics"
                      if args.operations else "")
        idle = probe.read()
        time.sleep(30)
        idle2 = probe.read()
        print("idle controller CPU: "
              f"{(idle2['cpu']['workflow-controller'] - idle['cpu']['workflow-controller']) / 30:.3f}"
              " s/s", flush=True)
        results = []
        for n in sizes:
            for form in chosen:
                profiler = profile_controller(args.profile,
                                              state / f"{form.name}-{n}.pprof") \
                    if args.profile else None
                r = run_phase(cluster, probe, form, n)
                if profiler is not None:
                    profiler.join()
                print(f"{form.name} x{n}: {n - len(r['failed'])} Succeeded, "
                      f"{len(r['failed'])} failed {r['failed']}, all ended in "
                      f"{r['seconds']:.0f} s, controller {r['controller_cpu']:.1f} CPU s, "
                      f"{r['pods']} pods", flush=True)
                results.append(r)
                clear_phase(cluster, form.namespace)
        memo = memo_configmaps(cluster)
        projection = memo_projection(forms(state)["durapipe-tmpl"].setup, cluster)
        report(results, memo, projection)
        if args.json:
            args.json.write_text(json.dumps({"results": results, "memo": memo,
                                             "projection": projection}, indent=1))
    finally:
        watcher.stop()
        cluster.stop()


if __name__ == "__main__":
    main()
