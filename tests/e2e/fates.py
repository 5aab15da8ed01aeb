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
(``durapipe.runtime.verdict.verdict_line``). Then, as Argo's wait container would, it writes the
pod's ``WorkflowTaskResult`` (named after the pod's node id, owned by the Workflow, labelled
``report-outputs-completed: "true"``) with the output parameters and artifacts the template
(``ARGO_TEMPLATE``) declares: a parameter read from a path gets a content hash of what the pod
ran (its command line), so a changed parameter changes it; a failed pod reports each parameter's
``valueFrom.default`` instead. Counting is per workflow and stage.

Two more kinds of pod, for multi-node stages:

- a **resource template's** pod (``argoexec resource``: a multi-node stage's JobSet, a split
  pipeline's child Workflow per part): the watcher does what that executor does (v4.1.2
  ``workflow/executor/resource.go``): it creates the template's manifest as the pod's
  ServiceAccount (so RBAC and admission webhooks, JobSet's included, judge it), reads the object
  every 5 s (argoexec's default) until ``failureCondition`` or ``successCondition`` holds (the
  ``path == v`` and ``path in (a, b)`` forms the compiler writes), reports the output parameters
  (``jsonPath`` ``{.a.b}`` and the compiler's two ``jqFilter`` forms; anything else fails the
  pod loudly) in the ``WorkflowTaskResult`` and ends the pod (a refused create or the failure
  condition: exit 1, the error as termination message, as argoexec writes it);
- a **JobSet's** pod (label ``jobset.sigs.k8s.io/jobset-name``, no Argo label, no
  ``WorkflowTaskResult``): the rules count restart attempts (the pod's
  ``jobset.sigs.k8s.io/restart-attempt``), not pods. In the first ``preempt_first`` attempts,
  then the next ``fail_first``, the pod of completion index 0 is preempted (``Failed`` with a
  ``DisruptionTarget`` condition, exit 143, as the kubelet reports a node shutdown) or exits 1;
  the other pods of such an attempt stay Running, as torchrun peers waiting for a lost rank do,
  until the Job controller ends them. Every pod of a later attempt succeeds.
  Where ``main`` ends on its own (exit 0 or 1), any other regular container of the pod keeps
  running, as durapipe's upload agent does until a SIGTERM that nothing sends in a Job pod
  (no wait container there), so the pod stays Running; a native sidecar (an init container
  with ``restartPolicy: Always``) is stopped by the kubelet and does not hold the pod.
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
from durapipe.runtime.verdict import verdict_line

WF_LABEL = "workflows.argoproj.io/workflow"
JOBSET_LABEL = "jobset.sigs.k8s.io/jobset-name"
RESTART_ATTEMPT = "jobset.sigs.k8s.io/restart-attempt"
COMPLETION_INDEX = "batch.kubernetes.io/job-completion-index"
#: How often the played ``argoexec resource`` reads the object it waits on: argoexec's default
#: (``RESOURCE_STATE_CHECK_INTERVAL``, 5 s).
RESOURCE_POLL_S = 5.0
NODE_ID = "workflows.argoproj.io/node-id"
STAGE_LABEL = "durapipe.dev/stage"
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
    preempt_first: int = 0  # JobSet pods: the first N restart attempts lose rank 0 to preemption


