"""REST API of quotas: each tenant's guarantee, limit, held and borrowed slices per GPU group and model, set
by operators and approvers; and the tenants' admission policy, a tenant setting (PATCH /api/v1/tenants/…)."""

from __future__ import annotations

from django.utils.translation import gettext as _
from django.utils.translation import gettext_lazy
from drf_spectacular.utils import extend_schema
from rest_framework import generics, serializers, status
from rest_framework.response import Response

from pools.models import TenantPolicy
from pools.selectors.quotas import quota_rows
from pools.services.quotas import UNSET, set_auto_approve, set_max_duration, set_quota
from portal.errors import InvalidInput
from portal.models import Project, Tenant, visible_tenant_ids


class QuotaSerializer(serializers.Serializer):
    tenant = serializers.CharField(help_text=gettext_lazy("The tenant's slug."))
    project = serializers.CharField(
        allow_null=True,
        help_text=gettext_lazy("A project's limit inside its tenant's; null for the tenant's."),
    )
    group = serializers.CharField(
        allow_blank=True,
        help_text=gettext_lazy("The GPU group (workload type); blank for requests without one."),
    )
    gpu_model = serializers.CharField()
    guaranteed = serializers.IntegerField(help_text=gettext_lazy("Compute slices guaranteed."))
    limit = serializers.IntegerField(
        allow_null=True,
        help_text=gettext_lazy("The most the tenant may hold, borrowing included; null: none."),
    )
    held = serializers.IntegerField(help_text=gettext_lazy("Compute slices its live pools hold."))
    borrowed = serializers.IntegerField(help_text=gettext_lazy("Of those, the slices beyond the guarantee."))


class QuotaChangeSerializer(serializers.Serializer):
    tenant = serializers.SlugField(max_length=50)
    group = serializers.CharField(max_length=40, allow_blank=True, required=False, default="")
    gpu_model = serializers.CharField(max_length=32)
    guaranteed = serializers.IntegerField(min_value=0, required=False, default=0)
    limit = serializers.IntegerField(
        min_value=0,
        allow_null=True,
        required=False,
        help_text=gettext_lazy("Left out: the guarantee (no borrowing); null: no limit."),
    )
    project = serializers.SlugField(
        max_length=50, required=False, help_text=gettext_lazy("A project's limit inside its tenant's.")
    )


class QuotaListView(generics.ListAPIView):
    """Quotas, one row per tenant, GPU group and model where the tenant has one or holds something: a tenant's
    people see their tenant's, platform staff all. Operators and approvers create or replace a row."""

    serializer_class = QuotaSerializer

    def get_queryset(self) -> list[dict]:
        return quota_rows(visible_tenant_ids(self.request.user))

    @extend_schema(request=QuotaChangeSerializer, responses={201: QuotaSerializer})
    def post(self, request):
        body = QuotaChangeSerializer(data=request.data)
        body.is_valid(raise_exception=True)
        values = body.validated_data
        tenant = Tenant.objects.filter(slug=values["tenant"]).first()
        if tenant is None:
            raise InvalidInput(_("No tenant is named %(slug)s.") % {"slug": values["tenant"]})
        project = None
        if "project" in values:
            project = Project.objects.filter(tenant=tenant, slug=values["project"]).first()
            if project is None:
                raise InvalidInput(
                    _("Tenant %(tenant)s has no project %(project)s.")
                    % {"tenant": tenant.slug, "project": values["project"]}
                )
        quota = set_quota(
            actor=request.user,
            tenant=tenant,
            project=project,
            group=values["group"],
            gpu_model=values["gpu_model"],
            guaranteed=values["guaranteed"],
            limit=values.get("limit", UNSET),
        )
        key = (project.slug if project else None, quota.group, quota.gpu_model)
        row = next(r for r in quota_rows([tenant.pk]) if (r["project"], r["group"], r["gpu_model"]) == key)
        return Response(QuotaSerializer(row).data, status=status.HTTP_201_CREATED)


# --- the tenants' admission policy, a setting of the tenants' API (portal.shell.TenantSetting) ----------


def read_auto_approve(tenants) -> dict[int, bool]:
    on = set(
        TenantPolicy.objects.filter(
            tenant__in=[t.pk for t in tenants], auto_approve_within_guarantee=True
        ).values_list("tenant_id", flat=True)
    )
    return {tenant.pk: tenant.pk in on for tenant in tenants}


def write_auto_approve(*, actor, tenant, value: bool) -> None:
    set_auto_approve(actor=actor, tenant=tenant, on=value)


def read_max_duration(tenants) -> dict[int, int | None]:
    hours = dict(
        TenantPolicy.objects.filter(tenant__in=[t.pk for t in tenants]).values_list(
            "tenant_id", "max_duration_hours"
        )
    )
    return {tenant.pk: hours.get(tenant.pk) for tenant in tenants}


def write_max_duration(*, actor, tenant, value: int | None) -> None:
    set_max_duration(actor=actor, tenant=tenant, hours=value)
