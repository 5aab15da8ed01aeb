"""Run one e2e case (a TOML file under tests/e2e/cases/) through the front door.

A case names a pipeline (an example, or inline ``source``), the pod fates per stage, and one or
more submissions with what each must show. The pipeline is compiled with ``durapipe compile
--kind template -o DIR/``, every file of DIR is applied with server-side apply, and each
submission creates a Workflow from the WorkflowTemplate (``workflowTemplateRef``) and waits for it
on the real clock. A submission may set ``params`` and ``workflow_deadline`` (the Workflow's
``activeDeadlineSeconds``). Expectations (all optional) per submission:

- ``phase``: the Workflow's final phase;
- ``min_seconds`` / ``max_seconds``: bounds on its elapsed time (creation to finish);
- ``outcomes.<stage>``: the fates of that stage's pods in order (``succeeded``, ``oom``,
  ``app_failure``, ``reclaimed``);
- ``memory.<stage>``: the ``main`` memory limit of each of its pods in order;
- ``nodes.<stage>``: the node each of its pods ran on, in order;
- ``cache_hits`` / ``cache_misses``: stages whose memoized node was (not) a hit;
- ``cache_miss_reasons``: per stage, a text that `durapipe status` must give as its miss's reason;
- ``attempt_reasons``: per stage, a text that `durapipe status` must give as one attempt's reason;
- ``restart_attempts.<stage>``: a JobSet's pods' restart attempts, in the order they ended;
- ``nodes_distinct.<stage>``: how many nodes that stage's pods ran on;
- ``jobset.<stage>``: fields of the JobSet's final ``status`` (``terminalState``, ``restarts``,
  ``restartsCountTowardsMax``; an absent count is 0).
- ``max_workflow_bytes``: the most bytes the JSON of the run's Workflow, and of each child
  Workflow it created (label ``durapipe.dev/parent-workflow``), may take as read back;
- ``kueue.admitted`` / ``kueue.preempted``: how many times Kueue admitted and preempted the
  Workloads of the run's pods (its events). A case's ``[kueue]`` section (tests/e2e/kueue.py)
  starts Kueue, manages the pipeline's namespace and gives it quota per GPU type; its
  ``holders`` are other teams' pods in the same queue, created and deleted on timers.
"""

from __future__ import annotations

import subprocess
import sys
import time
import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from .cluster import Cluster
from .fates import Fate, FateWatcher

REPO_ROOT = Path(__file__).resolve().parents[2]
CASES = Path(__file__).parent / "cases"


@dataclass
class Case:
    name: str
    path: Path
    spec: dict[str, Any]

    @property
    def known_fault(self) -> str:
        return str(self.spec.get("known_fault", ""))


def load_cases(directory: Path = CASES) -> list[Case]:
    return [Case(p.stem, p, tomllib.loads(p.read_text()))
            for p in sorted(directory.glob("*.toml")) if p.name != "fleet.toml"]


def compile_case(case: Case, out: Path) -> list[dict[str, Any]]:
    if "source" in case.spec:
        src = out / f"{case.name}.pipe"
        src.write_text(case.spec["source"])
    else:
        src = REPO_ROOT / case.spec["pipeline"]
    manifests = out / "manifests"
    proc = subprocess.run(
        [sys.executable, "-m", "durapipe", "compile", "--kind", case.spec.get("kind", "template"),
         str(src), "-o", f"{manifests}/"], capture_output=True, text=True, check=False)
    assert proc.returncode == 0, f"durapipe compile failed:\n{proc.stdout}\n{proc.stderr}"
    docs = []
    for f in sorted(manifests.glob("*.yaml")):
        docs += [d for d in yaml.safe_load_all(f.read_text()) if d]
    return docs


def wait_workflow(cluster: Cluster, ns: str, name: str, timeout: float) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    wf: dict[str, Any] = {}
    while time.monotonic() < deadline:
        wf = get(cluster, "workflow", ns, name)
        if (wf.get("status") or {}).get("phase") in ("Succeeded", "Failed", "Error"):
            return wf
        time.sleep(1)
    raise AssertionError(
        f"workflow {ns}/{name} still {(wf.get('status') or {}).get('phase')} after {timeout} s; "
        f"nodes: {_node_summary(wf)}")


def get(cluster: Cluster, kind: str, ns: str, name: str) -> dict[str, Any]:
    import json

    out = cluster.kubectl("get", kind, name, "-n", ns, "-o", "json").stdout
    result: dict[str, Any] = json.loads(out)
    return result


