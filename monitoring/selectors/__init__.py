"""What the fleet's figures say: every read of the operators' pages, the tenant's pool section and /metrics.

Words, said once here and used everywhere:
- fresh: figures read less than FRESH ago. Older figures are a GPU or agent gone silent, never "now".
- allocated: compute slices held by live allocations — a full GPU holds 7, a MIG instance its profile's
  compute slices (the MIG catalogue). Counted from the portal's own Allocation rows.
- used: allocated compute slices weighted by the SM activity of the GPU or instance holding them (its
  sample slot: -1 for a full GPU, else the instance's first memory slice): a 3-slice instance at 40 % SM
  activity uses 1.2 slices. SM activity is the share of time the streaming multiprocessors had work, the
  figure that says whether paid-for compute is busy; utilisation (any kernel running) would call a GPU
  running one tiny kernel busy.
- measured: the allocated slices whose SM activity is known (fresh figures now; over a range, the roll-up
  buckets that have it). Used counts only what was measured, so a silent agent does not look like an idle
  tenant; coverage = measured / allocated says how much was seen.
- efficiency = used / measured: the share of the compute a tenant held, while it was seen, that was busy.

The fleet can be 8,000 GPUs: figures are summed in SQL, each list in a fixed number of queries. What they
read of pools comes from pools' own relations (pools/selectors/monitoring.py). The alert and fault pages'
lists are `selectors.alerts` and `selectors.faults`.
"""

from monitoring.selectors.fleet import (
    FRESH,
    TOP,
    ClusterUsage,
    Collection,
    FleetTotals,
    Idle,
    TenantEfficiency,
    cluster_usage,
    collection_status,
    fleet_totals,
    fresh_since,
    hottest,
    idlest,
    recent_events,
    rollup_for,
    tenant_efficiency,
)
from monitoring.selectors.gpus import (
    GPU_SORTS,
    GPU_STATES,
    GpuDetail,
    Holder,
    SlotFigures,
    gpu_detail,
    gpu_table,
    holders,
)
from monitoring.selectors.pools import (
    AllocationFigures,
    PoolSeries,
    operator_pool,
    pool_figures,
    pool_series,
    pool_windows,
    shares_gpus,
    visible_pool,
)

__all__ = [
    "FRESH",
    "GPU_SORTS",
    "GPU_STATES",
    "TOP",
    "AllocationFigures",
    "ClusterUsage",
    "Collection",
    "FleetTotals",
    "GpuDetail",
    "Holder",
    "Idle",
    "PoolSeries",
    "SlotFigures",
    "TenantEfficiency",
    "cluster_usage",
    "collection_status",
    "fleet_totals",
    "fresh_since",
    "gpu_detail",
    "gpu_table",
    "holders",
    "hottest",
    "idlest",
    "operator_pool",
    "pool_figures",
    "pool_series",
    "pool_windows",
    "recent_events",
    "rollup_for",
    "shares_gpus",
    "tenant_efficiency",
    "visible_pool",
]
