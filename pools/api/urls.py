"""The pools app's API, served under /api/v1/ by the site shell: its viewsets and its other endpoints."""

from django.urls import path
from rest_framework.routers import SimpleRouter

from pools.api.capacity import CapacitySummaryView, ClusterViewSet, GpuViewSet, NodeViewSet
from pools.api.pools import PoolViewSet
from pools.api.quotas import QuotaListView
from pools.api.requests import PoolRequestViewSet, SpecListView

router = SimpleRouter(trailing_slash=True)
router.register("clusters", ClusterViewSet, basename="cluster")
router.register("capacity/nodes", NodeViewSet, basename="capacity-node")
router.register("capacity/gpus", GpuViewSet, basename="capacity-gpu")
router.register("pool-requests", PoolRequestViewSet, basename="pool-request")
router.register("pools", PoolViewSet, basename="pool")

urlpatterns = [
    path("capacity/summary/", CapacitySummaryView.as_view(), name="capacity-summary"),
    path("specs/", SpecListView.as_view(), name="specs"),
    path("quotas/", QuotaListView.as_view(), name="quotas"),
]