def _node_summary(wf: dict[str, Any]) -> list[str]:
    nodes = (wf.get("status") or {}).get("nodes") or {}
    return sorted(f"{n.get('displayName')}={n.get('phase')}:{n.get('message', '')[:80]}"
                  for n in nodes.values())


def run_case(case: Case, cluster: Cluster, fates: FateWatcher, tmp: Path) -> list[str]:
    """Run every submission of ``case``; return the list of failed expectations."""
    docs = compile_case(case, tmp)
    namespaces = sorted({d["metadata"]["namespace"] for d in docs if "namespace" in d["metadata"]})
    kueue_spec = case.spec.get("kueue")
    if kueue_spec is not None:
        from .kueue import case_setup

        (namespace,) = namespaces
        case_setup(cluster, kueue_spec, namespace, case.name.replace("_", "-"))
    for ns in namespaces:
        cluster.ensure_namespace(ns)
    cluster.apply(docs)
    templates = [d for d in docs if d["kind"] == "WorkflowTemplate"]
    cron = [d for d in docs if d["kind"] == "CronWorkflow"]
    problems: list[str] = []
    for i, sub in enumerate(case.spec.get("submit", [{}])):
        holders = None
        prefix = cron[0]["metadata"]["name"] if cron else f"{case.name.replace('_', '-')}-{i}-"
        fates.fates[prefix] = {stage: Fate(**f) for stage, f in
                               (case.spec.get("fates") or {}).items()}
        if cron:
            ns, name = cron[0]["metadata"]["namespace"], _wait_cron_run(cluster, cron[0], sub)
        else:
            entry = next(t for t in templates  # not a split pipeline's parts
                         if "durapipe.dev/part" not in t["metadata"]["labels"])
            ns = entry["metadata"]["namespace"]
            wf = {"apiVersion": "argoproj.io/v1alpha1", "kind": "Workflow",
                  "metadata": {"generateName": prefix, "namespace": ns},
                  "spec": {"workflowTemplateRef": {"name": entry["metadata"]["name"]},
                           "arguments": {"parameters": [
                               {"name": k, "value": str(v)}
                               for k, v in (sub.get("params") or {}).items()]}}}
            if "workflow_deadline" in sub:
                wf["spec"]["activeDeadlineSeconds"] = int(sub["workflow_deadline"])
            holders = None
            if kueue_spec is not None:
                from .kueue import Holders

                holders = Holders(cluster, kueue_spec, ns, prefix)
                holders.start()
            name = cluster.kubectl("create", "-f", "-", "-o", "name",
                                   input=yaml.safe_dump(wf)).stdout.strip().split("/")[-1]
        try:
            done = wait_workflow(cluster, ns, name, float(sub.get("timeout", 240)))
        finally:
            if holders is not None:
                holders.stop()
                problems += [f"submission {i}: {e}" for e in holders.errors]
        problems += [f"submission {i} ({name}): {p}" for p in check(sub, done, fates, name)]
        if "kueue" in sub:
            from .kueue import workload_events

            got = workload_events(cluster, ns, name)
            problems += [f"submission {i} ({name}): Kueue {k} its pods' Workloads {got[k]} "
                         f"times, expected {want}" for k, want in sub["kueue"].items()
                         if got.get(k) != want]
        if "cache_miss_reasons" in sub or "attempt_reasons" in sub:
            problems += [f"submission {i} ({name}): {p}" for p in
                         check_status(cluster, ns, name, sub.get("cache_miss_reasons") or {},
                                      sub.get("attempt_reasons") or {})]
        if "max_workflow_bytes" in sub:
            problems += [f"submission {i} ({name}): {p}" for p in
                         check_sizes(cluster, ns, done, int(sub["max_workflow_bytes"]))]
    return problems


def check_status(cluster: Cluster, ns: str, name: str, misses: dict[str, str],
                 attempts: dict[str, str]) -> list[str]:
    """`durapipe status --json` (the CLI, against this control plane) says of each stage of
    ``misses`` why it missed (a text its reason must contain), and of each stage of
    ``attempts`` why one of its attempts ended (a text one attempt's reason must contain)."""
    import json
    import os
    import subprocess
    import sys

    proc = subprocess.run(
        [sys.executable, "-m", "durapipe", "status", name, "-n", ns, "--json"],
        capture_output=True, text=True, timeout=120, check=False,
        env={**os.environ, "KUBECONFIG": str(cluster.kubeconfig)})
    if proc.returncode != 0:
        return [f"durapipe status exited {proc.returncode}: {proc.stderr}"]
    stages = {s["stage"]: s for s in json.loads(proc.stdout)["stages"]}
    problems = [f"cache miss of {stage}: {stages.get(stage, {}).get('cache_miss')!r}, expected "
                f"it to say {text!r}" for stage, text in misses.items()
                if text not in (stages.get(stage, {}).get("cache_miss") or "")]
    for stage, text in attempts.items():
        said = [a["reason"] for a in stages.get(stage, {}).get("attempts") or []]
        if not any(text in reason for reason in said):
            problems.append(f"attempts of {stage} ended for {said}, expected one to say {text!r}")
    return problems


