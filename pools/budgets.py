"""Budgets as far as pools need them: what a request would add to its tenant's (and project's) month, and
whether that passes a hard budget, which holds the request for an approver's explicit override.

Budgets, and the projection of a month's cost they are weighed against, belong to billing; billing registers
its check here when it is installed, so that pools never import billing. Without billing, no budget applies.

Words:
- *standing*: one budget that applies to a request (its tenant's, or its project's), as the month stands:
  the projection of the month's cost from what is held now, and what the request adds (its hourly cost until
  the month's end, or until `ends_at` where it ends sooner). Amounts are rounded to the currency already.
- *passed*: a hard budget whose limit the projection with the request goes over.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from decimal import Decimal

from pools.placement.reasons import Reason, gettext_noop

PASSED = gettext_noop(
    "the hard budget of %(owner)s: %(limit)s %(currency)s a month, and the month's projected cost with this "
    "request is %(projected)s %(currency)s, %(over)s %(currency)s over"
)


@dataclass(frozen=True)
class BudgetStanding:
    """One budget that applies to a request. `projected` and `adds` are None where a price is unknown."""

    owner: str  # the tenant's or the project's name
    is_project: bool
    limit: Decimal
    currency: str
    hard: bool
    projected: Decimal | None  # the month's projection from what is held now
    adds: Decimal | None  # what the request adds to the month

    @property
    def with_request(self) -> Decimal | None:
        if self.projected is None:
            return None
        return self.projected + (self.adds or Decimal(0))

    @property
    def over(self) -> Decimal:
        """How far the projection with the request goes past the limit; 0 where it does not."""
        return max(Decimal(0), (self.with_request or Decimal(0)) - self.limit)

    @property
    def passed(self) -> bool:
        """A hard budget the request would take the projection past."""
        return self.hard and self.over > 0

    @property
    def reason(self) -> Reason:
        """Which budget is passed and by how much, translated where it is shown."""
        return Reason(
            PASSED,
            owner=self.owner,
            limit=f"{self.limit:,}",
            projected=f"{self.with_request or 0:,}",
            over=f"{self.over:,}",
            currency=self.currency,
        )


Standings = Callable[..., list[BudgetStanding]]
_standings: Standings | None = None


def register_budgets(*, standings: Standings) -> None:
    """Billing's `standings(*, project, hourly_cost, ends_at)`: the budgets that apply to a request of that
    project (the tenant's first), each with what the request adds."""
    global _standings
    _standings = standings


def standings(
    *, project, hourly_cost: Decimal | None, ends_at: datetime | None = None
) -> list[BudgetStanding]:
    """The budgets that apply to a request of `project` costing `hourly_cost` an hour (None: unknown, adding
    nothing known) from now until `ends_at` (None: the month's end); none without billing."""
    if _standings is None:
        return []
    return _standings(project=project, hourly_cost=hourly_cost, ends_at=ends_at)


def most_passed(found: list[BudgetStanding]) -> BudgetStanding | None:
    """Of `found`, the hard budget passed by most; None where none is passed."""
    return max((standing for standing in found if standing.passed), key=lambda s: s.over, default=None)


def passed_hard_budget(
    *, project, hourly_cost: Decimal | None, ends_at: datetime | None = None
) -> BudgetStanding | None:
    """The hard budget such a request would pass, the one it passes by most; None where it passes none."""
    return most_passed(standings(project=project, hourly_cost=hourly_cost, ends_at=ends_at))
