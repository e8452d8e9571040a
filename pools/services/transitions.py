"""The one transition helper: a request or a pool changes state only here.

The move is checked against the subject's transition table (REQUEST_TRANSITIONS,
POOL_TRANSITIONS), recorded as a PoolEvent (who, when, from, to, why) with its audit entry and, for the
states people hear about, its e-mail is queued after commit. The caller saves the
subject's new state in the same transaction.
"""

from __future__ import annotations

from django.utils.translation import gettext as _

from pools.models import (
    POOL_TRANSITIONS,
    REQUEST_TRANSITIONS,
    Pool,
    PoolEvent,
    PoolRequest,
    PoolState,
    RequestState,
)
from pools.notifications import notify_after_commit
from pools.placement.reasons import Reason
from portal import audit
from portal.errors import Conflict


def record_event(*, tenant_id: int, action: str = "", **fields) -> PoolEvent:
    """Write a request's or a pool's event and its audit entry, in the caller's transaction."""
    event = PoolEvent.objects.create(**fields)
    audit.record_pool_event(event, tenant_id=tenant_id, action=action)
    return event


def transition(
    subject: PoolRequest | Pool, to: str, *, actor=None, reason: str = "", reason_data: dict | None = None
) -> None:
    """Move a request or pool to state `to`, writing its event. A `reason` that is a `Reason` keeps its
    template and values as the event's `reason_data` too, for each reader's language."""
    if reason_data is None and isinstance(reason, Reason):
        reason_data = reason.as_data()
    if isinstance(subject, Pool):
        allowed, states, request_id, pool = POOL_TRANSITIONS, PoolState, subject.request_id, subject
        refusal = _("Pool #%(id)s is %(state)s; it cannot become %(to)s.")
    else:
        allowed, states, request_id, pool = REQUEST_TRANSITIONS, RequestState, subject.pk, None
        refusal = _("Request #%(id)s is %(state)s; it cannot become %(to)s.")
    if to not in allowed[subject.state]:
        raise Conflict(
            refusal % {"id": subject.pk, "state": states(subject.state).label, "to": states(to).label}
        )
    event = record_event(
        tenant_id=subject.project.tenant_id,
        request_id=request_id,
        pool=pool,
        actor=actor,
        from_state=subject.state,
        to_state=to,
        reason=reason,
        reason_data=reason_data,
    )
    notify_after_commit(event)
    subject.state = to
