"""Reads of pools' ends: a tenant's longest pool life, the lead times of the reminders before an end, and a
pool's reminders as its page and the API show them (sent by pools/services/lifecycle.py)."""

from __future__ import annotations

from datetime import datetime, timedelta

from pools.conf import settings
from pools.models import Pool, PoolRequest, RequestKind, TenantPolicy


def reminder_leads() -> list[int]:
    """POOL_END_REMINDERS as seconds before the end, farthest first."""
    return sorted((round(days * 86400) for days in settings.POOL_END_REMINDERS), reverse=True)


def upcoming_reminders(pool: Pool) -> list[tuple[datetime, bool]]:
    """The pool's reminders as its page shows them: (when, sent) for each lead time, in time order."""
    if pool.end_at is None:
        return []
    return [
        (pool.end_at - timedelta(seconds=lead), lead in pool.reminders_sent)
        for lead in reminder_leads()
        if pool.end_at - timedelta(seconds=lead) > pool.reserved_at or lead in pool.reminders_sent
    ]


def longest_duration(tenant_id: int) -> timedelta | None:
    """The tenant's longest pool life, where it sets one (every request must then give an end within it)."""
    hours = (
        TenantPolicy.objects.filter(tenant_id=tenant_id).values_list("max_duration_hours", flat=True).first()
    )
    return None if hours is None else timedelta(hours=hours)


def request_end(request: PoolRequest, now: datetime) -> datetime | None:
    """When the pool of a request would end were it admitted at `now`: its end date (for an extension, the
    new one), its duration from `now`, or for a growth its pool's end; None where it has none."""
    if request.kind == RequestKind.RESIZE:
        return request.target_pool.end_at
    if request.hold_seconds is not None:
        return now + timedelta(seconds=request.hold_seconds)
    return request.end_at
