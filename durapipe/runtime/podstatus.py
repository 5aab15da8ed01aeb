"""Why did the main container end?  Read the pod's own status from the Kubernetes API.

The wrapper cannot report a group OOM kill (cgroup v2 ``memory.oom.group`` kills it along with
the trainer), but the sidecar agent survives in its own cgroup and can ask the API server.
This uses the pod's service-account token over plain ``urllib`` (no ``kubernetes`` client in
the pod) and needs only this RBAC, bound to the stage's service account::

    apiVersion: rbac.authorization.k8s.io/v1
    kind: Role
    metadata: {name: durapipe-pod-reader}
    rules:
    - apiGroups: [""]
      resources: ["pods"]
      verbs: ["get"]

The pod name and namespace come from the downward API (``POD_NAME``, ``POD_NAMESPACE``).
"""

from __future__ import annotations

import json
import os
import ssl
import urllib.request
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from durapipe.runtime import contract

SERVICE_ACCOUNT = Path("/var/run/secrets/kubernetes.io/serviceaccount")
ENV_POD_NAME = "POD_NAME"
ENV_POD_NAMESPACE = "POD_NAMESPACE"
#: Pod condition reasons that mean the pod was disrupted from outside (preemption, eviction,
#: node shutdown), per the Kubernetes "Pod disruption conditions" documentation.
DISRUPTION_REASONS = frozenset(
    {
        "PreemptionByScheduler",
        "DeletionByTaintManager",
        "EvictionByEvictionAPI",
        "DeletionByPodGC",
        "TerminationByKubelet",
    }
)


def api_get(
    path: str,
    *,
    api: str | None = None,
    token: str | None = None,
    ca_file: str | None = None,
    timeout: float = 5.0,
) -> dict[str, Any]:
    """GET ``path`` of the Kubernetes API as this pod's service account (defaults: the
    in-cluster service host, token and CA); ``OSError`` or ``ValueError`` when it fails."""
    if api is None:
        host = os.environ["KUBERNETES_SERVICE_HOST"]
        port = os.environ.get("KUBERNETES_SERVICE_PORT", "443")
        api = f"https://{host}:{port}"
    if token is None:
        token = (SERVICE_ACCOUNT / "token").read_text().strip()
    if ca_file is None and api.startswith("https://"):
        ca_file = str(SERVICE_ACCOUNT / "ca.crt")
    request = urllib.request.Request(
        f"{api}{path}",
        headers={"Authorization": f"Bearer {token}", "Accept": "application/json"},
    )
    context = ssl.create_default_context(cafile=ca_file) if api.startswith("https://") else None
    with urllib.request.urlopen(request, timeout=timeout, context=context) as response:
        answer: dict[str, Any] = json.loads(response.read())
    return answer


def own_namespace() -> str | None:
    """The namespace this pod runs in, as its service account's mount says (``None`` outside
    a pod)."""
    try:
        return (SERVICE_ACCOUNT / "namespace").read_text().strip() or None
    except OSError:
        return None


def fetch_pod(name: str, namespace: str, **options: Any) -> dict[str, Any]:
    """GET the pod object (``options``: those of :func:`api_get`)."""
    return api_get(f"/api/v1/namespaces/{namespace}/pods/{name}", **options)


def container_ending(pod: Mapping[str, Any], container: str) -> dict[str, Any]:
    """How ``container`` ended according to the pod status, with a verdict where it tells.

    Returns ``{"verdict": ... or None, "reason", "exit_code", "signal", "message",
    "disruption"}``; ``verdict`` is ``host_oom`` for ``OOMKilled``, ``preempted`` when a
    disruption condition is set, the runtime's own verdict when the termination message
    carries one, and ``None`` when the container has not terminated.
    """
    status = pod.get("status", {})
    disruption = next(
        (
            condition.get("reason")
            for condition in status.get("conditions", [])
            if condition.get("type") == "DisruptionTarget"
            and condition.get("status") == "True"
            and condition.get("reason") in DISRUPTION_REASONS
        ),
        None,
    )
    terminated: Mapping[str, Any] = {}
    for entry in status.get("containerStatuses", []):
        if entry.get("name") == container:
            state = entry.get("state", {}).get("terminated") or entry.get("lastState", {}).get(
                "terminated"
            )
            terminated = state or {}
    message = str(terminated.get("message") or "")
    verdict: str | None = None
    if terminated.get("reason") == "OOMKilled":
        verdict = contract.VERDICT_HOST_OOM
    elif message.startswith(contract.VERDICT_TAG):
        verdict = message[len(contract.VERDICT_TAG) :].split(" ", 1)[0]
    elif disruption is not None:
        verdict = contract.VERDICT_PREEMPTED
    return {
        "verdict": verdict,
        "reason": terminated.get("reason"),
        "exit_code": terminated.get("exitCode"),
        "signal": terminated.get("signal"),
        "message": message[:500],
        "disruption": disruption,
    }


def record_pod_status(
    spool_dir: Path,
    *,
    container: str = "main",
    env: Mapping[str, str] | None = None,
    **fetch_options: Any,
) -> dict[str, Any] | None:
    """Write ``<spool>/pod-status.json`` with how ``container`` ended; ``None`` (and nothing
    written) outside Kubernetes or when the API cannot be read: this is diagnostics only."""
    env = os.environ if env is None else env
    name, namespace = env.get(ENV_POD_NAME), env.get(ENV_POD_NAMESPACE)
    if not name or not namespace:
        return None
    try:
        ending = container_ending(fetch_pod(name, namespace, **fetch_options), container)
    except (OSError, ValueError, KeyError):
        return None
    spool_dir.mkdir(parents=True, exist_ok=True)
    (spool_dir / "pod-status.json").write_text(json.dumps(ending))
    return ending
