"""Models of the pools app: capacity (what clusters have), pools (what tenants get), the simulated fleet."""

from pools.models.capacity import (
    Cluster,
    GpuCapacity,
    GpuGroup,
    Health,
    NodeCapacity,
    SpecAndCount,
    WorkloadProfile,
)
from pools.models.pools import (
    POOL_TRANSITIONS,
    REQUEST_TRANSITIONS,
    Allocation,
    Pool,
    PoolEvent,
    PoolRequest,
    PoolState,
    RequestItem,
    RequestState,
)
from pools.models.simulated import SimulatedClusterState

__all__ = [
    "POOL_TRANSITIONS",
    "REQUEST_TRANSITIONS",
    "Allocation",
    "Cluster",
    "GpuCapacity",
    "GpuGroup",
    "Health",
    "NodeCapacity",
    "Pool",
    "PoolEvent",
    "PoolRequest",
    "PoolState",
    "RequestItem",
    "RequestState",
    "SimulatedClusterState",
    "SpecAndCount",
    "WorkloadProfile",
]
