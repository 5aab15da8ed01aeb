"""Kueue v0.17.0 on the e2e control plane (issue 26), started when a case first needs it.

Built like the rest of the control plane (``tools/cluster/kueue``: ``sigs.k8s.io/kueue/cmd/kueue``
from the Go module proxy) and installed from its own ``config/components``: the CRDs, the
manager's ClusterRole (run as its own ServiceAccount, so Kueue's RBAC is what grants it access)
and its admission webhooks, pointed at ``https://127.0.0.1:<port>`` with a CA made by openssl,
as JobSet's are (``cluster.py``). Only the integrations durapipe's output uses are on: plain pods
(Argo's) and JobSets; the webhooks of the others are left out, since Kueue serves no handler
for a disabled integration and a webhook without one refuses every object (a Job of a JobSet
included). Kueue manages the namespaces labelled ``durapipe.dev/kueue=true`` and no other (its
``managedJobsNamespaceSelector``, and the pod and JobSet webhooks' ``namespaceSelector``), so the
other e2e cases run as before. Nothing listens beyond 127.0.0.1: metrics off, the visibility
server off (``VisibilityOnDemand=false``), health and webhooks on loopback.
"""

from __future__ import annotations

import base64
import threading
import time
import urllib.request
from pathlib import Path
from typing import Any

import yaml

from argo.argo_tools import go_module_dir

from .cluster import (
    TOOLS,
    Cluster,
    Proc,
    _base_env,
    _wait,
    _webhook_certs,
    free_port,
)

KUEUE_NAMESPACE = "kueue-system"
KUEUE_ACCOUNT = "kueue-controller-manager"
#: The label of the namespaces Kueue manages here.
MANAGED = ("durapipe.dev/kueue", "true")
#: Kueue's webhooks for what durapipe's output creates (pods, JobSets) and for its own objects.
_HOOK_PATHS = ("-v1-pod", "-jobset-x-k8s-io-", "-kueue-x-k8s-io-")
#: Webhooks that see every object of their kind unless told which namespaces to look at.
_SCOPED = ("-v1-pod", "-jobset-x-k8s-io-")
_lock = threading.Lock()
_started: dict[int, Proc] = {}


def kueue_components() -> Path:
    return go_module_dir(TOOLS / "cluster" / "kueue", "sigs.k8s.io/kueue") / "config" / \
        "components"


def install_docs(webhook_url: str, ca_pem: str) -> list[dict[str, Any]]:
    """Kueue's namespace, ServiceAccount, ClusterRole (+binding) and webhook configurations."""
    components = kueue_components()
    ca = base64.b64encode(ca_pem.encode()).decode()
    docs: list[dict[str, Any]] = [
        {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": KUEUE_NAMESPACE}},
        {"apiVersion": "v1", "kind": "ServiceAccount",
         "metadata": {"name": KUEUE_ACCOUNT, "namespace": KUEUE_NAMESPACE}}]
    for doc in yaml.safe_load_all((components / "rbac" / "role.yaml").read_text()):
        if doc and doc["kind"] == "ClusterRole":
            doc["metadata"]["name"] = "kueue-" + doc["metadata"]["name"]
            docs.append(doc)
            docs.append({
                "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
                "metadata": {"name": doc["metadata"]["name"]},
                "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole",
                            "name": doc["metadata"]["name"]},
                "subjects": [{"kind": "ServiceAccount", "name": KUEUE_ACCOUNT,
                              "namespace": KUEUE_NAMESPACE}]})
    # Its manager reads Secrets in its own namespace (MultiKueue's kubeconfigs) and waits for
    # that informer before it starts any controller.
    for name in ("manager_secrets_role.yaml", "manager_secrets_role_binding.yaml"):
        doc = yaml.safe_load((components / "rbac" / name).read_text())
        doc["metadata"] = {"name": "kueue-" + doc["metadata"]["name"],
                           "namespace": KUEUE_NAMESPACE}
        if "roleRef" in doc:
            doc["roleRef"]["name"] = "kueue-" + doc["roleRef"]["name"]
            doc["subjects"] = [{"kind": "ServiceAccount", "name": KUEUE_ACCOUNT,
                                "namespace": KUEUE_NAMESPACE}]
        docs.append(doc)
    managed = {"matchLabels": {MANAGED[0]: MANAGED[1]}}
    for doc in yaml.safe_load_all((components / "webhook" / "manifests.yaml").read_text()):
        if not doc:
            continue
        doc["metadata"]["name"] = "kueue-" + doc["metadata"]["name"]
        hooks = []
        for hook in doc.get("webhooks") or []:
            path = hook["clientConfig"]["service"]["path"]
            if not any(p in path for p in _HOOK_PATHS):
                continue
            hook["clientConfig"] = {"url": webhook_url + path, "caBundle": ca}
            if any(p in path for p in _SCOPED):
                hook["namespaceSelector"] = managed
            hooks.append(hook)
        doc["webhooks"] = hooks
        docs.append(doc)
    return docs


