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
class ClusterProfile:
    name: str
    #: Node label that carries the GPU type.
    gpu_label: str
    #: GPU type -> value of ``gpu_label``.
    gpu_products: dict[str, str]
    spot_selector: dict[str, str]
    on_demand_selector: dict[str, str]
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
        on_demand_selector={"node.kubernetes.io/capacity-type": "on-demand"},
        spot_tolerations=(
            _GENERIC_SPOT, _GKE_SPOT, _GKE_PREEMPTIBLE, _EKS_SPOT, _KARPENTER_SPOT, _AKS_SPOT,
        ),
    ),
    "gke": ClusterProfile(
        name="gke",
        gpu_label="cloud.google.com/gke-accelerator",
        gpu_products=_GKE_ACCELERATORS,
        spot_selector={"cloud.google.com/gke-spot": "true"},
        on_demand_selector={"cloud.google.com/gke-spot": "false"},
        spot_tolerations=(_GKE_SPOT, _GKE_PREEMPTIBLE),
    ),
    "eks": ClusterProfile(
        name="eks",
        gpu_label="nvidia.com/gpu.product",
        gpu_products=_GFD_PRODUCTS,
        spot_selector={"eks.amazonaws.com/capacityType": "SPOT"},
        on_demand_selector={"eks.amazonaws.com/capacityType": "ON_DEMAND"},
        spot_tolerations=(_EKS_SPOT,),
    ),
    "karpenter": ClusterProfile(
        name="karpenter",
        gpu_label="karpenter.k8s.aws/instance-gpu-name",
        gpu_products=_KARPENTER_GPU_NAMES,
        spot_selector={"karpenter.sh/capacity-type": "spot"},
        on_demand_selector={"karpenter.sh/capacity-type": "on-demand"},
        spot_tolerations=(_KARPENTER_SPOT,),
    ),
    "aks": ClusterProfile(
        name="aks",
        gpu_label="nvidia.com/gpu.product",
        gpu_products=_GFD_PRODUCTS,
        spot_selector={"kubernetes.azure.com/scalesetpriority": "spot"},
        on_demand_selector={"kubernetes.azure.com/scalesetpriority": "regular"},
        spot_tolerations=(_AKS_SPOT,),
    ),
}


def known_gpu_types(profile: str, extra: dict[str, str] | None = None) -> tuple[str, ...]:
    """GPU types a pipeline on ``profile`` may name: the profile's catalogue plus overrides."""
    names = list(PROFILES[profile].gpu_products)
    names.extend(n for n in (extra or {}) if n not in names)
    return tuple(names)
