"""GPU types and cluster profiles: how each kind of cluster labels GPU types and spot capacity.

The DSL checks GPU type names against this catalogue (with did-you-mean); the compiler turns a
type into the node label of the pipeline's profile.  A cluster whose labels differ overrides
them in the pipeline's ``cluster`` block.
"""

from __future__ import annotations

from dataclasses import dataclass, field

#: Canonical GPU type names, by how often teams ask for them.
GPU_TYPES: tuple[str, ...] = (
    "H100",
    "H200",
    "B200",
    "A100-80GB",
    "A100",
    "L40S",
    "L4",
    "A10G",
    "T4",
    "V100",
)


@dataclass(frozen=True)
class Toleration:
    key: str
    operator: str
    value: str | None
    effect: str


@dataclass(frozen=True)
class Requirement:
    """One node-affinity ``matchExpressions`` entry: Kubernetes' selector semantics apply
    (``NotIn`` also matches a node without the label)."""

    key: str
    operator: str
    values: tuple[str, ...]


@dataclass(frozen=True)
class ClusterProfile:
    name: str
    #: Node label that carries the GPU type.
    gpu_label: str
    #: GPU type -> value of ``gpu_label``.
    gpu_products: dict[str, str]
    spot_selector: dict[str, str]
    #: What an on-demand node satisfies, as node affinity: platforms that label only their
    #: spot nodes give an on-demand node *no* such label, which a ``nodeSelector`` can never
    #: ask for, so each requirement says "not spot" rather than "labelled on-demand".
    on_demand: tuple[Requirement, ...]
    spot_tolerations: tuple[Toleration, ...] = field(default=())


# NVIDIA GPU Feature Discovery product strings (nvidia.com/gpu.product).
_GFD_PRODUCTS = {
    "H100": "NVIDIA-H100-80GB-HBM3",
    "H200": "NVIDIA-H200-141GB-HBM3e",
    "B200": "NVIDIA-B200",
    "A100-80GB": "NVIDIA-A100-SXM4-80GB",
    "A100": "NVIDIA-A100-SXM4-40GB",
    "L40S": "NVIDIA-L40S",
    "L4": "NVIDIA-L4",
    "A10G": "NVIDIA-A10G",
    "T4": "Tesla-T4",
    "V100": "Tesla-V100-SXM2-16GB",
}

_GKE_ACCELERATORS = {
    "H100": "nvidia-h100-80gb",
    "H200": "nvidia-h200-141gb",
    "B200": "nvidia-b200",
    "A100-80GB": "nvidia-a100-80gb",
    "A100": "nvidia-tesla-a100",
    "L4": "nvidia-l4",
    "T4": "nvidia-tesla-t4",
    "V100": "nvidia-tesla-v100",
}

_KARPENTER_GPU_NAMES = {
    "H100": "h100",
    "H200": "h200",
    "B200": "b200",
    "A100-80GB": "a100",
    "A100": "a100",
    "L40S": "l40s",
    "L4": "l4",
    "A10G": "a10g",
    "T4": "t4",
    "V100": "v100",
}

# Tolerating a taint that a node does not have is harmless, so every profile tolerates the spot
# taints its platform may set; the generic profile tolerates them all (clusters mix node groups).
_GKE_SPOT = Toleration("cloud.google.com/gke-spot", "Equal", "true", "NoSchedule")
_GKE_PREEMPTIBLE = Toleration("cloud.google.com/gke-preemptible", "Equal", "true", "NoSchedule")
_EKS_SPOT = Toleration("eks.amazonaws.com/capacityType", "Equal", "SPOT", "NoSchedule")
_KARPENTER_SPOT = Toleration("karpenter.sh/capacity-type", "Equal", "spot", "NoSchedule")
_AKS_SPOT = Toleration("kubernetes.azure.com/scalesetpriority", "Equal", "spot", "NoSchedule")
_GENERIC_SPOT = Toleration("node.kubernetes.io/capacity-type", "Equal", "spot", "NoSchedule")

