"""Pod fates as rules, and the executor's part, for Argo pods on KWOK nodes.

No container runs on a KWOK node: KWOK moves each pod to Running (its default ``pod-ready``
Stage) and nothing ever ends it. This watcher decides how each Argo pod ends from what the pod
is, by rules a scenario gives per stage (``durapipe.dev/stage`` label):

- ``need_memory``: the stage needs this much memory; a pod whose ``main`` memory limit is lower
  ends ``OOMKilled`` with exit code 137 (the kernel's kill, as a kubelet reports it);
- ``reclaim_spot``: the first N pods of the stage that run on a spot node are reclaimed as the
  kubelet's graceful node shutdown does it: a ``DisruptionTarget`` condition, ``main`` ends with
  exit 143 and the ``preempted`` verdict, the pod is Failed;
- ``evict_spot``: the next N pods of the stage on a spot node are drained instead: evicted
  through the Eviction API (the API server adds the ``DisruptionTarget`` condition) and gone, as
  ``kubectl drain`` before a node's reclaim does it; give the stage ``seconds`` past Argo's
  10 s "recently started" grace so the controller reads the missing pod as deleted;
- ``fail_first``: the first N pods that get past the rules above exit 1 (an application
  failure);
- ``seconds``: how long a pod runs before it ends (default 1 s);
- otherwise the pod succeeds, exit 0.

The termination message of ``main`` is the verdict line the runtime's wrapper writes
(``durapipe.runtime.wrapper.verdict_line``). Then, as Argo's wait container would, it writes the
pod's ``WorkflowTaskResult`` (named after the pod's node id, owned by the Workflow, labelled
``report-outputs-completed: "true"``) with the output parameters and artifacts the template
(``ARGO_TEMPLATE``) declares: a parameter read from a path gets a content hash of what the pod
ran (its command line), so a changed parameter changes it; a failed pod reports each parameter's
``valueFrom.default`` instead. Counting is per workflow and stage.

A resource template's pod (``main`` runs ``argoexec resource``; a split pipeline's run has one
per part) is played as that command works (Argo v4.1.2 ``workflow/executor/resource.go``): the
manifest Argo put in the template is created with the real API server, the object is read back
every 5 s (argoexec's default) until the template's ``failureCondition`` or
``successCondition`` holds, and the output parameters' ``jqFilter``s (the forms the compiler
writes) are evaluated on it and reported in the WorkflowTaskResult; the pod then ends 0, or 1
with the failed condition as its message.
"""

from __future__ import annotations

import hashlib
import heapq
import json
import re
import threading
import time
from collections import defaultdict
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any

import yaml
from kubernetes import client, config, watch  # type: ignore[import-untyped]
from kubernetes.client.rest import ApiException  # type: ignore[import-untyped]

from durapipe.runtime import contract
from durapipe.runtime.wrapper import verdict_line

WF_LABEL = "workflows.argoproj.io/workflow"
NODE_ID = "workflows.argoproj.io/node-id"
STAGE_LABEL = "durapipe.dev/stage"
#: argoexec's default poll of a resource template's object (RESOURCE_STATE_CHECK_INTERVAL).
RESOURCE_STATE_CHECK_INTERVAL = 5.0
FINISHERS = 4
_UNITS = {"Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "Pi": 2**50,
          "k": 10**3, "M": 10**6, "G": 10**9, "T": 10**12}


def quantity_bytes(q: str) -> int:
    for suffix in sorted(_UNITS, key=len, reverse=True):
        if q.endswith(suffix):
            return int(float(q[: -len(suffix)]) * _UNITS[suffix])
    return int(float(q))


@dataclass
class Fate:
    need_memory: str | None = None
    reclaim_spot: int = 0
    evict_spot: int = 0
    fail_first: int = 0
    seconds: float = 1.0


@dataclass
class Event:
    """What the watcher did to one pod (scenarios assert on these)."""

    workflow: str
    stage: str
    pod: str
    node: str
    outcome: str  # succeeded, app_failure, oom, reclaimed, evicted
    memory: str
    at: float


