"""REST API of pool requests: tenants submit and cancel, approvers decide."""

from __future__ import annotations

from django.utils.translation import gettext_lazy as _
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiParameter, extend_schema, extend_schema_field
from rest_framework import generics, mixins, serializers, status, viewsets
from rest_framework.decorators import action
from rest_framework.response import Response

from pools import pricing, selectors, services
from pools.models import Cluster, PoolRequest
from pools.pricing import estimated_hourly_cost, hourly_price
from pools.specs import Spec
from portal.models import DNS_LABEL_PATTERN, Project, dns_label_validator

# A cluster or a purpose (a GPU group) is named by a DNS label, or left blank; nothing else names one.
# Which exist is data, not schema: GET /api/v1/clusters/ lists the clusters and each one's groups.
BLANK_OR_NAME = f"^({DNS_LABEL_PATTERN.removeprefix('^').removesuffix('$')})?$"
PURPOSE_HELP = _(
    "A GPU group's name, as GET /api/v1/clusters/ lists them in `groups`; blank: any group. Where the "
    "clusters it may land on have groups, a name that is none of them is refused (400)."
)


class RequestItemSerializer(serializers.Serializer):
    spec = serializers.CharField(max_length=64, help_text=_("e.g. h200-141gb.mig-1g.18gb or h100-80gb.full"))
    count = serializers.IntegerField(min_value=1, max_value=10_000)


class PoolRequestCreateSerializer(serializers.Serializer):
    project = serializers.PrimaryKeyRelatedField(queryset=Project.objects.none())
    items = RequestItemSerializer(many=True, allow_empty=False, max_length=20)
    cluster = serializers.SlugRelatedField(
        slug_field="name", queryset=Cluster.objects.all(), required=False, allow_null=True
    )
    purpose = serializers.CharField(
        max_length=40,
        required=False,
        allow_blank=True,
        default="",
        validators=[dns_label_validator],
        help_text=PURPOSE_HELP,
    )
    justification = serializers.CharField(max_length=4000, required=False, allow_blank=True, default="")
    end_at = serializers.DateTimeField(
        required=False,
        allow_null=True,
        default=None,
        help_text=_(
            "When the pool is released by itself; absent or null: no end (unless its tenant needs one)."
        ),
    )
    duration_hours = serializers.IntegerField(
        required=False,
        allow_null=True,
        default=None,
        min_value=1,
        max_value=87_600,
        help_text=_("Instead of end_at: how long the pool lives once admitted."),
    )

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
    quota_verdict = serializers.SerializerMethodField(
        help_text=_(
            "Against the tenant's quotas: within, borrowed or beyond_limit; null where no quota applies."
        )
    )
    waiting_reason = serializers.SerializerMethodField(help_text=_("Why it waits, in the reader's language."))
    pool = serializers.SerializerMethodField()
    asked_again_for = serializers.IntegerField(
        source="asked_again_for_id",
        allow_null=True,
        read_only=True,
        help_text=_("The reclaimed pool whose work this request asks for again; else null."),
    )
    estimated_hourly_cost = serializers.SerializerMethodField(
        help_text=_("Null while a price of one of the items is unknown.")
    )
    kind = serializers.CharField(
        read_only=True,
        help_text=_("new (a pool), extension (of its pool's end) or resize (growth of its pool)"),
    )
    end_at = serializers.DateTimeField(
        read_only=True,
        allow_null=True,
        help_text=_("The end asked for (or set by the approver); for an extension, the pool's new end."),
    )
    duration_hours = serializers.IntegerField(
        read_only=True,
        allow_null=True,
        help_text=_("Where the request gives a duration instead of an end date: its hours; else null."),
    )

    class Meta:
        model = PoolRequest
        fields = [
            "id",
            "kind",
            "project",
            "cluster",
            "purpose",
            "justification",
            "items",
            "state",
            "priority",
            "quota_verdict",
            "queue_position",
            "waiting_reason",
            "submitted_by",
            "submitted_at",
            "decided_by",
            "decided_at",
            "decision_reason",
            "pool",
            "asked_again_for",
            "estimated_hourly_cost",
            "end_at",
            "duration_hours",
        ]

    def _specs(self, request) -> list[tuple[Spec, int]]:
        return [(Spec(i.gpu_model, i.profile), i.count) for i in request.items.all()]

    @extend_schema_field(RequestItemSerializer(many=True))
    def get_items(self, request) -> list[dict]:
        return [{"spec": spec.id, "gpu_model": spec.gpu_model, "profile": spec.profile, "count": n}
                for spec, n in self._specs(request)]  # fmt: skip

    def get_quota_verdict(self, request) -> str | None:
        return request.quota_verdict or None

    def get_waiting_reason(self, request) -> str:
        return selectors.waiting_reason(request)

    def get_queue_position(self, request) -> int | None:
        return self.context["positions"].get(request.pk)

    @extend_schema_field(serializers.IntegerField(allow_null=True))
    def get_pool(self, request) -> int | None:
        """The pool an extension or a resize changes; the pool a new request got, once admitted."""
        if request.target_pool_id is not None:
            return request.target_pool_id
        return getattr(getattr(request, "pool", None), "pk", None)

    def get_estimated_hourly_cost(self, request) -> str | None:
        cost = estimated_hourly_cost(self._specs(request))
        return None if cost is None else str(cost)


