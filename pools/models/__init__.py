"""Models of the pools app: capacity (what clusters have), pools (what tenants get), the simulated fleet,
kept what-if runs."""

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
from pools.models.whatif import WHATIF_IN_BETWEEN, WHATIF_TRANSITIONS, WhatIfRun, WhatIfState

__all__ = [
    "POOL_TRANSITIONS",
    "REQUEST_TRANSITIONS",
    "WHATIF_IN_BETWEEN",
    "WHATIF_TRANSITIONS",
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
    "WhatIfRun",
    "WhatIfState",
    "WorkloadProfile",
]
