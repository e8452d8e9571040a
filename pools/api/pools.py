"""REST API of pools: what a fulfilled request holds, and its release."""

from __future__ import annotations

from django.db.models import Prefetch
from django.utils.translation import gettext_lazy as _
from drf_spectacular.utils import extend_schema, extend_schema_field
from rest_framework import serializers, status, viewsets
from rest_framework.decorators import action
from rest_framework.response import Response

from pools import selectors, services
from pools.api.requests import PoolRequestSerializer, RequestItemSerializer
from pools.models import Allocation, Pool, PoolRequest, PoolState
from pools.pricing import pool_hourly_cost, pool_items
from pools.selectors.binding import claim_name, claimed, pool_pods
from pools.selectors.ends import upcoming_reminders
from pools.selectors.quotas import borrowed_pool_ids

MAX_PODS = 500  # a pool's pods in one answer, the first by name


class AllocationSerializer(serializers.ModelSerializer):
    cluster = serializers.CharField(source="gpu.node.cluster.name")
    node = serializers.CharField(source="gpu.node.name")
    gpu_uuid = serializers.CharField(source="gpu.uuid")
    gpu_index = serializers.IntegerField(source="gpu.index")
    start = serializers.IntegerField(allow_null=True)
    claim = serializers.SerializerMethodField(
        help_text=_(
            "Where the cluster binds through DRA, the ResourceClaim in the pool's namespace that holds "
            "exactly this device, for pods to name; empty otherwise (and for a share)."
        )
    )

    class Meta:
        model = Allocation
        fields = [
            "id",
            "cluster",
            "node",
            "gpu_uuid",
            "gpu_index",
            "profile",
            "start",
            "resource_name",
            "instance_uuid",
            "claim",
        ]

    def get_claim(self, allocation) -> str:
        return claim_name(allocation) if claimed(allocation, allocation.gpu.node.cluster) else ""


def _allocations_shown():
    """Pools' allocations as their answers read them, with their GPU, node and cluster in the same rows, and
    only the columns the answers use: a page of pools holds hundreds of allocations, and each row would
    otherwise carry every column of the four tables (a cluster's alone are twenty-two, its encrypted
    kubeconfig among them)."""
    return Allocation.objects.select_related("gpu__node__cluster").only(
        *("id", "pool", "gpu", "profile", "slices", "resource_name", "instance_uuid", "released_at"),
        *("gpu__uuid", "gpu__index", "gpu__node", "gpu__node__name", "gpu__node__cluster"),
        *("gpu__node__cluster__name", "gpu__node__cluster__binding"),
    )


class PodSerializer(serializers.Serializer):
    name = serializers.CharField()
    node = serializers.CharField()
    phase = serializers.CharField()
    resources = serializers.DictField(
        child=serializers.IntegerField(), help_text=_("The device plugin's resources it asks for.")
    )
    allocations = serializers.SerializerMethodField(help_text=_("The pool's allocations it uses."))
    exact = serializers.BooleanField(
        help_text=_(
            "True where the allocations are known to be the pod's own (claims, under DRA); false where the "
            "pod asks the device plugin for one of them and the cluster does not say which."
        )
    )

    def get_allocations(self, pod) -> list[int]:
        return [a.pk for a in pod.units]