class ApproveSerializer(serializers.Serializer):
    priority = serializers.IntegerField(required=False, min_value=-1000, max_value=1000)
    end_at = serializers.DateTimeField(
        required=False,
        allow_null=True,
        default=None,
        help_text=_("A sooner end than the one asked for (never later); absent: as asked."),
    )
    override_budget = serializers.BooleanField(
        required=False,
        default=False,
        help_text=_(
            "Approve although the request would take its month's projected cost past a hard budget; "
            "without it such a request is refused (409)."
        ),
    )


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
        context["positions"] = selectors.queue_positions()
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
            end_at=values["end_at"],
            hold_seconds=None if values["duration_hours"] is None else values["duration_hours"] * 3600,
        )
        return self._answer(created, status.HTTP_201_CREATED)

    @extend_schema(request=ApproveSerializer, responses=PoolRequestSerializer)
    @action(detail=True, methods=["post"])
    def approve(self, request, pk=None):
        target = self.get_object()
        body = ApproveSerializer(data=request.data)
        body.is_valid(raise_exception=True)
        services.approve_request(
            request_id=target.pk,
            approver=request.user,
            priority=body.validated_data.get("priority"),
            end_at=body.validated_data["end_at"],
            override_budget=body.validated_data["override_budget"],
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


class ClusterOfferSerializer(serializers.Serializer):
    cluster = serializers.CharField()
    available = serializers.IntegerField()
    total = serializers.IntegerField()


class SpecSerializer(serializers.Serializer):
    id = serializers.CharField(source="spec.id")
    gpu_model = serializers.CharField(source="spec.gpu_model")
    profile = serializers.CharField(
        source="spec.profile",
        help_text=_("full, a MIG profile, or a share: ts-N (time-sliced) or mps-N (MPS)"),
    )
    kind = serializers.CharField(source="spec.kind.name", help_text=_("whole, mig, time-sliced or mps"))
    memory_gb = serializers.FloatField(source="spec.memory_gb")
    compute_slices = serializers.SerializerMethodField(
        help_text=_("What one counts for against a quota: a share its fraction of the GPU's 7.")
    )
    hourly_price = serializers.SerializerMethodField(help_text=_("Null until a price list exists."))
    currency = serializers.SerializerMethodField()
    available = serializers.IntegerField(help_text=_("How many one request could get now, on one cluster."))
    total = serializers.IntegerField(help_text=_("The most one request could ever get, on one cluster."))
    by_cluster = ClusterOfferSerializer(many=True)

    @extend_schema_field(OpenApiTypes.NUMBER)
    def get_compute_slices(self, offer) -> float:
        slices = offer.spec.compute_slices
        return int(slices) if slices == int(slices) else round(float(slices), 3)

    def get_hourly_price(self, offer) -> str | None:
        price = hourly_price(offer.spec)
        return None if price is None else str(price)

    def get_currency(self, offer) -> str:
        return pricing.currency() or ""


class SpecFilterSerializer(serializers.Serializer):
    purpose = serializers.CharField(
        max_length=40, required=False, allow_blank=True, default="", validators=[dns_label_validator]
    )
    cluster = serializers.SlugRelatedField(
        slug_field="name", queryset=Cluster.objects.all(), required=False, allow_null=True, default=None
    )


@extend_schema(
    parameters=[
        OpenApiParameter(
            "purpose",
            {"type": "string", "maxLength": 40, "pattern": BLANK_OR_NAME},
            description=PURPOSE_HELP,
        ),
        OpenApiParameter(
            "cluster",
            {
                "type": "string",
                "maxLength": Cluster._meta.get_field("name").max_length,
                "pattern": BLANK_OR_NAME,
            },
            description=_(
                "A cluster's name, as GET /api/v1/clusters/ lists them; any cluster when blank or absent. "
                "A name that is no cluster's is refused (400)."
            ),
        ),
    ]
)
class SpecListView(generics.ListAPIView):
    """What can be requested: per spec, how many one request could get now and the most ever, within the
    purpose's GPU group and the cluster when given, with the hourly price."""

    serializer_class = SpecSerializer

    def get_queryset(self) -> list:
        filters = SpecFilterSerializer(data=self.request.query_params)
        filters.is_valid(raise_exception=True)
        purpose, cluster = filters.validated_data["purpose"], filters.validated_data["cluster"]
        picture = selectors.capacity_picture()
        services.check_purpose(picture, purpose, cluster)
        return selectors.spec_offers(picture=picture, purpose=purpose, cluster=cluster)
