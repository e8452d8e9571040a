"""The e-mails that warn a tenant's admins as the month's projected cost reaches 80 % and 100 % of a budget.

Beat sends `billing.tasks.warn_budgets` every BUDGET_CHECK_SECONDS. Each budget whose projection has reached
a threshold has its admins told once per month and threshold: the e-mail's key names the budget, the month
(in billing's time zone) and the threshold, and `portal.mail.send_once` sends each key once per address, so
a run that repeats, or runs twice at once, sends nothing twice, and a new month starts afresh. A run tells of
the highest threshold reached only: a projection that leaps past both sends one e-mail, not two.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime

from django.urls import reverse
from django.utils import timezone

from billing.apps import BUDGET_EMAIL_TOPIC
from billing.budgets.standing import Month, months
from billing.conf import settings
from billing.models import Budget
from billing.selectors import this_month
from portal import mail, permissions
from portal.models import Preferences

THRESHOLDS = (100, 80)  # percent of the limit, highest first


@dataclass
class WarningReport:
    sent: list[str] = field(default_factory=list)  # "<key> → <address>"

    def summary(self) -> str:
        return f"{len(self.sent)} budget warning(s) sent" if self.sent else "no budget warning to send"


def reached(month: Month) -> int | None:
    """The highest threshold (percent) the month's projection has reached; None below them all, or where
    the projection is unknown or nothing is projected."""
    if month.projected is None or month.projected <= 0:
        return None
    for threshold in THRESHOLDS:
        if month.projected * 100 >= month.budget.month_limit * threshold:
            return threshold
    return None


def recipients(tenant_id: int) -> list[str]:
    """The tenant's admins who have not turned budget warnings off."""
    admins = permissions.tenant_admins(tenant_id=tenant_id).exclude(email="")
    return [admin.email for admin in admins if Preferences.wants_email(admin, BUDGET_EMAIL_TOPIC)]


def key(budget: Budget, now: datetime, threshold: int) -> str:
    return f"billing.budget:{budget.pk}:{this_month(now):%Y-%m}:{threshold}"


def warn(*, now: datetime | None = None) -> WarningReport:
    """Warn the admins of each tenant whose budgets' projections reached a threshold this month."""
    now = now or timezone.now()
    report = WarningReport()
    budgets = Budget.objects.select_related("tenant", "project").order_by("pk")
    for month in months(budgets, now=now):
        threshold = reached(month)
        if threshold is None:
            continue
        budget = month.budget
        subject = key(budget, now, threshold)
        page = settings.PORTAL_BASE_URL + reverse(
            "tenant-budgets", kwargs={"tenant_slug": budget.tenant.slug}
        )
        sent = mail.send_once(
            key=subject,
            to=recipients(budget.tenant_id),
            template="billing/email/budget_warning",
            context={
                "budget": budget,
                "owner": (budget.project or budget.tenant).name,
                "threshold": threshold,
                "projected": month.projected,
                "spent_to_date": month.spent_to_date,
                "limit": budget.month_limit.normalize(),
                "month": this_month(now),
                "page": page,
            },
        )
        report.sent += [f"{subject} → {address}" for address in sent]
    return report


__all__ = ["THRESHOLDS", "WarningReport", "reached", "warn"]