class ReminderSerializer(serializers.Serializer):
    at = serializers.DateTimeField()
    sent = serializers.BooleanField()


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
    billing_ended_at = serializers.DateTimeField(
        read_only=True,
        allow_null=True,
        help_text=_(
            "When billing stopped: the end date or reclaim deadline where one passed, else the release; null "
            "while it is billed."
        ),
    )
    reminders = serializers.SerializerMethodField(
        help_text=_("The reminders of its end: when each is due and whether it was sent.")
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
            "end_at",
            "billing_ended_at",
            "reminders",
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

    @extend_schema_field(ReminderSerializer(many=True))
    def get_reminders(self, pool) -> list[dict]:
        return [{"at": at, "sent": sent} for at, sent in upcoming_reminders(pool)]


class ExtendSerializer(serializers.Serializer):
    end_at = serializers.DateTimeField(help_text=_("The pool's new end, after its present one."))
    justification = serializers.CharField(max_length=4000, required=False, allow_blank=True, default="")


class ResizeSerializer(serializers.Serializer):
    add = RequestItemSerializer(
        many=True, required=False, allow_empty=False, max_length=20, help_text=_("Grow: more of these specs.")
    )
    release_allocations = serializers.ListField(
        child=serializers.IntegerField(min_value=1),
        required=False,
        allow_empty=False,
        max_length=10_000,
        help_text=_("Shrink: these live allocations of the pool are given back at once."),
    )
    release = RequestItemSerializer(
        many=True,
        required=False,
        allow_empty=False,
        max_length=20,
        help_text=_("Shrink: so many of these specs, the portal choosing those that free whole GPUs first."),
    )
    justification = serializers.CharField(max_length=4000, required=False, allow_blank=True, default="")

    def validate(self, attrs):
        given = [key for key in ("add", "release_allocations", "release") if key in attrs]
        if len(given) != 1:
            raise serializers.ValidationError(_("Give exactly one of add, release_allocations and release."))
        return attrs


class PoolDetailSerializer(PoolSerializer):
    pods = serializers.SerializerMethodField(
        help_text=_(
            "The project's GPU pods in the pool's cluster that use the pool's allocations: the first 500 by "
            "name."
        )
    )

    class Meta(PoolSerializer.Meta):
        fields = [*PoolSerializer.Meta.fields, "pods"]

    @extend_schema_field(PodSerializer(many=True))
    def get_pods(self, pool) -> list[dict]:
        live = [a for a in pool.allocations.all() if a.released_at is None]
        return PodSerializer(pool_pods(pool, live)[:MAX_PODS], many=True).data


class PoolViewSet(viewsets.ReadOnlyModelViewSet):
    """Pools: members see their tenant's, platform staff see all; who asked (or a tenant admin) releases."""

    def get_serializer_class(self):
        return PoolSerializer if self.action == "list" else PoolDetailSerializer

    def get_queryset(self):
        return (
            Pool.objects.visible_to(self.request.user)
            .select_related("cluster", "project", "request")
            .prefetch_related(
                "items",
                Prefetch("allocations", queryset=_allocations_shown()),
            )
            .order_by("-reserved_at", "-pk")
        )

    @extend_schema(request=None, responses=PoolDetailSerializer)
    @action(detail=True, methods=["post"])
    def release(self, request, pk=None):
        pool = self.get_object()
        services.release_pool(pool_id=pool.pk, user=request.user)
        return Response(self.get_serializer(self.get_queryset().get(pk=pool.pk)).data)

    @extend_schema(request=ExtendSerializer, responses={201: PoolRequestSerializer})
    @action(detail=True, methods=["post"])
    def extend(self, request, pk=None):
        """Ask for a later end: an extension request, decided by approvers like any request."""
        pool = self.get_object()
        body = ExtendSerializer(data=request.data)
        body.is_valid(raise_exception=True)
        asked = services.request_extension(
            pool_id=pool.pk,
            user=request.user,
            end_at=body.validated_data["end_at"],
            justification=body.validated_data["justification"],
        )
        return self._request(request, asked)

    @extend_schema(
        request=ResizeSerializer, responses={201: PoolRequestSerializer, 200: PoolDetailSerializer}
    )
    @action(detail=True, methods=["post"])
    def resize(self, request, pk=None):
        """Grow (`add`: a resize request, decided and placed like any request) or shrink
        (`release_allocations` or `release`: given back at once, the namespace's quota lowered first)."""
        pool = self.get_object()
        body = ResizeSerializer(data=request.data)
        body.is_valid(raise_exception=True)
        values = body.validated_data
        if "add" in values:
            asked = services.request_growth(
                pool_id=pool.pk,
                user=request.user,
                items=[(item["spec"], item["count"]) for item in values["add"]],
                justification=values["justification"],
            )
            return self._request(request, asked)
        services.shrink_pool(
            pool_id=pool.pk,
            user=request.user,
            allocation_ids=values.get("release_allocations"),
            release=[(item["spec"], item["count"]) for item in values["release"]]
            if "release" in values
            else None,
        )
        return Response(self.get_serializer(self.get_queryset().get(pk=pool.pk)).data)

    def _request(self, request, asked) -> Response:
        found = PoolRequest.objects.select_related("cluster", "submitted_by", "decided_by").get(pk=asked.pk)
        context = {"request": request, "positions": selectors.queue_positions()}
        return Response(PoolRequestSerializer(found, context=context).data, status=status.HTTP_201_CREATED)
