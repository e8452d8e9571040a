"""Deadlines: nothing stays `provisioning`, `releasing` or `reclaiming` forever, nor a what-if run `queued`
or `running`.

Beat runs `sweep_stuck_pools`. A pool in one of those states past POOL_REDRIVE_SECONDS
(counted from its reservation, or from when its release was asked) has its task enqueued
again, at most once per that period: the tasks are safe to repeat. Past POOL_STUCK_SECONDS
a provisioning pool fails (its capacity goes back to the queue) and a release is closed. An active
pool re-placed onto GPUs whose MIG change is in flight (pools/services/replacement.py) is settled again
past POOL_REDRIVE_SECONDS; settling gives up a change stuck past MIG_PENDING_TIMEOUT_SECONDS. A kept what-if
run queued or running past its deadline (WHATIF_RUN_SECONDS) is failed (pools/whatif/runs.py). A pool
`reclaiming` is released once its notice ends (`release_reclaimed`, pools/services/reclaims.py): on time by
the task sent for that moment, and here for any that task missed. A pool whose end date has come is released,
billed to its end (`release_ended`), and the reminders before an end are sent (`send_reminders`), both
pools/services/lifecycle.py.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from django.core.cache import cache
from django.db import transaction
from django.db.models import Case, DateTimeField, F, OuterRef, Subquery, When
from django.db.models.functions import Coalesce
from django.utils import timezone
from django.utils.translation import gettext as _
from django.utils.translation import gettext_noop

from pools import task_names
from pools.conf import settings
from pools.models import Pool, PoolEvent, PoolState
from pools.placement.reasons import Reason
from pools.services.lifecycle import release_ended, send_reminders
from pools.services.provisioning import close_release, fail_pool, release_locked
from pools.services.replacement import redrive_moves
from pools.services.requests import ask_again
from pools.whatif.runs import fail_overdue_runs
from portal import dispatch

log = logging.getLogger(__name__)
NOTICE_ENDED = gettext_noop("its notice ended: released for request #%(request)s")


@dataclass
class SweepReport:
    redriven: list[int] = field(default_factory=list)
    failed: list[int] = field(default_factory=list)
    released: list[int] = field(default_factory=list)
    whatif_failed: list[int] = field(default_factory=list)  # what-if runs, not pools
    reclaimed: list[int] = field(default_factory=list)  # pools whose reclaim notice ended
    ended: list[int] = field(default_factory=list)  # pools whose end date came
    reminded: list[int] = field(default_factory=list)  # pools reminded of their end

    def summary(self) -> str:
        text = (
            f"{len(self.redriven)} re-driven, {len(self.failed)} failed, "
            f"{len(self.released)} released as stuck"
        )
        if self.reclaimed:
            text += f", {len(self.reclaimed)} released as their reclaim notice ended"
        if self.ended:
            text += f", {len(self.ended)} released at their end date"
        if self.reminded:
            text += f", {len(self.reminded)} reminded of their end"
        if self.whatif_failed:
            text += f", {len(self.whatif_failed)} what-if runs failed past their deadline"
        return text


def sweep_stuck_pools(*, now: datetime | None = None) -> SweepReport:
    """Re-drive pools in provisioning or releasing past POOL_REDRIVE_SECONDS, end them past
    POOL_STUCK_SECONDS. Safe to run twice at once: ending rechecks the state under the pool's row
    lock, and a pool is re-driven at most once per POOL_REDRIVE_SECONDS."""
    now = now or timezone.now()
    stuck_at = now - timedelta(seconds=settings.POOL_STUCK_SECONDS)
    report = SweepReport()
    for pool in overdue_pools(now=now):
        minutes = int((now - pool.since).total_seconds() // 60)
        try:
            if pool.since > stuck_at:
                if cache.add(f"pools:redrive:{pool.pk}", "1", timeout=settings.POOL_REDRIVE_SECONDS):
                    log.warning(
                        "pool %s still %s after %s minutes: enqueued again", pool.pk, pool.state, minutes
                    )
                    _drive_later(pool.pk, pool.state)
                    report.redriven.append(pool.pk)
            elif _end_stuck(pool, minutes):
                (report.failed if pool.state == PoolState.PROVISIONING else report.released).append(pool.pk)
        except Exception:  # one pool that cannot be ended must not keep the others in flight
            log.exception("pool %s: the sweeper could not handle it", pool.pk)
    report.redriven += redrive_moves(now=now)  # a re-placed active pool whose MIG change is in flight
    try:  # the task sent for each notice's end does this on time; here, any it missed
        report.reclaimed = release_reclaimed(now=now)
    except Exception:
        log.exception("the sweeper could not release the pools whose reclaim notice ended")
    try:  # billing stops at each end whenever this runs: a late sweep costs nobody anything
        report.ended = release_ended(now=now)
        report.reminded = send_reminders(now=now)
    except Exception:
        log.exception("the sweeper could not release the pools whose end came, or remind those ending")
    try:
        report.whatif_failed = fail_overdue_runs(now=now)
    except Exception:  # the pools' deadlines are kept whatever befalls the what-if runs'
        log.exception("the sweeper could not fail the overdue what-if runs")
    return report


def release_reclaimed(*, now: datetime | None = None) -> list[int]:
    """Release every pool whose notice has ended, billing stopping at its `reclaim_at`, and ask its request
    again (RECLAIM_REQUEUE); returns the pools released. The release runs the queue, where the requests they
    were reclaimed for go first. Safe to run twice at once: the second finds them released, or locked and
    being released."""
    now = now or timezone.now()
    with transaction.atomic():
        due = list(
            Pool.objects.select_for_update(skip_locked=True)
            .select_related("project")
            .filter(state=PoolState.RECLAIMING, reclaim_at__lte=now)
            .order_by("reclaim_at", "pk")
        )
        for pool in due:
            release_locked(
                pool, at=pool.reclaim_at, reason=Reason(NOTICE_ENDED, request=pool.reclaimed_for_id)
            )
            ask_again(pool=pool)
    return [pool.pk for pool in due]


def overdue_pools(*, now: datetime | None = None) -> list[Pool]:
    """Pools in provisioning or releasing past their first deadline, each with `since` (when it entered
    that state): those the sweeper re-drives, and those it should have ended already (`since` before
    now - POOL_STUCK_SECONDS). Read by monitoring's /metrics."""
    now = now or timezone.now()
    redrive_at = now - timedelta(seconds=settings.POOL_REDRIVE_SECONDS)
    stuck_at = now - timedelta(seconds=settings.POOL_STUCK_SECONDS)
    return _in_flight_since(max(redrive_at, stuck_at))  # a stuck deadline set first still counts


