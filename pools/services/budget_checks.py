"""What a request would do to its tenant's budgets, and the approver's override of a hard one.

Budgets belong to billing, which fills the hook `pools/budgets.py`; without billing no budget applies. A
request counts at its hourly cost from now to its end, or the month's end where that comes first: a new pool
at its items' cost until its end date (or duration); a growth at its items' cost until its pool's end; an
extension at its pool's cost from the present end to the new one.
"""

from __future__ import annotations

from datetime import timedelta

from django.utils import timezone
from django.utils.translation import gettext as _
from django.utils.translation import gettext_noop

from pools import budgets, pricing
from pools.models import PoolRequest, RequestKind, RequestState
from pools.placement.reasons import Reason
from pools.selectors import render_reason
from pools.selectors.ends import request_end
from pools.specs import Spec
from portal.errors import Conflict

BUDGET_OVERRIDDEN = gettext_noop("approved past %(budget)s: the approver overrode the hard budget")


def request_budgets(request: PoolRequest) -> list[budgets.BudgetStanding]:
    """The budgets that apply to the request (its tenant's, its project's), each with what it would add to
    the month (`pools/budgets.py`: none without billing)."""
    now = timezone.now()
    if request.kind == RequestKind.EXTENSION:
        pool = request.target_pool
        cost = pricing.pool_hourly_cost(pool)
        added = max(timedelta(0), (request.end_at or now) - (pool.end_at or now))
        return budgets.standings(project=request.project, hourly_cost=cost, ends_at=now + added)
    items = [(Spec(item.gpu_model, item.profile), item.count) for item in request.items.all()]
    cost = pricing.estimated_hourly_cost(items)
    return budgets.standings(project=request.project, hourly_cost=cost, ends_at=request_end(request, now))


def budget_override(request: PoolRequest, override: bool) -> Reason | None:
    """A request to decide that passes a hard budget waits for the approver's explicit override, which the
    approval's event then records, naming the budget; None where no hard budget is passed."""
    if request.state != RequestState.SUBMITTED:
        return None  # the transition refuses it
    passed = budgets.most_passed(request_budgets(request))
    if passed is None:
        return None
    if not override:
        raise Conflict(
            _("Request #%(id)s would pass %(budget)s. Approve it with the budget override to go ahead.")
            % {"id": request.pk, "budget": render_reason(passed.reason.as_data())}
        )
    return Reason(BUDGET_OVERRIDDEN, budget=passed.reason)
