"""Each budget as the month stands: the projection of the month's cost and what was spent to date, by
billing's own figures (`billing.spend`, the ones the tenant's pages show), and what a request would add.

The projection is the month's cost so far plus what is held now, at today's prices, to the month's end. A
request adds its hourly cost from now to the month's end, or to its end where it ends sooner. Budgets of
many tenants are answered in a fixed number of queries (one `pool_spend` over all their pools).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime
from decimal import Decimal

from django.utils import timezone

from billing import invoicing, spend
from billing.budgets import selectors
from billing.models import Budget
from billing.selectors import month_bounds
from pools.budgets import BudgetStanding
from pools.models import Pool
from portal.models import Project

HOUR = Decimal(3600)


@dataclass(frozen=True)
class Month:
    """A budget as its month stands; amounts rounded to the currency, None where a price is unknown."""

    budget: Budget
    projected: Decimal | None
    spent_to_date: Decimal | None

    @property
    def share(self) -> Decimal | None:
        """The projection as a share of the limit (1 is all of it); None where either says nothing."""
        if self.projected is None or not self.budget.month_limit:
            return None
        return self.projected / self.budget.month_limit


def month_spends(budgets: Iterable[Budget], *, now: datetime) -> dict[int, spend.Spend]:
    """Budget id → this month's spend of the pools it covers (its project's, or its tenant's)."""
    budgets = list(budgets)
    tenants = {budget.tenant_id for budget in budgets}
    if not tenants:
        return {}
    per_pool = spend.pool_spend(pools=Pool.objects.filter(project__tenant_id__in=tenants), now=now)
    owners = Pool.objects.filter(pk__in=list(per_pool)).values_list("pk", "project_id", "project__tenant_id")
    project_of, tenant_of = {}, {}
    for pool_id, project_id, tenant_id in owners:
        project_of[pool_id], tenant_of[pool_id] = project_id, tenant_id
    by_project, by_tenant = spend.by_project(per_pool, project_of), spend.by_project(per_pool, tenant_of)
    return {
        budget.pk: (by_project if budget.project_id else by_tenant).get(
            budget.project_id or budget.tenant_id, spend.Spend()
        )
        for budget in budgets
    }


def months(budgets: Iterable[Budget], *, now: datetime | None = None) -> list[Month]:
    """Each budget with its month's projection and what was spent to date, in the given order."""
    budgets = list(budgets)
    now = now or timezone.now()
    spends = month_spends(budgets, now=now)
    found = []
    for budget in budgets:
        figures = spend.figures(spends[budget.pk])
        found.append(Month(budget, figures.projected, figures.to_date))
    return found


def added(hourly_cost: Decimal | None, *, now: datetime, ends_at: datetime | None = None) -> Decimal | None:
    """What a request costing `hourly_cost` adds to this month: from now to the month's end, or to
    `ends_at` where it comes first (nothing where it has passed)."""
    if hourly_cost is None:
        return None
    _start, month_end = month_bounds(None, now=now)
    until = month_end if ends_at is None else min(ends_at, month_end)
    seconds = max(Decimal(0), Decimal((until - now).total_seconds()))
    return hourly_cost * seconds / HOUR


def standings(*, project: Project, hourly_cost: Decimal | None, ends_at: datetime | None = None) -> list:
    """The check billing registers in `pools.budgets`: each budget applying to a request of `project`, as
    the month stands, with what the request adds (`pools.budgets.BudgetStanding`)."""
    now = timezone.now()
    budgets = list(selectors.project_budgets(project=project))
    if not budgets:
        return []
    adds = added(hourly_cost, now=now, ends_at=ends_at)
    found = []
    for month in months(budgets, now=now):
        budget = month.budget
        currency = budget.currency
        found.append(
            BudgetStanding(
                owner=(budget.project or budget.tenant).name,
                is_project=budget.project_id is not None,
                limit=invoicing.round_money(budget.month_limit, currency),
                currency=currency,
                hard=budget.hard,
                projected=month.projected,
                adds=None if adds is None else invoicing.round_money(adds, currency),
            )
        )
    return found
