"""Setting and removing budgets: by the tenant's admins, in billing's currency, never below zero, audited.

Each change runs in one transaction under the tenant's budgets' lock (the tenant row), writes its audit
entry there, and refuses bad input with a `PortalError` naming the field at fault, changing nothing.
"""

from __future__ import annotations

from decimal import Decimal, InvalidOperation

from django.db import transaction
from django.utils.translation import gettext as _
from django.utils.translation import gettext_noop

from billing.conf import settings
from billing.models import MONEY, Budget
from portal import audit
from portal.errors import InvalidInput, NotAllowed
from portal.models import Project, Tenant
from portal.permissions import is_tenant_admin

BUDGET_SET = gettext_noop("Budget of %(owner)s set to %(limit)s %(currency)s a month (%(kind)s)")
BUDGET_REMOVED = gettext_noop("Budget of %(owner)s removed")
HARD = gettext_noop("hard: requests past it wait for an approver's override")
SOFT = gettext_noop("soft: warnings only")
# The largest limit the column holds: MONEY's digits, less its decimal places.
MOST = Decimal(10) ** (MONEY["max_digits"] - MONEY["decimal_places"])


def _require_admin(actor, tenant: Tenant) -> None:
    if not is_tenant_admin(user=actor, tenant_id=tenant.pk):
        raise NotAllowed(_("Only an admin of %(tenant)s sets its budgets.") % {"tenant": tenant.name})


def check_limit(value) -> Decimal:
    """A month's limit as a Decimal: a number of at most 4 decimal places, from 0 up."""
    try:
        limit = Decimal(str(value).strip())
    except (InvalidOperation, ValueError):
        raise InvalidInput(
            _("The monthly limit is a number, such as 1500000."), field="month_limit"
        ) from None
    if not limit.is_finite():
        raise InvalidInput(_("The monthly limit is a number, such as 1500000."), field="month_limit")
    if limit < 0:
        raise InvalidInput(_("The monthly limit cannot be negative."), field="month_limit")
    if limit >= MOST or limit != limit.quantize(Decimal(1).scaleb(-MONEY["decimal_places"])):
        raise InvalidInput(
            _("The monthly limit is below %(most)s, with at most %(places)s decimal places.")
            % {"most": f"{MOST:,}", "places": MONEY["decimal_places"]},
            field="month_limit",
        )
    return limit


def check_currency(currency: str) -> str:
    """Budgets are in billing's currency, the one every price and invoice is in."""
    if currency != settings.BILLING_CURRENCY:
        raise InvalidInput(
            _("Budgets are in %(currency)s, the currency of every price and invoice.")
            % {"currency": settings.BILLING_CURRENCY},
            field="currency",
        )
    return currency


def _check_project(tenant: Tenant, project: Project | None) -> None:
    if project is not None and project.tenant_id != tenant.pk:
        raise InvalidInput(
            _("Project %(project)s is not of tenant %(tenant)s.")
            % {"project": project.slug, "tenant": tenant.slug},
            field="project",
        )


def _lock(tenant: Tenant) -> None:
    """The tenant's budgets change one at a time: two first budgets of a tenant at once make one row."""
    Tenant.objects.select_for_update().filter(pk=tenant.pk).first()


def set_budget(
    *, actor, tenant: Tenant, month_limit, currency: str, hard: bool = False, project: Project | None = None
) -> Budget:
    """Create or replace the budget of the tenant (or of its `project`)."""
    _require_admin(actor, tenant)
    _check_project(tenant, project)
    limit = check_limit(month_limit)
    check_currency(currency)
    if not isinstance(hard, bool):
        raise InvalidInput(_("hard is true or false."), field="hard")
    with transaction.atomic():
        _lock(tenant)
        before = Budget.objects.filter(tenant=tenant, project=project).first()
        budget, _created = Budget.objects.update_or_create(
            tenant=tenant,
            project=project,
            defaults={"month_limit": limit, "currency": currency, "hard": hard},
        )
        audit.record(
            "budget.changed",
            summary=BUDGET_SET,
            values={
                "owner": (project or tenant).name,
                "limit": f"{limit.normalize():,f}",
                "currency": currency,
                "kind": audit.term(HARD if hard else SOFT),
            },
            actor=actor,
            tenant_id=tenant.pk,
            subject=("budget", budget.pk),
            details={
                "project": project.slug if project else None,
                "before": None if before is None else _details(before),
                "after": _details(budget),
            },
        )
    return budget


def remove_budget(*, actor, tenant: Tenant, project: Project | None = None) -> bool:
    """Remove the budget of the tenant (or of its `project`); False where there was none."""
    _require_admin(actor, tenant)
    _check_project(tenant, project)
    with transaction.atomic():
        _lock(tenant)
        budget = Budget.objects.filter(tenant=tenant, project=project).first()
        if budget is None:
            return False
        audit.record(
            "budget.removed",
            summary=BUDGET_REMOVED,
            values={"owner": (project or tenant).name},
            actor=actor,
            tenant_id=tenant.pk,
            subject=("budget", budget.pk),
            details={"project": project.slug if project else None, "before": _details(budget)},
        )
        budget.delete()
    return True


def _details(budget: Budget) -> dict:
    return {"month_limit": str(budget.month_limit), "currency": budget.currency, "hard": budget.hard}