def check_sizes(cluster: Cluster, ns: str, wf: dict[str, Any], limit: int) -> list[str]:
    import json

    out = cluster.kubectl("get", "workflows", "-n", ns, "-l",
                          f"durapipe.dev/parent-workflow={wf['metadata']['name']}",
                          "-o", "json").stdout
    sizes = {w["metadata"]["name"]: len(json.dumps(w, separators=(",", ":")))
             for w in [wf, *json.loads(out)["items"]]}
    print(f"workflow sizes (bytes): {sizes}")
    return [f"Workflow {n} is {size} bytes as stored, over {limit}"
            for n, size in sizes.items() if size > limit]


def _wait_cron_run(cluster: Cluster, cron: dict[str, Any], sub: dict[str, Any]) -> str:
    import json

    ns, name = cron["metadata"]["namespace"], cron["metadata"]["name"]
    deadline = time.monotonic() + float(sub.get("fire_within", 75))
    while time.monotonic() < deadline:
        out = cluster.kubectl("get", "workflows", "-n", ns, "-l",
                              f"workflows.argoproj.io/cron-workflow={name}", "-o", "json").stdout
        items = json.loads(out)["items"]
        if items:
            return str(items[0]["metadata"]["name"])
        time.sleep(1)
    raise AssertionError(f"CronWorkflow {ns}/{name} did not fire within "
                         f"{sub.get('fire_within', 75)} s")


def _elapsed(wf: dict[str, Any]) -> float:
    from datetime import datetime

    st = wf["status"]
    start = datetime.fromisoformat(st["startedAt"].replace("Z", "+00:00"))
    end = datetime.fromisoformat(st["finishedAt"].replace("Z", "+00:00"))
    return (end - start).total_seconds()


def check(sub: dict[str, Any], wf: dict[str, Any], fates: FateWatcher, name: str) -> list[str]:
    problems = []
    st = wf["status"]
    if "phase" in sub and st["phase"] != sub["phase"]:
        problems.append(f"phase {st['phase']} (message {st.get('message')!r}), expected "
                        f"{sub['phase']}; nodes: {_node_summary(wf)}")
    elapsed = _elapsed(wf)
    if "max_seconds" in sub and elapsed > sub["max_seconds"]:
        problems.append(f"took {elapsed:.0f} s, at most {sub['max_seconds']} s expected")
    if "min_seconds" in sub and elapsed < sub["min_seconds"]:
        problems.append(f"took {elapsed:.0f} s, at least {sub['min_seconds']} s expected")
    events = fates.events_of(name)
    for key, attr in (("outcomes", "outcome"), ("memory", "memory"), ("nodes", "node"),
                      ("restart_attempts", "attempt")):
        for stage, want in (sub.get(key) or {}).items():
            got = [getattr(e, attr) for e in events if e.stage == stage]
            if got != want:
                problems.append(f"{key} of {stage}: {got}, expected {want}")
    for stage, want in (sub.get("nodes_distinct") or {}).items():
        got = len({e.node for e in events if e.stage == stage})
        if got != want:
            problems.append(f"{stage} ran on {got} distinct nodes, expected {want}")
    for stage, fields in (sub.get("jobset") or {}).items():
        status = fates.resources.get((name, stage), {})
        for k, want in fields.items():
            if status.get(k, 0 if isinstance(want, int) else None) != want:
                problems.append(f"JobSet of {stage}: status.{k} = {status.get(k)!r}, expected "
                                f"{want!r} (status {status})")
    hits = {n["displayName"] for n in st.get("nodes", {}).values()
            if (n.get("memoizationStatus") or {}).get("hit")}
    for stage in sub.get("cache_hits") or []:
        if stage not in hits:
            problems.append(f"{stage} was not a cache hit (hits: {sorted(hits)})")
    for stage in sub.get("cache_misses") or []:
        if stage in hits:
            problems.append(f"{stage} was a cache hit, expected a miss")
    return problems