def _end_stuck(pool: Pool, minutes: int) -> bool:
    """Fail a stuck provisioning or close a stuck release; False if someone else holds or moved it."""
    with transaction.atomic():
        # Skip a pool whose row another sweeper or its own task holds: they settle it, or the next
        # sweep does. The state is read again under the lock.
        held = Pool.objects.select_for_update(skip_locked=True).filter(pk=pool.pk, state=pool.state)
        if held.values_list("pk", flat=True).first() is None:
            return False
        if pool.state == PoolState.PROVISIONING:
            reason = _("Provisioning did not finish within %(minutes)s minutes.") % {"minutes": minutes}
            fail_pool(pool_id=pool.pk, reason=reason)
        else:
            reason = _(
                "The release did not finish within %(minutes)s minutes; the pool is released, "
                "but the quota of its namespace may still count it."
            ) % {"minutes": minutes}
            close_release(pool_id=pool.pk, reason=reason)
    return True


def _in_flight_since(before: datetime) -> list[Pool]:
    """Pools in provisioning or releasing that entered that state before `before`, with `since`."""
    entered_releasing = Subquery(
        PoolEvent.objects.filter(pool=OuterRef("pk"), to_state=PoolState.RELEASING)
        .order_by("-at")
        .values("at")[:1]
    )
    return list(
        Pool.objects.filter(state__in=[PoolState.PROVISIONING, PoolState.RELEASING])
        .annotate(
            since=Case(
                When(state=PoolState.RELEASING, then=Coalesce(entered_releasing, F("reserved_at"))),
                default=F("reserved_at"),
                output_field=DateTimeField(),
            )
        )
        .filter(since__lte=before)
        .order_by("since", "pk")
    )


def _drive_later(pool_id: int, state: str) -> None:
    dispatch.after_commit(
        task_names.PROVISION if state == PoolState.PROVISIONING else task_names.FINISH_RELEASE, pool_id
    )