@dataclass
class Event:
    """What the watcher did to one pod (scenarios assert on these)."""

    workflow: str
    stage: str
    pod: str
    node: str
    outcome: str  # succeeded, app_failure, oom, reclaimed, evicted, preempted
    memory: str
    at: float
    attempt: str = ""  # a JobSet pod's restart attempt


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
    #: (workflow, stage) -> the final status of the object a resource template waited on
    resources: dict[tuple[str, str], dict[str, Any]] = field(default_factory=dict)

    def start(self) -> None:
        api_client = config.new_client_from_config(self.kubeconfig)
        self.core = client.CoreV1Api(api_client)
        self.custom = client.CustomObjectsApi(api_client)
        self.server = api_client.configuration.host
        # Several finishers: each pod's end is four API calls, and a wide stage level (the
        # 2,000-stage case) has hundreds of pods Running at once.
        for target in (self._watch, self._watch_jobset_pods, *[self._finisher] * FINISHERS):
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
    def _watch_jobset_pods(self) -> None:
        self._watch(JOBSET_LABEL)

    def _watch(self, selector: str = WF_LABEL) -> None:
        while not self._stop.is_set():
            try:
                pods = self.core.list_pod_for_all_namespaces(label_selector=selector)
                for pod in pods.items:
                    self._consider(pod)
                w = watch.Watch()
                for ev in w.stream(self.core.list_pod_for_all_namespaces,
                                   label_selector=selector, timeout_seconds=30,
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
            fate = self.fate_for(_workflow(pod), (pod.metadata.labels or {}).get(STAGE_LABEL, ""))
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
        if JOBSET_LABEL in (pod.metadata.labels or {}):
            self._finish_jobset_pod(pod)
            return
        if "resource" in _template(pod):
            threading.Thread(target=self._play_resource_or_log, args=(pod,), daemon=True).start()
            return
        wf = pod.metadata.labels[WF_LABEL]
        stage = pod.metadata.labels.get(STAGE_LABEL, "")
        fate = self.fate_for(wf, stage)
        memory = _memory_limit(pod)
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
                   conditions: list[dict[str, str]] | None = None,
                   still_running: frozenset[str] = frozenset()) -> None:
        """``main`` ends with ``exit_code``; so does every other container, except those in
        ``still_running``, which keep the pod Running (the kubelet ends a pod only when all its
        regular containers have ended)."""
        now = datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
        started = now
        statuses = []
        for c in pod.spec.containers:
            main = c.name == "main"
            if c.name in still_running:
                statuses.append(_container_status(c, {"running": {"startedAt": started}},
                                                  running=True))
                continue
            terminated: dict[str, Any] = {
                "exitCode": exit_code if main else 0,
                "reason": reason if main else "Completed",
                "startedAt": started, "finishedAt": now,
            }
            if main and message:
                terminated["message"] = message
            statuses.append(_container_status(c, {"terminated": terminated}, running=False))
        if still_running:
            body = {"status": {"containerStatuses": statuses}}
        else:
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
        self._node_shutdown(pod, "spot instance reclaimed: imminent node shutdown")
        self._report(pod, succeeded=False)

    def _node_shutdown(self, pod: Any, why: str) -> None:
        """The pod's end in a graceful node shutdown, in one status write (the Job controller
        must never see the failure without its condition)."""
        now = datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
        self._terminate(pod, contract.EXIT_PREEMPTED, "Error",
                        verdict_line(contract.VERDICT_PREEMPTED,
                                     {"exit_code": contract.EXIT_PREEMPTED}),
                        conditions=[{"type": "DisruptionTarget", "status": "True",
                                     "reason": "TerminationByKubelet", "message": why,
                                     "lastTransitionTime": now}])

    def _evict(self, pod: Any) -> None:
        """A drain: the Eviction API (no PodDisruptionBudget here) marks the pod with
        ``DisruptionTarget`` and deletes it; KWOK's pod-delete Stage removes it. Nothing reports
        for it, as a wait container killed with its node would not."""
        self.core.create_namespaced_pod_eviction(
            pod.metadata.name, pod.metadata.namespace,
            {"apiVersion": "policy/v1", "kind": "Eviction",
             "metadata": {"name": pod.metadata.name, "namespace": pod.metadata.namespace}})

    def _report(self, pod: Any, succeeded: bool,
                resource_params: list[dict[str, str]] | None = None) -> None:
        """The WorkflowTaskResult Argo's wait container writes when the pod ends."""
        tmpl = _template(pod)
        outputs: dict[str, Any] = {}
        command = json.dumps(_main(pod).command)
        params = list(resource_params or [])
        for p in [] if resource_params is not None else \
                (tmpl.get("outputs") or {}).get("parameters") or []:
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

    # -- multi-node stages: argoexec's resource template and the JobSet's pods -------------------
    def _play_resource_or_log(self, pod: Any) -> None:
        try:
            self._play_resource(pod)
        except Exception:  # a thread's error would vanish: the pod would just never end
            import traceback

            traceback.print_exc()

    def _play_resource(self, pod: Any) -> None:
        """What ``argoexec resource create`` does, as the pod's ServiceAccount."""
        tmpl = _template(pod)
        res = tmpl["resource"]
        ns, wf = pod.metadata.namespace, pod.metadata.labels[WF_LABEL]
        stage = (pod.metadata.labels or {}).get(STAGE_LABEL, "")
        manifest = yaml.safe_load(res["manifest"])
        try:
            if res.get("action") != "create":
                raise _ResourceError(f"the e2e executor plays action create only, not "
                                     f"{res.get('action')!r}")
            api = self._dynamic_as(pod)
            kind = api.resources.get(api_version=manifest["apiVersion"], kind=manifest["kind"])
            try:
                obj = kind.create(body=manifest, namespace=ns).to_dict()
            except ApiException as exc:  # refused by RBAC, schema or an admission webhook
                raise _ResourceError(_api_message(exc)) from exc
            name = obj["metadata"]["name"]
            while not self._stop.is_set():
                obj = kind.get(name=name, namespace=ns).to_dict()
                if _condition_holds(res.get("failureCondition", ""), obj):
                    self.resources[(wf, stage)] = obj.get("status") or {}
                    raise _ResourceError(
                        f"failure condition '{res['failureCondition']}' evaluated true")
                if _condition_holds(res.get("successCondition", ""), obj):
                    break
                time.sleep(RESOURCE_POLL_S)
            else:
                return
            self.resources[(wf, stage)] = obj.get("status") or {}
            params = [{"name": p["name"], "value": _output_value(obj, p["valueFrom"])}
                      for p in (tmpl.get("outputs") or {}).get("parameters") or []
                      if {"jsonPath", "jqFilter"} & set(p.get("valueFrom") or {})]
        except (_ResourceError, ApiException) as exc:  # ApiException: reading the object failed
            message = str(exc) if isinstance(exc, _ResourceError) else _api_message(exc)
            try:
                self._terminate(pod, 1, "Error", message)
                self._report(pod, succeeded=False, resource_params=[])
            except ApiException as gone:
                if gone.status != 404:  # a pod deleted meanwhile (the workflow's cleanup)
                    raise
            return
        self._terminate(pod, 0, "Completed", "")
        self._report(pod, succeeded=True, resource_params=params)

    def _dynamic_as(self, pod: Any) -> Any:
        """A client authenticated as the pod's ServiceAccount (a TokenRequest token)."""
        from kubernetes import dynamic

        account = pod.spec.service_account_name or "default"
        token = self.core.create_namespaced_service_account_token(
            account, pod.metadata.namespace, client.AuthenticationV1TokenRequest(
                spec=client.V1TokenRequestSpec(audiences=[], expiration_seconds=3600)),
        ).status.token
        cfg = client.Configuration()
        cfg.host = self.server
        cfg.verify_ssl = False
        cfg.api_key = {"authorization": f"Bearer {token}"}
        return dynamic.DynamicClient(client.ApiClient(cfg))

    def _finish_jobset_pod(self, pod: Any) -> None:
        wf, stage = _workflow(pod), pod.metadata.labels.get(STAGE_LABEL, "")
        fate = self.fate_for(wf, stage)
        annotations = pod.metadata.annotations or {}
        attempt = int(annotations.get(RESTART_ATTEMPT, "0"))
        if attempt < fate.preempt_first:
            outcome = "preempted"
        elif attempt < fate.preempt_first + fate.fail_first:
            outcome = "app_failure"
        else:
            outcome = "succeeded"
        if outcome != "succeeded" and annotations.get(COMPLETION_INDEX) != "0":
            return  # a peer of the lost rank: Running until the Job controller ends it
        memory = _memory_limit(pod)
        with self._lock:
            self.events.append(Event(wf, stage, pod.metadata.name, pod.spec.node_name, outcome,
                                     memory, time.monotonic(), str(attempt)))
        if outcome == "preempted":  # a preemption or host maintenance: the node shuts down
            self._node_shutdown(pod, "Pod was terminated in response to imminent node shutdown.")
            return
        exit_code, reason, verdict = {
            "app_failure": (contract.EXIT_APP_FAILURE, "Error", contract.VERDICT_APP_FAILURE),
            "succeeded": (contract.EXIT_SUCCESS, "Completed", contract.VERDICT_SUCCESS),
        }[outcome]
        # No wait container tends a Job pod, so nothing stops a plain sidecar once main has
        # ended: durapipe's upload agent ends only on SIGTERM (tests/runtime,
        # test_the_upload_agent_runs_until_sigterm), and the pod stays Running. A native
        # sidecar (an init container with restartPolicy Always) is stopped by the kubelet.
        lingering = frozenset(c.name for c in pod.spec.containers if c.name != "main")
        self._terminate(pod, exit_code, reason, verdict_line(verdict, {"exit_code": exit_code}),
                        still_running=lingering)