@dataclass
class FateWatcher:
    kubeconfig: str
    fates: dict[str, dict[str, Fate]] = field(default_factory=dict)  # workflow prefix -> stage
    events: list[Event] = field(default_factory=list)
    spot_labels: tuple[tuple[str, str], ...] = ()
    _counts: dict[tuple[str, str, str], int] = field(default_factory=lambda: defaultdict(int))
    _seen: set[str] = field(default_factory=set)
    _nodes: dict[str, dict[str, str]] = field(default_factory=dict)
    _heap: list[tuple[float, int, str, str, str]] = field(default_factory=list)
    _lock: threading.Condition = field(default_factory=threading.Condition)
    _stop: threading.Event = field(default_factory=threading.Event)
    _threads: list[threading.Thread] = field(default_factory=list)
    _seq: int = 0

    def start(self) -> None:
        api_client = config.new_client_from_config(self.kubeconfig)
        self.core = client.CoreV1Api(api_client)
        self.custom = client.CustomObjectsApi(api_client)
        # Several finishers: each pod's end is four API calls, and a wide stage level (the
        # 2,000-stage case) has hundreds of pods Running at once.
        for target in (self._watch, *[self._finisher] * FINISHERS):
            t = threading.Thread(target=target, daemon=True)
            t.start()
            self._threads.append(t)

    def stop(self) -> None:
        self._stop.set()
        with self._lock:
            self._lock.notify_all()
        for t in self._threads:
            t.join(timeout=10)

    def fate_for(self, workflow: str, stage: str) -> Fate:
        best = ""
        for prefix in self.fates:
            if workflow.startswith(prefix) and len(prefix) > len(best):
                best = prefix
        return self.fates.get(best, {}).get(stage, Fate()) if best else Fate()

    def events_of(self, workflow: str) -> list[Event]:
        with self._lock:
            return [e for e in self.events if e.workflow == workflow]

    # -- threads --------------------------------------------------------------------------------
    def _watch(self) -> None:
        while not self._stop.is_set():
            try:
                pods = self.core.list_pod_for_all_namespaces(label_selector=WF_LABEL)
                for pod in pods.items:
                    self._consider(pod)
                w = watch.Watch()
                for ev in w.stream(self.core.list_pod_for_all_namespaces,
                                   label_selector=WF_LABEL, timeout_seconds=30,
                                   resource_version=pods.metadata.resource_version):
                    if self._stop.is_set():
                        w.stop()
                        return
                    self._consider(ev["object"])
            except Exception:  # the API server restarting, a watch expiring: list again
                time.sleep(0.5)

    def _consider(self, pod: Any) -> None:
        if pod.status.phase != "Running" or pod.metadata.deletion_timestamp is not None:
            return
        key = pod.metadata.uid  # Argo re-creates a missing pod under the same name
        with self._lock:
            if key in self._seen:
                return
            self._seen.add(key)
            if _is_resource_pod(pod):
                t = threading.Thread(target=self._resource_or_log, args=(pod,), daemon=True)
                t.start()
                return
            fate = self.fate_for(pod.metadata.labels.get(WF_LABEL, ""),
                                 (pod.metadata.labels or {}).get(STAGE_LABEL, ""))
            self._seq += 1
            heapq.heappush(self._heap, (time.monotonic() + fate.seconds, self._seq,
                                        pod.metadata.namespace, pod.metadata.name, key))
            self._lock.notify_all()

    def _finisher(self) -> None:
        while not self._stop.is_set():
            with self._lock:
                while not self._stop.is_set() and (
                        not self._heap or self._heap[0][0] > time.monotonic()):
                    wait = self._heap[0][0] - time.monotonic() if self._heap else 1.0
                    self._lock.wait(timeout=max(0.01, min(wait, 1.0)))
                if self._stop.is_set():
                    return
                _, _, ns, name, uid = heapq.heappop(self._heap)
            try:
                self._finish(ns, name, uid)
            except ApiException as exc:
                if exc.status != 404:  # a pod deleted meanwhile needs no end
                    raise

    # -- one pod's end --------------------------------------------------------------------------
    def _finish(self, ns: str, name: str, uid: str) -> None:
        pod = self.core.read_namespaced_pod(name, ns)
        if (pod.metadata.uid != uid or pod.status.phase != "Running"
                or pod.metadata.deletion_timestamp is not None):
            return
        wf = pod.metadata.labels[WF_LABEL]
        stage = pod.metadata.labels.get(STAGE_LABEL, "")
        fate = self.fate_for(wf, stage)
        main = next(c for c in pod.spec.containers if c.name == "main")
        limits = (main.resources.limits or {}) if main.resources else {}
        memory = limits.get("memory", "")
        on_spot = any(self._node_labels(pod.spec.node_name).get(k) == v
                      for k, v in self.spot_labels)

        counts = self._counts
        with self._lock:  # finishers run side by side; a stage's counts are shared
            if fate.need_memory and memory and quantity_bytes(memory) < quantity_bytes(
                    fate.need_memory):
                outcome = "oom"
            elif on_spot and counts[(wf, stage, "reclaim")] < fate.reclaim_spot:
                counts[(wf, stage, "reclaim")] += 1
                outcome = "reclaimed"
            elif on_spot and counts[(wf, stage, "evict")] < fate.evict_spot:
                counts[(wf, stage, "evict")] += 1
                outcome = "evicted"
            elif counts[(wf, stage, "app")] < fate.fail_first:
                counts[(wf, stage, "app")] += 1
                outcome = "app_failure"
            else:
                outcome = "succeeded"
        with self._lock:
            self.events.append(Event(wf, stage, name, pod.spec.node_name, outcome, memory,
                                     time.monotonic()))
        if outcome == "reclaimed":
            self._reclaim(pod)
            return
        if outcome == "evicted":
            self._evict(pod)
            return
        exit_code, reason, verdict = {
            "oom": (contract.EXIT_HOST_OOM, "OOMKilled", contract.VERDICT_HOST_OOM),
            "app_failure": (contract.EXIT_APP_FAILURE, "Error", contract.VERDICT_APP_FAILURE),
            "succeeded": (contract.EXIT_SUCCESS, "Completed", contract.VERDICT_SUCCESS),
        }[outcome]
        # An OOM kill is the kernel's: the wrapper dies with the process and writes nothing.
        message = "" if outcome == "oom" else verdict_line(verdict, {"exit_code": exit_code})
        self._terminate(pod, exit_code, reason, message)
        self._report(pod, succeeded=outcome == "succeeded")

    def _node_labels(self, name: str) -> dict[str, str]:
        """A node's labels (the fleet's nodes never change during a session)."""
        if name not in self._nodes:
            self._nodes[name] = dict(self.core.read_node(name).metadata.labels or {})
        return self._nodes[name]

    def _terminate(self, pod: Any, exit_code: int, reason: str, message: str,
                   conditions: list[dict[str, str]] | None = None) -> None:
        now = datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
        started = now
        statuses = []
        for c in pod.spec.containers:
            main = c.name == "main"
            terminated: dict[str, Any] = {
                "exitCode": exit_code if main else 0,
                "reason": reason if main else "Completed",
                "startedAt": started, "finishedAt": now,
            }
            if main and message:
                terminated["message"] = message
            statuses.append({"name": c.name, "image": c.image, "imageID": "",
                             "ready": False, "restartCount": 0, "started": False,
                             "state": {"terminated": terminated}})
        body = {"status": {
            "phase": "Succeeded" if exit_code == 0 else "Failed",
            "containerStatuses": statuses,
            "conditions": [{"type": "Ready", "status": "False", "reason": "PodCompleted",
                            "lastTransitionTime": now}, *(conditions or [])],
        }}
        self.core.patch_namespaced_pod_status(pod.metadata.name, pod.metadata.namespace, body)

    def _reclaim(self, pod: Any) -> None:
        """A spot reclaim as the kubelet's graceful node shutdown plays it: the pod gets a
        ``DisruptionTarget`` condition, ``main`` gets SIGTERM, and the runtime's wrapper ends
        with exit 143 and the ``preempted`` verdict after its final checkpoint; the pod is
        Failed. The pod is not deleted: Argo re-creates a pod deleted while its node still reads
        Pending (operator.go, "Workflow pod is missing"), so deleting a pod that ran a second
        would test the watcher's timing, not the lowering."""
        now = datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
        self._terminate(pod, contract.EXIT_PREEMPTED, "Error",
                        verdict_line(contract.VERDICT_PREEMPTED,
                                     {"exit_code": contract.EXIT_PREEMPTED}),
                        conditions=[{"type": "DisruptionTarget", "status": "True",
                                     "reason": "TerminationByKubelet",
                                     "message": "spot instance reclaimed: imminent node shutdown",
                                     "lastTransitionTime": now}])
        self._report(pod, succeeded=False)

    def _evict(self, pod: Any) -> None:
        """A drain: the Eviction API (no PodDisruptionBudget here) marks the pod with
        ``DisruptionTarget`` and deletes it; KWOK's pod-delete Stage removes it. Nothing reports
        for it, as a wait container killed with its node would not."""
        self.core.create_namespaced_pod_eviction(
            pod.metadata.name, pod.metadata.namespace,
            {"apiVersion": "policy/v1", "kind": "Eviction",
             "metadata": {"name": pod.metadata.name, "namespace": pod.metadata.namespace}})

    def _resource_or_log(self, pod: Any) -> None:
        try:
            self._resource(pod)
        except Exception:  # a thread's error would vanish: the pod would just never end
            import traceback

            traceback.print_exc()

    def _resource(self, pod: Any) -> None:
        """``argoexec resource create``: create, wait for a condition, report outputs."""
        res = _template(pod)["resource"]
        manifest = yaml.safe_load(res["manifest"])
        group, version = manifest["apiVersion"].split("/")
        ns = manifest["metadata"].get("namespace") or pod.metadata.namespace
        plural = manifest["kind"].lower() + "s"
        name = self.custom.create_namespaced_custom_object(
            group, version, ns, plural, manifest)["metadata"]["name"]
        failed = ""
        while not self._stop.is_set():
            obj = self.custom.get_namespaced_custom_object(group, version, ns, plural, name)
            if res.get("failureCondition") and _holds(obj, res["failureCondition"]):
                failed = f"failure condition '{res['failureCondition']}' evaluated true"
                break
            if _holds(obj, res.get("successCondition", "")):
                break
            time.sleep(RESOURCE_STATE_CHECK_INTERVAL)
        else:
            return
        params = [] if failed else [
            {"name": p["name"], "value": _jq(obj, p["valueFrom"]["jqFilter"])}
            for p in (_template(pod).get("outputs") or {}).get("parameters") or []]
        with self._lock:
            self.events.append(Event(pod.metadata.labels[WF_LABEL], "", pod.metadata.name,
                                     pod.spec.node_name, "app_failure" if failed else
                                     "succeeded", "", time.monotonic()))
        self._terminate(pod, 1 if failed else 0, "Error" if failed else "Completed", failed)
        self._report(pod, succeeded=not failed, params=params)

    def _report(self, pod: Any, succeeded: bool,
                params: list[dict[str, Any]] | None = None) -> None:
        """The WorkflowTaskResult Argo's wait container writes when the pod ends."""
        tmpl = _template(pod)
        outputs: dict[str, Any] = {}
        command = json.dumps(next(c for c in pod.spec.containers if c.name == "main").command)
        params = list(params or [])
        for p in [] if params else (tmpl.get("outputs") or {}).get("parameters") or []:
            vf = p.get("valueFrom") or {}
            if succeeded and "path" in vf:
                digest = hashlib.sha256(f"{p['name']}\0{command}".encode()).hexdigest()
                params.append({"name": p["name"], "value": f"sha256:{digest}"})
            elif "default" in vf:
                params.append({"name": p["name"], "value": vf["default"]})
        if params:
            outputs["parameters"] = params
        if succeeded:
            arts = [{"name": a["name"], "path": a.get("path", ""),
                     "s3": {"key": f"{pod.metadata.name}/{a['name']}.tgz"}}
                    for a in (tmpl.get("outputs") or {}).get("artifacts") or []]
            if arts:
                outputs["artifacts"] = arts
        wf = pod.metadata.labels[WF_LABEL]
        owner = next((o for o in pod.metadata.owner_references or [] if o.kind == "Workflow"),
                     None)
        body: dict[str, Any] = {
            "apiVersion": "argoproj.io/v1alpha1", "kind": "WorkflowTaskResult",
            "metadata": {
                "name": pod.metadata.annotations[NODE_ID],
                "labels": {WF_LABEL: wf,
                           "workflows.argoproj.io/report-outputs-completed": "true"},
                "ownerReferences": [{"apiVersion": "argoproj.io/v1alpha1", "kind": "Workflow",
                                     "name": wf, "uid": owner.uid}] if owner else [],
            },
        }
        if outputs:
            body["outputs"] = outputs
        try:
            self.custom.create_namespaced_custom_object(
                "argoproj.io", "v1alpha1", pod.metadata.namespace, "workflowtaskresults", body)
        except ApiException as exc:
            if exc.status != 409:
                raise


