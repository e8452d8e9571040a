"""REST API of the pools app: clusters and capacity, pool requests, pools."""

from pools.api.capacity import CapacitySummaryView, ClusterViewSet, GpuViewSet, NodeViewSet
from pools.api.pools import PoolViewSet
from pools.api.requests import PoolRequestViewSet, SpecListView

__all__ = [
    "CapacitySummaryView",
    "ClusterViewSet",
    "GpuViewSet",
    "NodeViewSet",
    "PoolRequestViewSet",
    "PoolViewSet",
    "SpecListView",
]