class _ResourceError(Exception):
    """Why the played ``argoexec resource`` failed: the pod's termination message."""


def _workflow(pod: Any) -> str:
    """The workflow a pod belongs to: Argo's label, or for a JobSet's pod the run id the
    compiled manifest passes (``DURAPIPE_RUN_ID``, substituted by Argo)."""
    labels = pod.metadata.labels or {}
    if WF_LABEL in labels:
        return str(labels[WF_LABEL])
    main = _main(pod)
    for env in (main.env or []) if main else []:
        if env.name == contract.ENV_RUN_ID and env.value:
            return str(env.value)
    return ""


def _main(pod: Any) -> Any:
    """The pod's ``main`` container, or ``None`` (a pod durapipe did not compile)."""
    return next((c for c in pod.spec.containers if c.name == "main"), None)


def _memory_limit(pod: Any) -> str:
    """``main``'s memory limit as written in the pod spec (``""`` when it has none)."""
    main = _main(pod)
    limits = (main.resources.limits or {}) if main is not None and main.resources else {}
    return str(limits.get("memory", ""))


def _container_status(c: Any, state: dict[str, Any], *, running: bool) -> dict[str, Any]:
    """A ``containerStatuses`` entry for container ``c`` in ``state``, as a kubelet writes it."""
    return {"name": c.name, "image": c.image, "imageID": "", "ready": running,
            "restartCount": 0, "started": running, "state": state}


