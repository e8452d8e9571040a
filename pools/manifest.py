"""The example pod manifest of a pool page: which pod runs on which node, and which container asks for
which GPU resources.

A pod runs on one node, so a pool whose instances lie on several nodes gets one pod per node, pinned
there by the node's `kubernetes.io/hostname` label. A CUDA process sees one MIG device, so each MIG
instance gets a container of its own that asks for exactly one `nvidia.com/mig-…` resource; so does each
share (`nvidia.com/gpu.shared`: the device plugin refuses a container asking for more than one); whole GPUs
can share one container (`nvidia.com/gpu: N`).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from pools.kinds import SHARED_RESOURCE
from pools.mig import FULL_GPU_RESOURCE


@dataclass(frozen=True)
class Container:
    name: str
    resource: str
    count: int


@dataclass(frozen=True)
class Pod:
    name: str
    node: str
    containers: list[Container]


def pod_containers(resource_names: Iterable[str]) -> list[Container]:
    """One container for the whole GPUs, then one per MIG instance or share, from the live allocations'
    resource names (one name per allocation)."""
    names = list(resource_names)
    containers = []
    gpus = names.count(FULL_GPU_RESOURCE)
    if gpus:
        containers.append(Container("gpus", FULL_GPU_RESOURCE, gpus))
    for n, name in enumerate(sorted(r for r in names if r != FULL_GPU_RESOURCE)):
        containers.append(Container(f"{'share' if name == SHARED_RESOURCE else 'mig'}-{n}", name, 1))
    return containers


def pods(placed: Iterable[tuple[str, str]]) -> list[Pod]:
    """One pod per node, in node order, from the live allocations' (node name, resource name) pairs."""
    by_node: dict[str, list[str]] = {}
    for node, resource in placed:
        by_node.setdefault(node, []).append(resource)
    nodes = sorted(by_node)
    return [
        Pod("gpu-job" if len(nodes) == 1 else f"gpu-job-{n}", node, pod_containers(by_node[node]))
        for n, node in enumerate(nodes, start=1)
    ]
