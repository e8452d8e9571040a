"""REST API of the pools app: clusters, capacity (platform staff), pool requests."""

from __future__ import annotations

from django.db.models import Prefetch
from django.utils.translation import gettext_lazy as _
from drf_spectacular.utils import OpenApiParameter, extend_schema, extend_schema_field
from rest_framework import mixins, permissions, serializers, status, viewsets
from rest_framework.decorators import action
from rest_framework.response import Response
from rest_framework.views import APIView

from pools import selectors, services
from pools.models import Allocation, Cluster, GpuCapacity, NodeCapacity, Pool, PoolRequest, SpecAndCount
from pools.pricing import estimated_hourly_cost
from pools.specs import Spec
from portal.models import Project


class CanViewCapacity(permissions.BasePermission):
    """Platform staff whose role includes reading capacity (operators, approvers)."""

    message = _("Only platform staff can see capacity.")

    def has_permission(self, request, view) -> bool:
        user = request.user
        return bool(
            user and user.is_authenticated and user.is_staff and user.has_perm("pools.view_gpucapacity")
        )


class ClusterSerializer(serializers.ModelSerializer):
    class Meta:
        model = Cluster
        fields = ["name", "driver", "status", "last_sync_at"]


class ClusterViewSet(viewsets.ReadOnlyModelViewSet):
    """Cluster names and states; connection details are never part of the API."""

    serializer_class = ClusterSerializer
    lookup_field = "name"
    lookup_value_regex = "[a-z0-9-]+"

    def get_queryset(self):
        return selectors.clusters()


class SpecSerializer(serializers.ModelSerializer):
    class Meta:
        model = SpecAndCount
        fields = ["resource_name", "profile", "capacity", "allocatable", "allocated"]


class NodeSerializer(serializers.ModelSerializer):
    cluster = serializers.CharField(source="cluster.name")
    group = serializers.CharField(source="group.name", allow_null=True, default=None)
    specs = SpecSerializer(many=True)

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


class SummarySerializer(serializers.Serializer):
    cluster = serializers.CharField()
    model = serializers.CharField()
    gpus = serializers.IntegerField()
    mig_gpus = serializers.IntegerField()
    full_gpus = serializers.IntegerField()
    unschedulable_gpus = serializers.IntegerField()
    compute_total = serializers.IntegerField()
    compute_allocated = serializers.IntegerField()
    compute_free = serializers.IntegerField()
    compute_stranded = serializers.IntegerField()


class CapacitySummaryView(APIView):
    """Per cluster and GPU model: GPUs (MIG / full) and compute slices total, allocated, free, stranded."""

    permission_classes = [CanViewCapacity]

    @extend_schema(responses=SummarySerializer(many=True))
    def get(self, request):
        return Response(SummarySerializer(selectors.capacity_summary(), many=True).data)


# --- pool requests ----------------------------------------------------------------------------


class RequestItemSerializer(serializers.Serializer):
    spec = serializers.CharField(max_length=64, help_text=_("e.g. h200-141gb.mig-1g.18gb or h100-80gb.full"))
    count = serializers.IntegerField(min_value=1, max_value=10_000)


class PoolRequestCreateSerializer(serializers.Serializer):
    project = serializers.PrimaryKeyRelatedField(queryset=Project.objects.none())
    items = RequestItemSerializer(many=True, allow_empty=False, max_length=20)
    cluster = serializers.SlugRelatedField(
        slug_field="name", queryset=Cluster.objects.all(), required=False, allow_null=True
    )
    purpose = serializers.CharField(max_length=40, required=False, allow_blank=True, default="")
    justification = serializers.CharField(max_length=4000, required=False, allow_blank=True, default="")

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        request = self.context.get("request")
        if request is not None:  # a project the user cannot see does not exist for them
            self.fields["project"].queryset = Project.objects.visible_to(request.user)


