"""REST API of capacity: cluster names for everyone, the capacity picture for platform staff."""

from __future__ import annotations

from django.utils.translation import gettext_lazy as _
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiParameter, extend_schema, extend_schema_field
from rest_framework import generics, permissions, serializers, viewsets

from pools import selectors
from pools.apps import VIEW_CAPACITY
from pools.kinds import shown_slices
from pools.models import Cluster, GpuCapacity, NodeCapacity, SpecAndCount
from portal.permissions import staff_may


class CanViewCapacity(permissions.BasePermission):
    """Platform staff whose role includes reading capacity (operators, approvers)."""

    message = _("Only platform staff can see capacity.")

    def has_permission(self, request, view) -> bool:
        return staff_may(user=request.user, permission=VIEW_CAPACITY)


class ClusterSerializer(serializers.ModelSerializer):
    groups = serializers.SlugRelatedField(
        many=True,
        read_only=True,
        slug_field="name",
        help_text=_("Its GPU groups: the purposes a pool request may name to land here (none: any)."),
    )

    class Meta:
        model = Cluster
        fields = ["name", "driver", "status", "last_sync_at", "groups"]


class ClusterViewSet(viewsets.ReadOnlyModelViewSet):
    """Cluster names and states; connection details are never part of the API."""

    serializer_class = ClusterSerializer
    lookup_field = "name"
    lookup_value_regex = "[a-z0-9-]+"

    def get_queryset(self):
        return selectors.clusters()


class SpecAndCountSerializer(serializers.ModelSerializer):
    class Meta:
        model = SpecAndCount
        fields = ["resource_name", "profile", "capacity", "allocatable", "allocated"]


class NodeSerializer(serializers.ModelSerializer):
    cluster = serializers.CharField(source="cluster.name")
    group = serializers.CharField(source="group.name", allow_null=True, default=None)
    specs = SpecAndCountSerializer(many=True)

    class Meta:
        model = NodeCapacity
        fields = [
            "id",
            "cluster",
            "name",
            "group",
            "gpu_model",
            "gpu_count",
            "ready",
            "drained",
            "present",
            "mig_strategy",
            "mig_config",
            "mig_state",
            "error",
            "specs",
            "last_change_at",
        ]


class MigInstanceSerializer(serializers.Serializer):
    profile = serializers.CharField()
    start = serializers.IntegerField()
    uuid = serializers.CharField(allow_blank=True)


class GpuSerializer(serializers.ModelSerializer):
    cluster = serializers.CharField(source="node.cluster.name")
    node = serializers.CharField(source="node.name")
    group = serializers.CharField(source="node.group.name", allow_null=True, default=None)
    layout = MigInstanceSerializer(many=True)
    schedulable = serializers.BooleanField()
    compute_used = serializers.SerializerMethodField()
    compute_stranded = serializers.SerializerMethodField()

    class Meta:
        model = GpuCapacity
        fields = [
            "id",
            "cluster",
            "node",
            "group",
            "index",
            "uuid",
            "model",
            "memory_mib",
            "mig_capable",
            "mig_enabled",
            "layout",
            "health",
            "drained",
            "present",
            "schedulable",
            "compute_used",
            "compute_stranded",
        ]

    def get_compute_used(self, gpu) -> int:
        return gpu.compute[0]

    def get_compute_stranded(self, gpu) -> int:
        return gpu.compute[1]


FILTERS = {
    "cluster": OpenApiParameter("cluster", str, description="cluster name"),
    "group": OpenApiParameter("group", str, description="GPU group name"),
    "model": OpenApiParameter("model", str, description="GPU model, e.g. H200-141GB"),
    "node": OpenApiParameter("node", str, description="node name"),
}


@extend_schema(parameters=[FILTERS["cluster"], FILTERS["group"], FILTERS["model"]])
class NodeViewSet(viewsets.ReadOnlyModelViewSet):
    serializer_class = NodeSerializer
    permission_classes = [CanViewCapacity]

    def get_queryset(self):
        params = self.request.query_params
        return selectors.nodes(
            cluster=params.get("cluster", ""), group=params.get("group", ""), model=params.get("model", "")
        )


@extend_schema(parameters=[FILTERS["cluster"], FILTERS["node"], FILTERS["model"]])
class GpuViewSet(viewsets.ReadOnlyModelViewSet):
    serializer_class = GpuSerializer
    permission_classes = [CanViewCapacity]

    def get_queryset(self):
        params = self.request.query_params
        return selectors.gpus(
            cluster=params.get("cluster", ""), node=params.get("node", ""), model=params.get("model", "")
        )


@extend_schema_field(OpenApiTypes.NUMBER)
class SlicesField(serializers.ReadOnlyField):
    """Compute slices: a whole number, or with a share's fraction, to two decimals."""

    def to_representation(self, value):
        return shown_slices(value)


class SummarySerializer(serializers.Serializer):
    cluster = serializers.CharField()
    model = serializers.CharField()
    gpus = serializers.IntegerField()
    mig_gpus = serializers.IntegerField()
    full_gpus = serializers.IntegerField()
    unschedulable_gpus = serializers.IntegerField()
    compute_total = serializers.IntegerField()
    compute_allocated = SlicesField(help_text=_("Shares count as their fraction of a GPU's 7."))
    compute_free = SlicesField()
    compute_stranded = serializers.IntegerField()


class CapacitySummaryView(generics.ListAPIView):
    """Per cluster and GPU model: GPUs (MIG / full) and compute slices total, allocated, free, stranded."""

    permission_classes = [CanViewCapacity]
    serializer_class = SummarySerializer

    def get_queryset(self) -> list:
        return selectors.capacity_summary()
