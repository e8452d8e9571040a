"""REST API of pools: what a fulfilled request holds, and its release."""

from __future__ import annotations

from django.db.models import Prefetch
from django.utils.translation import gettext_lazy as _
from drf_spectacular.utils import extend_schema, extend_schema_field
from rest_framework import serializers, viewsets
from rest_framework.decorators import action
from rest_framework.response import Response

from pools import services
from pools.api.requests import RequestItemSerializer
from pools.models import Allocation, Pool, PoolState
from pools.pricing import pool_hourly_cost, pool_items
from pools.selectors.quotas import borrowed_pool_ids


class AllocationSerializer(serializers.ModelSerializer):
    cluster = serializers.CharField(source="gpu.node.cluster.name")
    node = serializers.CharField(source="gpu.node.name")
    gpu_uuid = serializers.CharField(source="gpu.uuid")
    gpu_index = serializers.IntegerField(source="gpu.index")
    start = serializers.IntegerField(allow_null=True)

    class Meta:
        model = Allocation
        fields = [
            "cluster",
            "node",
            "gpu_uuid",
            "gpu_index",
            "profile",
            "start",
            "resource_name",
            "instance_uuid",
        ]


class PoolSerializer(serializers.ModelSerializer):
    project = serializers.IntegerField(source="project_id")
    request = serializers.IntegerField(source="request_id")
    cluster = serializers.CharField(source="cluster.name")
    namespace = serializers.CharField(source="project.namespace")
    items = serializers.SerializerMethodField()
    allocations = serializers.SerializerMethodField()
    billing_started_at = serializers.DateTimeField(source="reserved_at")
    hourly_cost = serializers.SerializerMethodField(help_text=_("Null while a price is unknown."))
    borrowed = serializers.SerializerMethodField(
        help_text=_("Whether it holds slices beyond its tenant's guarantee: such a pool may be reclaimed.")
    )

    class Meta:
        model = Pool
        fields = [
            "id",
            "project",
            "request",
            "cluster",
            "state",
            "items",
            "allocations",
            "namespace",
            "billing_started_at",
            "active_at",
            "released_at",
            "failure_reason",
            "hourly_cost",
            "borrowed",
            "reclaim_at",
        ]

    @extend_schema_field(RequestItemSerializer(many=True))
    def get_items(self, pool) -> list[dict]:
        return [{"spec": spec.id, "count": n} for spec, n in pool_items(pool)]

    @extend_schema_field(AllocationSerializer(many=True))
    def get_allocations(self, pool) -> list[dict]:
        live = [
            a for a in pool.allocations.all() if a.released_at is None or pool.state == PoolState.RELEASED
        ]
        return AllocationSerializer(live, many=True).data

    def get_borrowed(self, pool) -> bool:
        if "borrowed" not in self.context:  # once for the page: the pools listed with this one
            listed = self.parent.instance if self.parent is not None else [pool]
            self.context["borrowed"] = borrowed_pool_ids(p.pk for p in listed)
        return pool.pk in self.context["borrowed"]

    def get_hourly_cost(self, pool) -> str | None:
        cost = pool_hourly_cost(pool)
        return None if cost is None else str(cost)


class PoolViewSet(viewsets.ReadOnlyModelViewSet):
    """Pools: members see their tenant's, platform staff see all; who asked (or a tenant admin) releases."""

    serializer_class = PoolSerializer

    def get_queryset(self):
        return (
            Pool.objects.visible_to(self.request.user)
            .select_related("cluster", "project", "request")
            .prefetch_related(
                "request__items",
                Prefetch("allocations", queryset=Allocation.objects.select_related("gpu__node__cluster")),
            )
            .order_by("-reserved_at", "-pk")
        )

    @extend_schema(request=None, responses=PoolSerializer)
    @action(detail=True, methods=["post"])
    def release(self, request, pk=None):
        pool = self.get_object()
        services.release_pool(pool_id=pool.pk, user=request.user)
        return Response(self.get_serializer(self.get_queryset().get(pk=pool.pk)).data)
