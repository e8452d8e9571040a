"""Budgets' reads for pages and the API: which a person may see, a tenant's and a project's."""

from __future__ import annotations

from django.db.models import F, Q, QuerySet

from billing.models import Budget
from portal.models import Project, Role, Tenant, visible_tenant_ids
from portal.permissions import is_tenant_admin, staff_may


def visible_budgets(user) -> QuerySet[Budget]:
    """Platform staff (finance, approvers, operators) see every tenant's budgets; tenant admins their own."""
    tenants = visible_tenant_ids(user, role=Role.ADMIN)
    rows = Budget.objects.select_related("tenant", "project")
    rows = rows if tenants is None else rows.filter(tenant_id__in=tenants)
    return rows.order_by("tenant__slug", F("project__slug").asc(nulls_first=True), "pk")


def may_see_budgets(*, user, tenant: Tenant) -> bool:
    """The budgets page: a tenant's admins, and platform staff who see every tenant."""
    return is_tenant_admin(user=user, tenant_id=tenant.pk) or staff_may(
        user=user, permission="portal.view_tenant"
    )


def tenant_budgets(*, tenant: Tenant) -> QuerySet[Budget]:
    """The tenant's own budget first, then its projects' by name."""
    return (
        Budget.objects.filter(tenant=tenant)
        .select_related("tenant", "project")
        .order_by(F("project__name").asc(nulls_first=True), "pk")
    )


def project_budgets(*, project: Project) -> QuerySet[Budget]:
    """Those a request of the project counts against: its tenant's, then its own."""
    return (
        Budget.objects.filter(Q(project__isnull=True) | Q(project=project), tenant_id=project.tenant_id)
        .select_related("tenant", "project")
        .order_by(F("project").asc(nulls_first=True))
    )