def crd_files() -> list[Path]:
    return sorted((kueue_components() / "crd" / "bases").glob("*.yaml"))


def ensure_kueue(cluster: Cluster) -> Proc:
    """Kueue installed and its manager running on ``cluster`` (once; later calls return it)."""
    with _lock:
        proc = _started.get(id(cluster))
        if proc is not None and proc.popen.poll() is None:
            return proc
        proc = _start(cluster)
        _started[id(cluster)] = proc
        return proc


def _start(cluster: Cluster) -> Proc:
    st = cluster.state
    t0 = time.monotonic()
    pki = st / "kueue-pki"
    ca_pem = _webhook_certs(pki)
    webhook_port, health_port = free_port(), free_port()
    # The CRDs first (the workloads CRD alone is 19,000 lines): the webhooks refer to them.
    cluster.kubectl("apply", "--server-side", "--field-manager=durapipe-e2e", "--force-conflicts",
                    *[a for f in crd_files() for a in ("-f", str(f))], timeout=300)
    cluster.apply(install_docs(f"https://127.0.0.1:{webhook_port}", ca_pem))
    for crd in ("workloads", "clusterqueues", "localqueues", "resourceflavors",
                "workloadpriorityclasses"):
        cluster.wait_crd_established(f"{crd}.kueue.x-k8s.io")
    kc = cluster.account_kubeconfig(KUEUE_ACCOUNT, KUEUE_NAMESPACE, st / "kueue.kubeconfig")
    cfg = st / "kueue-config.yaml"
    cfg.write_text(yaml.safe_dump({
        "apiVersion": "config.kueue.x-k8s.io/v1beta2", "kind": "Configuration",
        "namespace": KUEUE_NAMESPACE,
        "leaderElection": {"leaderElect": False},
        "internalCertManagement": {"enable": False},
        "webhook": {"host": "127.0.0.1", "port": webhook_port, "certDir": str(pki)},
        "metrics": {"bindAddress": "0"},
        "health": {"healthProbeBindAddress": f"127.0.0.1:{health_port}"},
        "manageJobsWithoutQueueName": False,
        "managedJobsNamespaceSelector": {"matchLabels": {MANAGED[0]: MANAGED[1]}},
        "integrations": {"frameworks": ["pod", "jobset.x-k8s.io/jobset"]},
        "clientConnection": {"qps": 100, "burst": 200},
    }))
    proc = cluster._spawn("kueue-controller", [
        str(cluster.bins["kueue-controller"]), f"--kubeconfig={kc}", f"--config={cfg}",
        "--feature-gates=VisibilityOnDemand=false", "--zap-devel=false", "--zap-log-level=2",
    ], env={**_base_env(), "KUBECONFIG": str(kc),
            # Read by the build's overlay (tools/cluster/kueue/overlay): the serving pair, unused
            # with metrics off, that v0.17.0 otherwise wants in /etc/kueue/metrics/certs.
            "DURAPIPE_KUEUE_METRICS_CERTS": str(pki)})
    _wait("kueue-controller webhook", lambda: urllib.request.urlopen(
        f"http://127.0.0.1:{health_port}/readyz", timeout=2).status == 200, 90,
        cluster._died(proc))
    cluster.timings["kueue-start"] = time.monotonic() - t0
    return proc