def _template(pod: Any) -> dict[str, Any]:
    for c in [*(pod.spec.init_containers or []), *pod.spec.containers]:
        for env in c.env or []:
            if env.name == "ARGO_TEMPLATE" and env.value and env.value.startswith("{"):
                result: dict[str, Any] = json.loads(env.value)
                return result
    return {}


def _is_resource_pod(pod: Any) -> bool:
    main = next((c for c in pod.spec.containers if c.name == "main"), None)
    command = (main.command or []) if main is not None else []  # emissary -- argoexec ...
    return any(command[i:i + 2] == ["argoexec", "resource"] for i in range(len(command)))


def _holds(obj: dict[str, Any], condition: str) -> bool:
    """A resource template's condition, in the forms the compiler writes (``path == v``,
    ``path in (a, b)``); Argo parses them as label selectors over gjson paths."""
    m = re.fullmatch(r"\s*([\w.]+)\s*(==|in)\s*(.+?)\s*", condition)
    if not m:
        return False
    value: Any = obj
    for part in m.group(1).split("."):
        value = value.get(part) if isinstance(value, dict) else None
    wanted = ([v.strip() for v in m.group(3).strip("()").split(",")] if m.group(2) == "in"
              else [m.group(3)])
    return value is not None and str(value) in wanted


_JQ = re.compile(r'\.status\.outputs\.parameters\[\] \| select\(\.name == "([^"]+)"\) \| \.value'
                 r'(?: \| fromjson \| del\(\.path\) \| \.name = "([^"]+)")?')


def _jq(obj: dict[str, Any], jq_filter: str) -> str:
    """The compiler's ``jqFilter``s over a child Workflow (anything else fails loudly)."""
    m = _JQ.fullmatch(jq_filter)
    assert m, f"the e2e watcher cannot evaluate jqFilter {jq_filter!r}"
    params = ((obj.get("status") or {}).get("outputs") or {}).get("parameters") or []
    value = str(next(p.get("value", "") for p in params if p["name"] == m.group(1)))
    if not m.group(2):
        return value
    art = json.loads(value)
    art.pop("path", None)
    art["name"] = m.group(2)
    return json.dumps(art, separators=(",", ":"))
