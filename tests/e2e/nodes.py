"""KWOK nodes labelled and tainted as durapipe's built-in cluster profiles expect.

Labels, GPU products and spot taints come from ``durapipe.dsl.catalog.PROFILES``, so the real
scheduler decides placement with the selectors and tolerations the compiler wrote. The fleet
itself (which node of which profile, with how many GPUs) is data: ``cases/fleet.toml``.
"""

from __future__ import annotations

import tomllib
from pathlib import Path
from typing import Any

from durapipe.dsl.catalog import PROFILES

FLEET = Path(__file__).parent / "cases" / "fleet.toml"


def spot_labels() -> tuple[tuple[str, str], ...]:
    """Every (label, value) that marks a node as spot in some profile."""
    return tuple(sorted({kv for p in PROFILES.values() for kv in p.spot_selector.items()}))


def node(name: str, profile: str, spot: bool, gpu: str | None = None, gpus: int = 0,
         cpu: int = 128, memory: str = "4Ti") -> dict[str, Any]:
    prof = PROFILES[profile]
    labels = {"kubernetes.io/hostname": name, "kubernetes.io/os": "linux",
              "kubernetes.io/arch": "amd64", "type": "kwok", "durapipe.dev/e2e-profile": profile,
              **(prof.spot_selector if spot else ON_DEMAND_LABELS[profile])}
    capacity: dict[str, str] = {"cpu": str(cpu), "memory": memory, "pods": "250",
                                "ephemeral-storage": "10Ti"}
    if gpu:
        labels[prof.gpu_label] = prof.gpu_products[gpu]
        capacity["nvidia.com/gpu"] = str(gpus)
    # GPU node groups are tainted so that CPU pods stay off them (the compiler tolerates it).
    taints = [{"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"}] if gpu else []
    if spot and prof.spot_tolerations:
        t = prof.spot_tolerations[0]  # the taint this platform puts on its spot nodes
        taints.append({"key": t.key, "value": t.value, "effect": t.effect})
    return {
        "apiVersion": "v1", "kind": "Node",
        "metadata": {"name": name, "labels": labels,
                     "annotations": {"kwok.x-k8s.io/node": "fake",
                                     "node.alpha.kubernetes.io/ttl": "0"}},
        "spec": {"taints": taints},
        "status": {"capacity": capacity, "allocatable": capacity,
                   "nodeInfo": {"kubeletVersion": "v1.35.4-kwok", "architecture": "amd64",
                                "operatingSystem": "linux"}},
    }


#: What each platform puts on an on-demand node: GKE and AKS label only their spot nodes, EKS
#: managed node groups and Karpenter label both kinds (sources in durapipe/dsl/catalog.py; the
#: same sets as NODES in tests/compiler/test_argo_controller.py). The compiled on-demand
#: attempt asks for "not spot", which each of these satisfies.
ON_DEMAND_LABELS: dict[str, dict[str, str]] = {
    "gke": {"cloud.google.com/gke-nodepool": "default-pool"},
    "eks": {"eks.amazonaws.com/capacityType": "ON_DEMAND"},
    "karpenter": {"karpenter.sh/capacity-type": "on-demand"},
    "aks": {"kubernetes.azure.com/agentpool": "nodepool1"},
    "generic": {},
}


def fleet() -> list[dict[str, Any]]:
    """Every node of ``cases/fleet.toml``; ``busy`` nodes get a pod holding all their GPUs."""
    spec = tomllib.loads(FLEET.read_text())
    return [node(n["name"], n["profile"], n.get("spot", False), n.get("gpu"), n.get("gpus", 0),
                 n.get("cpu", 128), n.get("memory", "4Ti")) for n in spec["node"]]


def busy_pods() -> list[dict[str, Any]]:
    """A pod bound to each ``busy`` node, requesting all of its GPUs (another team's job)."""
    spec = tomllib.loads(FLEET.read_text())
    pods = []
    for n in spec["node"]:
        if not n.get("busy"):
            continue
        pods.append({
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": f"hog-{n['name']}", "namespace": "default"},
            "spec": {"nodeName": n["name"], "tolerations": [{"operator": "Exists"}],
                     "containers": [{"name": "hog", "image": "busy",
                                     "resources": {"limits": {"nvidia.com/gpu": str(n["gpus"])},
                                                   "requests": {"nvidia.com/gpu":
                                                                str(n["gpus"])}}}]},
        })
    return pods