def queues(flavors: dict[str, dict[str, Any]], quota: dict[str, dict[str, str]],
           queue: str, namespace: str, cluster_queue: str) -> list[dict[str, Any]]:
    """ResourceFlavors (each with the node labels of its GPU type), one ClusterQueue holding
    ``quota`` per flavor (in one resource group, so a pod's flavor is the first whose labels
    its node selector accepts and whose quota it fits), and the namespace's LocalQueue."""
    resources = sorted({r for q in quota.values() for r in q})
    docs: list[dict[str, Any]] = [
        {"apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "ResourceFlavor",
         "metadata": {"name": name}, "spec": spec} for name, spec in flavors.items()]
    docs.append({
        "apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "ClusterQueue",
        "metadata": {"name": cluster_queue},
        "spec": {
            "namespaceSelector": {},
            "preemption": {"withinClusterQueue": "LowerPriority"},
            "resourceGroups": [{
                "coveredResources": resources,
                "flavors": [{"name": name, "resources": [
                    {"name": r, "nominalQuota": quota[name].get(r, "0")} for r in resources]}
                    for name in flavors]}]}})
    docs.append({"apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "LocalQueue",
                 "metadata": {"name": queue, "namespace": namespace},
                 "spec": {"clusterQueue": cluster_queue}})
    return docs


def case_setup(cluster: Cluster, spec: dict[str, Any], namespace: str, case: str) -> None:
    """A case's ``[kueue]`` section on ``cluster``: Kueue started, the namespace managed, the
    case's PriorityClasses, flavours (one per GPU type of the profile, named by the type) with
    their quotas, a ClusterQueue of its own and the LocalQueue the pipeline names."""
    from durapipe.dsl.catalog import PROFILES

    ensure_kueue(cluster)
    # A field manager of its own: the case's own apply of the namespace (without the label)
    # must not take the label away again.
    cluster.apply([{"apiVersion": "v1", "kind": "Namespace",
                    "metadata": {"name": namespace, "labels": {MANAGED[0]: MANAGED[1]}}}],
                  field_manager="durapipe-e2e-kueue")
    classes = [{"apiVersion": "scheduling.k8s.io/v1", "kind": "PriorityClass",
                "metadata": {"name": name}, "value": int(value)}
               for name, value in (spec.get("priority_classes") or {}).items()]
    if classes:
        cluster.apply(classes)
    profile = PROFILES[spec["profile"]]
    # First a flavour for pods without GPUs (a multi-node stage's executor pod): Kueue gives a
    # pod the first flavour it fits, and a GPU flavour's node labels would send it to a GPU
    # node its tolerations do not admit it to.
    flavors: dict[str, dict[str, Any]] = {f"{case}-cpu": {}}
    quota = {f"{case}-cpu": {"cpu": "1000", "memory": "100Ti", "nvidia.com/gpu": "0"}}
    for gpu, count in spec["quota"].items():
        flavors[f"{case}-{gpu.lower()}"] = {
            "nodeLabels": {profile.gpu_label: profile.gpu_products[gpu]}}
        quota[f"{case}-{gpu.lower()}"] = {"cpu": "1000", "memory": "100Ti",
                                         "nvidia.com/gpu": str(count)}
    cluster.apply(queues(flavors, quota, spec["queue"], namespace, f"{case}-cq"))