class PoolRequestSerializer(serializers.ModelSerializer):
    items = serializers.SerializerMethodField()
    project = serializers.IntegerField(source="project_id")
    cluster = serializers.CharField(source="cluster.name", allow_null=True, default=None)
    submitted_by = serializers.CharField(source="submitted_by.username")
    decided_by = serializers.CharField(source="decided_by.username", allow_null=True, default=None)
    queue_position = serializers.SerializerMethodField()
    pool = serializers.SerializerMethodField()
    estimated_hourly_cost = serializers.SerializerMethodField(
        help_text=_("Null while a price of one of the items is unknown.")
    )

    class Meta:
        model = PoolRequest
        fields = [
            "id",
            "project",
            "cluster",
            "purpose",
            "justification",
            "items",
            "state",
            "priority",
            "queue_position",
            "waiting_reason",
            "submitted_by",
            "submitted_at",
            "decided_by",
            "decided_at",
            "decision_reason",
            "pool",
            "estimated_hourly_cost",
        ]

    def _specs(self, request) -> list[tuple[Spec, int]]:
        return [(Spec(i.gpu_model, i.profile), i.count) for i in request.items.all()]

    @extend_schema_field(RequestItemSerializer(many=True))
    def get_items(self, request) -> list[dict]:
        return [{"spec": spec.id, "gpu_model": spec.gpu_model, "profile": spec.profile, "count": n}
                for spec, n in self._specs(request)]  # fmt: skip

    def get_queue_position(self, request) -> int | None:
        return self.context["positions"].get(request.pk)

    def get_pool(self, request) -> int | None:
        return getattr(getattr(request, "pool", None), "pk", None)

    def get_estimated_hourly_cost(self, request) -> str | None:
        cost = estimated_hourly_cost(self._specs(request))
        return None if cost is None else str(cost)


class ApproveSerializer(serializers.Serializer):
    priority = serializers.IntegerField(required=False, min_value=-1000, max_value=1000)


class RejectSerializer(serializers.Serializer):
    reason = serializers.CharField(max_length=2000)


class CancelSerializer(serializers.Serializer):
    reason = serializers.CharField(max_length=2000, required=False, allow_blank=True, default="")


class PoolRequestViewSet(mixins.CreateModelMixin, viewsets.ReadOnlyModelViewSet):
    """Pool requests: members see their tenant's, platform staff see all; approvers decide."""

    serializer_class = PoolRequestSerializer

    def get_queryset(self):
        return (
            PoolRequest.objects.visible_to(self.request.user)
            .select_related("cluster", "submitted_by", "decided_by", "pool")
            .prefetch_related("items")
            .order_by("-submitted_at", "-pk")
        )

    def get_serializer_context(self):
        context = super().get_serializer_context()
        context["positions"] = services.queue_positions()
        return context

    def _answer(self, request_obj, status_code=200):
        fresh = self.get_queryset().get(pk=request_obj.pk)
        return Response(self.get_serializer(fresh).data, status=status_code)

    @extend_schema(request=PoolRequestCreateSerializer, responses={201: PoolRequestSerializer})
    def create(self, request, *args, **kwargs):
        data = PoolRequestCreateSerializer(data=request.data, context={"request": request})
        data.is_valid(raise_exception=True)
        values = data.validated_data
        created = services.submit_request(
            project=values["project"],
            user=request.user,
            items=[(item["spec"], item["count"]) for item in values["items"]],
            cluster=values.get("cluster"),
            purpose=values["purpose"],
            justification=values["justification"],
        )
        return self._answer(created, status.HTTP_201_CREATED)

    @extend_schema(request=ApproveSerializer, responses=PoolRequestSerializer)
    @action(detail=True, methods=["post"])
    def approve(self, request, pk=None):
        target = self.get_object()
        body = ApproveSerializer(data=request.data)
        body.is_valid(raise_exception=True)
        services.approve_request(
            request_id=target.pk, approver=request.user, priority=body.validated_data.get("priority")
        )
        return self._answer(target)

    @extend_schema(request=RejectSerializer, responses=PoolRequestSerializer)
    @action(detail=True, methods=["post"])
    def reject(self, request, pk=None):
        target = self.get_object()
        body = RejectSerializer(data=request.data)
        body.is_valid(raise_exception=True)
        services.reject_request(
            request_id=target.pk, approver=request.user, reason=body.validated_data["reason"]
        )
        return self._answer(target)

    @extend_schema(request=CancelSerializer, responses=PoolRequestSerializer)
    @action(detail=True, methods=["post"])
    def cancel(self, request, pk=None):
        target = self.get_object()
        body = CancelSerializer(data=request.data)
        body.is_valid(raise_exception=True)
        services.cancel_request(request_id=target.pk, user=request.user, reason=body.validated_data["reason"])
        return self._answer(target)


# --- pools ---------------------------------------------------------------------------------------------


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
        ]

    def _specs(self, pool) -> list[tuple[Spec, int]]:
        return [(Spec(i.gpu_model, i.profile), i.count) for i in pool.request.items.all()]

    @extend_schema_field(RequestItemSerializer(many=True))
    def get_items(self, pool) -> list[dict]:
        return [{"spec": spec.id, "count": n} for spec, n in self._specs(pool)]

    @extend_schema_field(AllocationSerializer(many=True))
    def get_allocations(self, pool) -> list[dict]:
        live = [a for a in pool.allocations.all() if a.released_at is None or pool.state == "released"]
        return AllocationSerializer(live, many=True).data

    def get_hourly_cost(self, pool) -> str | None:
        cost = estimated_hourly_cost(self._specs(pool))
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
