"""End dates: what end a request may ask for, the approver's shorter one, an extension moving a pool's end,
and the changes of a pool that end with it.

A request gives an end date (`end_at`) or a duration (`hold_seconds`, counted from its admission), or
neither (the pool lives until released), unless its tenant sets a longest duration: then it must give one
within it. An approver approves the end as asked or sooner, never later. An extension is a request of its
own kind naming its pool; approved, it moves the pool's end (and the reminders start again). When a pool
is released, its extensions and resizes still waiting are cancelled: there is nothing left to change.
Releasing a pool at its end, and the reminders before it, are the sweeper's (pools/services/lifecycle.py).
"""

from __future__ import annotations

from datetime import datetime, timedelta

from django.utils import formats, timezone
from django.utils.translation import gettext as _
from django.utils.translation import gettext_noop

from pools.models import (
    REQUEST_TRANSITIONS,
    Pool,
    PoolRequest,
    PoolState,
    RequestKind,
    RequestState,
)
from pools.placement.reasons import Reason
from pools.selectors.ends import longest_duration, request_end
from pools.services.reclaims import call_off
from pools.services.transitions import record_event, transition
from portal.errors import Conflict, InvalidInput

END_SET = gettext_noop("the approver set the end to %(after)s (asked: %(before)s)")
EXTENDED = gettext_noop("the end moved from %(before)s to %(after)s (extension #%(request)s)")
POOL_ENDED = gettext_noop("pool #%(pool)s is no longer in use: there is nothing left to change")
NO_END = gettext_noop("no end")
CANCELLED = gettext_noop("was cancelled")
# The longest duration a request may give: ten years, past which an end date is a typing error.
LONGEST = timedelta(days=3650)


def when(moment: datetime | None) -> str:
    """A moment as pages and reasons show it, in the reader's time zone; "no end" for None."""
    if moment is None:
        return _(NO_END)
    return formats.date_format(timezone.localtime(moment), "Y-m-d H:i")


def check_end(tenant_id: int, *, end_at: datetime | None, hold_seconds: int | None, now: datetime) -> None:
    """Refuse an end a request of this tenant may not ask for: both a date and a duration, a date that is
    not in the future, a duration that is not a whole number of seconds above zero, or beyond the tenant's
    longest duration (and, where it sets one, no end at all)."""
    if end_at is not None and hold_seconds is not None:
        raise InvalidInput(_("Give an end date or a duration, not both."))
    if hold_seconds is not None and (
        not isinstance(hold_seconds, int) or isinstance(hold_seconds, bool) or hold_seconds <= 0
    ):
        raise InvalidInput(_("The duration is a whole number of hours above zero."))
    if end_at is not None and (end_at.tzinfo is None or end_at <= now):
        raise InvalidInput(_("The end date must be in the future."))
    life = (end_at - now) if end_at is not None else timedelta(seconds=hold_seconds or 0)
    if life > LONGEST:
        raise InvalidInput(_("A pool lives at most ten years; give an earlier end."))
    longest = longest_duration(tenant_id)
    if longest is None:
        return
    if end_at is None and hold_seconds is None:
        raise InvalidInput(
            _("This tenant requires an end for every pool, at most %(hours)s hours away.")
            % {"hours": int(longest.total_seconds() // 3600)}
        )
    if life > longest:
        raise InvalidInput(
            _("This tenant's pools live at most %(hours)s hours; give an end by %(latest)s.")
            % {"hours": int(longest.total_seconds() // 3600), "latest": when(now + longest)}
        )


def set_approved_end(request: PoolRequest, end_at: datetime | None, now: datetime) -> Reason | None:
    """The approver's end for a request being approved (its row locked): as asked (None), or sooner than
    asked and in the future; returns what the decision's event says of it, None when the end is as asked.
    For an extension, the end lies after the pool's present one. The caller saves the request."""
    if end_at is None:
        return None
    if end_at.tzinfo is None or end_at <= now:
        raise InvalidInput(_("The end date must be in the future."))
    asked = request_end(request, now)
    if asked is not None and end_at > asked:
        raise InvalidInput(
            _("An approver may shorten the end asked for (%(asked)s), not move it later.")
            % {"asked": when(asked)}
        )
    if request.kind == RequestKind.EXTENSION:
        pool = request.target_pool
        if pool.end_at is not None and end_at <= pool.end_at:
            raise InvalidInput(
                _("An extension ends after the pool's present end (%(end)s).") % {"end": when(pool.end_at)}
            )
    elif request.kind == RequestKind.RESIZE:
        raise InvalidInput(_("A resize has the end of its pool; extend the pool to change it."))
    request.end_at, request.hold_seconds = end_at, None
    return Reason(END_SET, after=when(end_at), before=when(asked))


def extend(request: PoolRequest, approver) -> Pool:
    """An approved extension (its row locked) moves its pool's end and is fulfilled; the reminders start
    again. Refused (Conflict) where the pool is no longer in use, or has ended, or ends later already."""
    pool = Pool.objects.select_for_update().select_related("project").get(pk=request.target_pool_id)
    now = timezone.now()
    if pool.state not in (PoolState.ACTIVE, PoolState.RECLAIMING):
        raise Conflict(_("Pool #%(id)s is no longer in use; there is nothing to extend.") % {"id": pool.pk})
    if pool.end_at is not None and pool.end_at <= now:
        raise Conflict(_("Pool #%(id)s has ended; it can no longer be extended.") % {"id": pool.pk})
    if pool.end_at is not None and request.end_at <= pool.end_at:
        raise Conflict(
            _("Pool #%(id)s ends at %(end)s already, no sooner than this extension.")
            % {"id": pool.pk, "end": when(pool.end_at)}
        )
    moved = Reason(EXTENDED, before=when(pool.end_at), after=when(request.end_at), request=request.pk)
    pool.end_at, pool.reminders_sent = request.end_at, []
    pool.save(update_fields=["end_at", "reminders_sent"])
    transition(request, RequestState.FULFILLED)
    request.save(update_fields=["state"])
    record_event(
        tenant_id=pool.project.tenant_id,
        action="pool.extended",
        request=request,
        pool=pool,
        actor=approver,
        from_state=pool.state,
        to_state=pool.state,
        reason=str(moved),
        reason_data=moved.as_data(),
    )
    return pool


def cancel_changes(pool: Pool) -> list[int]:
    """Cancel the extensions and resizes of `pool` still undecided or waiting, in the caller's transaction
    (the pool is being released); returns their ids."""
    pending = list(
        PoolRequest.objects.select_for_update()
        .select_related("project")
        .filter(target_pool=pool)
        .exclude(state__in=[s for s, moves in REQUEST_TRANSITIONS.items() if not moves])
    )
    for request in pending:
        cancel_by_portal(request, Reason(POOL_ENDED, pool=pool.pk))
    return [request.pk for request in pending]


def cancel_by_portal(request: PoolRequest, reason: Reason) -> None:
    """Cancel a request (its row locked) that can no longer be done, saying why; any reclaim for it is
    called off."""
    transition(request, RequestState.CANCELLED, reason=str(reason), reason_data=reason.as_data())
    request.waiting_reason, request.waiting_reason_data = "", None
    request.save(update_fields=["state", "waiting_reason", "waiting_reason_data"])
    call_off(request, CANCELLED)
