"""Models of the pools app: capacity (what clusters have), pools (what tenants get), quotas, the simulated
fleet, kept what-if runs."""

from pools.models.capacity import (
    Cluster,
    GpuCapacity,
    GpuGroup,
    Health,
    NodeCapacity,
    SpecAndCount,
    Trespass,
    WorkloadProfile,
)
from pools.models.pools import (
    IN_USE_STATES,
    POOL_TRANSITIONS,
    REQUEST_TRANSITIONS,
    Allocation,
    Pool,
    PoolEvent,
    PoolItem,
    PoolRequest,
    PoolState,
    QuotaVerdict,
    RequestItem,
    RequestKind,
    RequestState,
)
from pools.models.quotas import Quota, TenantPolicy
from pools.models.simulated import SimulatedClusterState
from pools.models.whatif import WHATIF_IN_BETWEEN, WHATIF_TRANSITIONS, WhatIfRun, WhatIfState

__all__ = [
    "IN_USE_STATES",
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
    "PoolItem",
    "PoolRequest",
    "PoolState",
    "Quota",
    "QuotaVerdict",
    "RequestItem",
    "RequestKind",
    "RequestState",
    "SimulatedClusterState",
    "SpecAndCount",
    "TenantPolicy",
    "Trespass",
    "WhatIfRun",
    "WhatIfState",
    "WorkloadProfile",
]
