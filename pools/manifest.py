"""The example pod manifest of a pool page: which container asks for which GPU resources.

A CUDA process sees one MIG device, so each MIG instance gets a container of its own that asks for
exactly one `nvidia.com/mig-…` resource; whole GPUs can share one container (`nvidia.com/gpu: N`).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from pools.mig import FULL_GPU_RESOURCE


@dataclass(frozen=True)
class Container:
    name: str
    resource: str
    count: int


def pod_containers(resource_names: Iterable[str]) -> list[Container]:
    """One container for the whole GPUs, then one per MIG instance, from the live allocations'
    resource names (one name per allocation)."""
    names = list(resource_names)
    containers = []
    gpus = names.count(FULL_GPU_RESOURCE)
    if gpus:
        containers.append(Container("gpus", FULL_GPU_RESOURCE, gpus))
    for n, name in enumerate(sorted(r for r in names if r != FULL_GPU_RESOURCE)):
        containers.append(Container(f"mig-{n}", name, 1))
    return containers
