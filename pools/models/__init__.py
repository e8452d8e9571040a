"""Models of the pools app: capacity (what the clusters have) and, in the same app, the simulated fleet."""

from pools.models.capacity import (
    Cluster,
    GpuCapacity,
    GpuGroup,
    Health,
    NodeCapacity,
    SpecAndCount,
    WorkloadProfile,
)
from pools.models.simulated import SimulatedClusterState

__all__ = [
    "Cluster",
    "GpuCapacity",
    "GpuGroup",
    "Health",
    "NodeCapacity",
    "SimulatedClusterState",
    "SpecAndCount",
    "WorkloadProfile",
]