PROFILES: dict[str, ClusterProfile] = {
    "generic": ClusterProfile(
        name="generic",
        gpu_label="nvidia.com/gpu.product",
        gpu_products=_GFD_PRODUCTS,
        spot_selector={"node.kubernetes.io/capacity-type": "spot"},
        # No platform sets this label: a convention for clusters labelled by hand, where an
        # unlabelled node is taken as on-demand.
        on_demand=(Requirement("node.kubernetes.io/capacity-type", "NotIn", ("spot",)),),
        spot_tolerations=(
            _GENERIC_SPOT, _GKE_SPOT, _GKE_PREEMPTIBLE, _EKS_SPOT, _KARPENTER_SPOT, _AKS_SPOT,
        ),
    ),
    "gke": ClusterProfile(
        name="gke",
        gpu_label="cloud.google.com/gke-accelerator",
        gpu_products=_GKE_ACCELERATORS,
        spot_selector={"cloud.google.com/gke-spot": "true"},
        # GKE labels Spot nodes `cloud.google.com/gke-spot=true` (and preemptible ones
        # `cloud.google.com/gke-preemptible=true`) and standard nodes with neither
        # (https://cloud.google.com/kubernetes-engine/docs/how-to/spot-vms, "Use nodeSelector or
        # node affinity"): `gke-spot: "false"` matched no node at all.
        on_demand=(Requirement("cloud.google.com/gke-spot", "NotIn", ("true",)),
                   Requirement("cloud.google.com/gke-preemptible", "NotIn", ("true",))),
        spot_tolerations=(_GKE_SPOT, _GKE_PREEMPTIBLE),
    ),
    "eks": ClusterProfile(
        name="eks",
        gpu_label="nvidia.com/gpu.product",
        gpu_products=_GFD_PRODUCTS,
        spot_selector={"eks.amazonaws.com/capacityType": "SPOT"},
        # Managed node groups label every node `eks.amazonaws.com/capacityType` = ON_DEMAND or
        # SPOT (https://docs.aws.amazon.com/eks/latest/userguide/managed-node-groups.html,
        # "Managed node group capacity types"; CAPACITY_BLOCK too); self-managed nodes carry no
        # such label, and are on-demand unless the team made them spot.
        on_demand=(Requirement("eks.amazonaws.com/capacityType", "NotIn", ("SPOT",)),),
        spot_tolerations=(_EKS_SPOT,),
    ),
    "karpenter": ClusterProfile(
        name="karpenter",
        gpu_label="karpenter.k8s.aws/instance-gpu-name",
        gpu_products=_KARPENTER_GPU_NAMES,
        spot_selector={"karpenter.sh/capacity-type": "spot"},
        # Karpenter's well-known label is `on-demand`, `spot` or `reserved` (capacity
        # reservations: https://karpenter.sh/docs/concepts/scheduling/#well-known-labels);
        # reserved capacity is not reclaimed either, so "not spot" is the on-demand attempt.
        on_demand=(Requirement("karpenter.sh/capacity-type", "NotIn", ("spot",)),),
        spot_tolerations=(_KARPENTER_SPOT,),
    ),
    "aks": ClusterProfile(
        name="aks",
        gpu_label="nvidia.com/gpu.product",
        gpu_products=_GFD_PRODUCTS,
        spot_selector={"kubernetes.azure.com/scalesetpriority": "spot"},
        # AKS labels and taints Spot pool nodes `kubernetes.azure.com/scalesetpriority=spot`;
        # regular pools carry no such label
        # (https://learn.microsoft.com/en-us/azure/aks/spot-node-pool): "regular" matched none.
        on_demand=(Requirement("kubernetes.azure.com/scalesetpriority", "NotIn", ("spot",)),),
        spot_tolerations=(_AKS_SPOT,),
    ),
}


def known_gpu_types(profile: str, extra: dict[str, str] | None = None) -> tuple[str, ...]:
    """GPU types a pipeline on ``profile`` may name: the profile's catalogue plus overrides."""
    names = list(PROFILES[profile].gpu_products)
    names.extend(n for n in (extra or {}) if n not in names)
    return tuple(names)


@dataclass(frozen=True)
class Price:
    """A list price and where it was read: a default a team overrides with its own rates."""

    usd_per_hour: float
    as_of: str
    source: str


_AWS_ON_DEMAND = "https://aws.amazon.com/ec2/pricing/on-demand/ (us-east-1, Linux)"
_FARGATE = "https://aws.amazon.com/fargate/pricing/ (us-east-1, Linux/x86)"

#: On-demand list price of one GPU for an hour: the instance's hourly price divided by its
#: GPUs (the instance named in each source), so the CPUs and memory of a GPU node are inside
#: it; the bound adds the CPU and memory unit prices for what the stage requests on top, which
#: makes a GPU stage's figure an upper bound rather than a quote.
GPU_PRICES: dict[str, Price] = {
    "H100": Price(6.88, "2025-06", f"{_AWS_ON_DEMAND}: p5.48xlarge $55.04/h / 8"),
    "H200": Price(7.91, "2025-06", f"{_AWS_ON_DEMAND}: p5en.48xlarge $63.30/h / 8"),
    "B200": Price(14.24, "2025-06", f"{_AWS_ON_DEMAND}: p6-b200.48xlarge $113.93/h / 8"),
    "A100-80GB": Price(3.43, "2025-06", f"{_AWS_ON_DEMAND}: p4de.24xlarge $27.45/h / 8"),
    "A100": Price(2.75, "2025-06", f"{_AWS_ON_DEMAND}: p4d.24xlarge $21.96/h / 8"),
    "L40S": Price(1.86, "2025-06", f"{_AWS_ON_DEMAND}: g6e.xlarge $1.861/h / 1"),
    "L4": Price(0.80, "2025-06", f"{_AWS_ON_DEMAND}: g6.xlarge $0.8048/h / 1"),
    "A10G": Price(1.01, "2025-06", f"{_AWS_ON_DEMAND}: g5.xlarge $1.006/h / 1"),
    "T4": Price(0.53, "2025-06", f"{_AWS_ON_DEMAND}: g4dn.xlarge $0.526/h / 1"),
    "V100": Price(3.06, "2025-06", f"{_AWS_ON_DEMAND}: p3.2xlarge $3.06/h / 1"),
}
#: One vCPU for an hour and one GiB of memory for an hour (AWS Fargate's unit prices).
CPU_PRICE = Price(0.04048, "2025-06", f"{_FARGATE}: per vCPU-hour")
MEMORY_PRICE = Price(0.004445, "2025-06", f"{_FARGATE}: per GB-hour")