def holder(spec: dict[str, Any], namespace: str, queue: str, profile_name: str,
           name: str) -> dict[str, Any]:
    """Another team's pod in the same queue, asking for ``gpus`` of ``gpu``: Kueue admits it
    against the same quota (a plain pod, so nothing of fates.py ends it; the case deletes it)."""
    from durapipe.dsl.catalog import PROFILES

    profile = PROFILES[profile_name]
    gpus = str(spec["gpus"])
    pod: dict[str, Any] = {
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "namespace": namespace,
                     "labels": {"kueue.x-k8s.io/queue-name": queue}},
        "spec": {"nodeSelector": {profile.gpu_label: profile.gpu_products[spec["gpu"]]},
                 "tolerations": [{"operator": "Exists"}],
                 "terminationGracePeriodSeconds": 0,
                 "containers": [{"name": "hold", "image": "hold",
                                 "resources": {"limits": {"nvidia.com/gpu": gpus, "cpu": "1",
                                                          "memory": "1Gi"}}}]}}
    if spec.get("priority_class"):
        pod["spec"]["priorityClassName"] = spec["priority_class"]
    return pod


class Holders:
    """The ``[[kueue.holders]]`` of a submission: each created ``at`` seconds after it (0: before
    the Workflow) and deleted ``release`` seconds after it, on timers."""

    def __init__(self, cluster: Cluster, spec: dict[str, Any], namespace: str,
                 prefix: str) -> None:
        self.cluster, self.timers = cluster, []  # type: ignore[var-annotated]
        self.pods = [holder(h, namespace, spec["queue"], spec["profile"], f"{prefix}hold-{i}")
                     for i, h in enumerate(spec.get("holders") or [])]
        self.when = [(float(h.get("at", 0)), float(h["release"]))
                     for h in spec.get("holders") or []]
        self.errors: list[str] = []

    def _create(self, pod: dict[str, Any]) -> None:
        try:
            self.cluster.apply([pod])
        except Exception as exc:  # reported by the case, not lost in a timer thread
            self.errors.append(f"creating {pod['metadata']['name']}: {exc}")

    def _delete(self, pod: dict[str, Any]) -> None:
        meta = pod["metadata"]
        proc = self.cluster.kubectl("delete", "pod", meta["name"], "-n", meta["namespace"],
                                    "--wait=false", "--ignore-not-found", check=False)
        if proc.returncode != 0:
            self.errors.append(f"deleting {meta['name']}: {proc.stderr}")

    def start(self) -> None:
        """Before the Workflow: create the ``at = 0`` holders and wait until Kueue admitted
        them (so the quota is taken when the stage's first pod asks), arm the rest."""
        for pod, (at, release) in zip(self.pods, self.when):
            if at == 0:
                self._create(pod)
                meta = pod["metadata"]
                _wait(f"Kueue admits {meta['name']}", lambda meta=meta: self.cluster.kubectl(
                    "get", "pod", meta["name"], "-n", meta["namespace"], "-o",
                    "jsonpath={.spec.schedulingGates}", check=False).stdout.strip() == "", 60)
            else:
                self._later(at, self._create, pod)
            self._later(release, self._delete, pod)

    def _later(self, seconds: float, action: Any, pod: dict[str, Any]) -> None:
        timer = threading.Timer(seconds, action, args=(pod,))
        timer.daemon = True
        timer.start()
        self.timers.append(timer)

    def stop(self) -> None:
        for timer in self.timers:
            timer.cancel()
        for pod in self.pods:
            self._delete(pod)


def workload_events(cluster: Cluster, namespace: str, workflow: str) -> dict[str, int]:
    """How many times Kueue admitted and preempted the Workloads of ``workflow``'s pods and
    JobSets (its ``Admitted`` and ``Preempted`` events; a Workload is named
    ``pod-<pod>-<hash>`` or ``jobset-<jobset>-<hash>``, and both names start with the run's)."""
    import json

    out = cluster.kubectl("get", "events", "-n", namespace, "-o", "json").stdout
    counts = {"admitted": 0, "preempted": 0}
    for event in json.loads(out)["items"]:
        involved = event.get("involvedObject") or {}
        if involved.get("kind") != "Workload" or not involved.get("name", "").startswith(
                (f"pod-{workflow}", f"jobset-{workflow}")):
            continue
        key = {"Admitted": "admitted", "Preempted": "preempted"}.get(event.get("reason", ""))
        if key:
            counts[key] += int(event.get("count") or 1)
    return counts
