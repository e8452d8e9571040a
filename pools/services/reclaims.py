"""Reclaim: borrowed pools given notice to make room for a request within its tenant's guarantee.

The queue (pools/services/queue.py) chooses the pools by the admission policy (pools/placement/admission.py)
and calls `give_notice` in its own transaction, under the capacity lock: each becomes `reclaiming`, still
usable, with `reclaim_at` RECLAIM_NOTICE_SECONDS away and the request it makes room for; its people are
e-mailed (the pool's event). At `reclaim_at`, `release_reclaimed` (pools/services/deadlines.py, the
deadlines' module) releases each pool whose notice ended,
billing stopping at `reclaim_at` itself; the release runs the queue, where the request the capacity was
freed for goes first (pools/placement/admission.py: queue order), so that no other request takes it. A task
sent for the moment the notice ends does it on time; the sweeper catches any that one missed. Where the
request is admitted otherwise, cancelled or rejected first, `call_off` gives the pools back their active
state. The tenant may release a reclaiming pool early, as any pool.
"""

from __future__ import annotations

from collections.abc import Iterable
from datetime import datetime, timedelta

from django.utils.translation import gettext_noop

from pools import task_names
from pools.conf import settings
from pools.models import Pool, PoolRequest, PoolState
from pools.placement.reasons import Reason
from pools.services.transitions import transition
from portal import dispatch

NOTICE = gettext_noop(
    "borrowed capacity reclaimed for request #%(request)s, within its tenant's guarantee: released at %(at)s"
)
CALLED_OFF = gettext_noop("the reclaim is called off: request #%(request)s %(why)s")


def give_notice(pool_ids: Iterable[int], request: PoolRequest, *, now: datetime) -> list[Pool]:
    """Mark these active pools reclaiming for `request`; the caller holds the capacity lock."""
    at = now + timedelta(seconds=settings.RECLAIM_NOTICE_SECONDS)
    pools = list(
        Pool.objects.select_for_update().filter(pk__in=list(pool_ids), state=PoolState.ACTIVE).order_by("pk")
    )
    for pool in pools:
        reason = Reason(NOTICE, request=request.pk, at=at.isoformat(timespec="seconds"))
        transition(pool, PoolState.RECLAIMING, reason=reason)
        pool.reclaim_at, pool.reclaimed_for = at, request
        pool.save(update_fields=["state", "reclaim_at", "reclaimed_for"])
    if pools:
        dispatch.after_commit(task_names.RELEASE_RECLAIMED, countdown=settings.RECLAIM_NOTICE_SECONDS)
    return pools


def call_off(request: PoolRequest, why: str) -> list[Pool]:
    """Give back their active state to the pools reclaiming for `request` (admitted otherwise, cancelled,
    rejected): `why` says which, as a template marked for translation."""
    pools = list(
        Pool.objects.select_for_update()
        .filter(reclaimed_for=request, state=PoolState.RECLAIMING)
        .order_by("pk")
    )
    for pool in pools:
        reason = Reason(CALLED_OFF, request=request.pk, why=Reason(why))
        transition(pool, PoolState.ACTIVE, reason=reason)
        pool.reclaim_at, pool.reclaimed_for = None, None  # its events keep what happened
        pool.save(update_fields=["state", "reclaim_at", "reclaimed_for"])
    return pools


__all__ = ["call_off", "give_notice"]
