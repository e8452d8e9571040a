"""Billing's reads for pages and the API: whose usage and invoices a person may see, and usage per
pool and spec for a month."""

from __future__ import annotations

from datetime import date, datetime
from decimal import Decimal
from zoneinfo import ZoneInfo

from django.db.models import DecimalField, F, QuerySet, Sum, Value
from django.db.models.functions import Coalesce
from django.utils import timezone

from billing import invoicing
from billing.conf import settings
from billing.models import Invoice, InvoiceState, UsageRecord
from portal.models import Role, Tenant, visible_tenant_ids
from portal.permissions import is_tenant_admin, staff_may


def visible_usage(user) -> QuerySet[UsageRecord]:
    """Finance (and operators) see every tenant's usage; anyone else that of the tenants they belong to."""
    tenants = visible_tenant_ids(user, staff_permission="billing.view_usagerecord")
    rows = UsageRecord.objects.all()
    return rows if tenants is None else rows.filter(pool__project__tenant_id__in=tenants)


def visible_invoices(user) -> QuerySet[Invoice]:
    """Finance sees every invoice; a tenant admin the issued (paid, void) invoices of their tenants."""
    tenants = visible_tenant_ids(user, staff_permission="billing.view_invoice", role=Role.ADMIN)
    rows = Invoice.objects.all()
    return rows if tenants is None else rows.filter(tenant_id__in=tenants).exclude(state=InvoiceState.DRAFT)


def may_see_invoices(*, user, tenant: Tenant) -> bool:
    """A tenant's admins and finance see its invoices; its other members do not."""
    return is_tenant_admin(user=user, tenant_id=tenant.pk) or staff_may(
        user=user, permission="billing.view_invoice"
    )


def tenant_invoices(*, user, tenant: Tenant) -> QuerySet[Invoice]:
    """The tenant's issued, paid and void invoices that the user may see (never a draft), newest month
    first."""
    return (
        visible_invoices(user)
        .filter(tenant=tenant)
        .exclude(state=InvoiceState.DRAFT)
        .select_related("tenant")
        .order_by("-month", "-pk")
    )


def this_month(now: datetime | None = None) -> date:
    """The first day of the month it is now in the billing time zone."""
    local = timezone.localtime(now or timezone.now(), ZoneInfo(settings.BILLING_TIME_ZONE))
    return date(local.year, local.month, 1)


def month_bounds(month: tuple[int, int] | None, *, now: datetime | None = None) -> tuple[datetime, datetime]:
    """A month's bounds in the billing time zone; None: this month, up to now."""
    if month is None:
        first = this_month(now)
        month = (first.year, first.month)
    return invoicing.month_span(*month, settings.BILLING_TIME_ZONE)


def usage_by_pool(rows: QuerySet[UsageRecord], start: datetime, end: datetime) -> QuerySet:
    """One row per pool and spec of the usage in [start, end): instance-seconds and the exact amount
    (rounded once, where it is shown)."""
    money = DecimalField(max_digits=24, decimal_places=8)
    return (
        rows.filter(period_start__gte=start, period_start__lt=end)
        .values(
            "pool_id",
            "pool__project__slug",
            "pool__project__tenant__slug",
            "gpu_model",
            "profile",
            "currency",
        )
        .annotate(
            held=Sum("seconds"),
            amount=Sum(
                F("seconds") * Coalesce(F("unit_price"), Value(Decimal(0))) / Value(Decimal(3600)),
                output_field=money,
            ),
        )
        .order_by("pool_id", "gpu_model", "profile")
    )
