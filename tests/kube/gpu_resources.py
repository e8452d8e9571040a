"""What a GPU node advertises in the test API server, from its GPUs' MIG layout and its sharing: the one
place where the MIG manager's and the device plugin's emulations compute a node's GPU resources.

Words used here (as NVIDIA's GPU Operator and k8s-device-plugin use them):
- layout: per GPU index, whether MIG is on and how many instances of each profile it holds (the MIG
  manager's last apply, recorded on the node);
- sharing: how the device plugin offers each MIG-disabled GPU (time-slicing or MPS, `replicas` pods at
  once, under `nvidia.com/gpu` or renamed to `nvidia.com/gpu.shared`), recorded on the node; none while the
  plugin has no config it can read, when it advertises no full GPUs at all;
- resources: the device-plugin resources in a node's capacity and allocatable, `nvidia.com/gpu`,
  `nvidia.com/gpu.shared` and the mixed strategy's `nvidia.com/mig-<profile>`.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from typing import TypedDict

GPU_COUNT_LABEL = "nvidia.com/gpu.count"
LAYOUT_ANNOTATION = "test.kube/mig-layout"
SHARING_ANNOTATION = "test.kube/gpu-sharing"
GPU_RESOURCE = "nvidia.com/gpu"
SHARED_RESOURCE = "nvidia.com/gpu.shared"
MIG_RESOURCE_PREFIX = "nvidia.com/mig-"


class DeviceLayout(TypedDict):
    mig: bool
    devices: dict[str, int]


@dataclass(frozen=True)
class Sharing:
    """How the device plugin offers a MIG-disabled GPU: to `replicas` pods at once, by `strategy`
    (`none`, `time-slicing` or `mps`), as `nvidia.com/gpu.shared` when `renamed`."""

    strategy: str = "none"
    replicas: int = 1
    renamed: bool = False


NO_SHARING = Sharing()


def disabled_layout(gpus: int) -> list[DeviceLayout]:
    return [{"mig": False, "devices": {}} for _ in range(gpus)]


def mig_resource_name(profile: str) -> str:
    """The mixed-strategy device-plugin resource for a profile; `+` is not allowed in resource names."""
    return MIG_RESOURCE_PREFIX + profile.replace("+", ".")


def node_layout(node: dict) -> list[DeviceLayout]:
    """The layout last applied to a node, from its annotation; all GPUs MIG-disabled if it has none."""
    raw = node["metadata"].get("annotations", {}).get(LAYOUT_ANNOTATION)
    if raw:
        return json.loads(raw)
    return disabled_layout(int(node["metadata"]["labels"].get(GPU_COUNT_LABEL, "0")))


def node_sharing(node: dict) -> Sharing | None:
    """The sharing last applied to a node; no sharing if none was, None while the plugin is failing."""
    raw = node["metadata"].get("annotations", {}).get(SHARING_ANNOTATION)
    if raw is None:
        return NO_SHARING
    recorded = json.loads(raw)
    return None if recorded is None else Sharing(**recorded)


def record_sharing(node: dict, sharing: Sharing | None) -> None:
    annotations = node["metadata"].setdefault("annotations", {})
    annotations[SHARING_ANNOTATION] = json.dumps(None if sharing is None else asdict(sharing), sort_keys=True)


def is_gpu_resource(name: str) -> bool:
    return name in (GPU_RESOURCE, SHARED_RESOURCE) or name.startswith(MIG_RESOURCE_PREFIX)


def mig_totals(layout: list[DeviceLayout]) -> dict[str, int]:
    """Instances per MIG resource name over all GPUs, without the resources that have none."""
    totals: dict[str, int] = {}
    for device in layout:
        for profile, count in device["devices"].items():
            name = mig_resource_name(profile)
            totals[name] = totals.get(name, 0) + count
    return {name: count for name, count in totals.items() if count}


def full_gpu_resources(gpus: int, sharing: Sharing | None) -> dict[str, int]:
    if sharing is None:
        return {GPU_RESOURCE: 0}
    if sharing.renamed:
        return {SHARED_RESOURCE: gpus * sharing.replicas}
    return {GPU_RESOURCE: gpus * sharing.replicas}


def gpu_resources(layout: list[DeviceLayout], sharing: Sharing | None) -> dict[str, str]:
    """Every device-plugin resource a node with this layout and sharing advertises, as quantities."""
    full_gpus = sum(1 for device in layout if not device["mig"])
    advertised = {**full_gpu_resources(full_gpus, sharing), **mig_totals(layout)}
    return {name: str(count) for name, count in advertised.items()}


def advertise(node: dict, resources: dict[str, str]) -> None:
    """Replace a node's device-plugin resources (in place) in capacity and allocatable alike."""
    for field in ("capacity", "allocatable"):
        kept = {
            name: value for name, value in node["status"].get(field, {}).items() if not is_gpu_resource(name)
        }
        node["status"][field] = {**kept, **resources}