def _api_message(exc: Any) -> str:
    try:
        return str(json.loads(exc.body)["message"])
    except (ValueError, KeyError, TypeError):
        return str(exc)


def _json_path(obj: dict[str, Any], path: str) -> str:
    """``{.a.b}``, the only JSONPath the compiler writes (a resource's own fields)."""
    inner = path.strip()
    if not (inner.startswith("{.") and inner.endswith("}")):
        raise _ResourceError(f"the e2e executor reads {{.a.b}} JSONPaths only, not {path!r}")
    value: Any = obj
    for key in inner[2:-1].split("."):
        value = (value or {}).get(key, "") if isinstance(value, dict) else ""
    return str(value)


def _condition_holds(condition: str, obj: dict[str, Any]) -> bool:
    """A resource condition in the forms the compiler writes, ``path == value`` and
    ``path in (a, b)`` (argoexec reads them as label selectors over the object's JSON)."""
    if not condition:
        return False
    m = re.fullmatch(r"\s*([\w.]+)\s*(==|in)\s*(.+?)\s*", condition)
    if not m:
        raise _ResourceError(f"the e2e executor reads `path == value` and `path in (a, b)` "
                             f"conditions only, not {condition!r}")
    wanted = ([v.strip() for v in m.group(3).strip("()").split(",")] if m.group(2) == "in"
              else [m.group(3).strip()])
    return _json_path(obj, "{." + m.group(1) + "}") in wanted


def _output_value(obj: dict[str, Any], value_from: dict[str, str]) -> str:
    if "jsonPath" in value_from:
        return _json_path(obj, value_from["jsonPath"])
    return _jq(obj, value_from["jqFilter"])


def _template(pod: Any) -> dict[str, Any]:
    for c in [*(pod.spec.init_containers or []), *pod.spec.containers]:
        for env in c.env or []:
            if env.name == "ARGO_TEMPLATE" and env.value and env.value.startswith("{"):
                result: dict[str, Any] = json.loads(env.value)
                return result
    return {}


_JQ = re.compile(r'\.status\.outputs\.parameters\[\] \| select\(\.name == "([^"]+)"\) \| \.value'
                 r'(?: \| fromjson \| del\(\.path\) \| \.name = "([^"]+)")?')


def _jq(obj: dict[str, Any], jq_filter: str) -> str:
    """The compiler's ``jqFilter``s over a child Workflow (anything else fails loudly)."""
    m = _JQ.fullmatch(jq_filter)
    if not m:
        raise _ResourceError(f"the e2e executor cannot evaluate jqFilter {jq_filter!r}")
    params = ((obj.get("status") or {}).get("outputs") or {}).get("parameters") or []
    value = str(next(p.get("value", "") for p in params if p["name"] == m.group(1)))
    if not m.group(2):
        return value
    art = json.loads(value)
    art.pop("path", None)
    art["name"] = m.group(2)
    return json.dumps(art, separators=(",", ":"))
