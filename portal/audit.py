"""The audit trail: one `AuditEntry` per change staff account for, written by `record` alone.

- action: a short stable code, `<family>.<what>` — `request.approved`, `pool.active`, `gpu.drained`,
  `price.changed`, `invoice.issued`. The family (before the dot) is what the page filters by as a whole.
- actor: who did it; None when the portal itself acted (the queue, provisioning, a fault).
- summary: a template and its values, kept so that each reader sees the sentence in their language. A value
  is plain text, a number, or itself a `{"template": ..., "params": ...}`; `%(text)s` templates carry
  text people typed (a reason), which is never translated.

The apps call `record` from their services, inside the transaction of the change, so that a change made
through a page, the API, the admin or a task is recorded alike and a change rolled back leaves no entry.
This module imports no app: what it knows of theirs comes in as plain values.
"""

from __future__ import annotations

from datetime import datetime

from django.utils import timezone
from django.utils.translation import gettext, gettext_noop

from portal.models import AuditEntry

TEXT = "%(text)s"  # a value people typed: shown as it is, in every language


def text(value: str) -> dict:
    """A value people typed (a reason), kept apart from the templates so that it is never translated."""
    return {"template": TEXT, "params": {"text": value}}


def term(word: str) -> dict:
    """A word of the catalogue (a state such as "approved"), translated where it is shown."""
    return {"template": word, "params": {}}


def _render(data, translate) -> str:
    if isinstance(data, dict) and "template" in data:
        values = {key: _render(value, translate) for key, value in (data.get("params") or {}).items()}
        template = data["template"]
        template = template if template == TEXT else translate(template)
        return template % values if values else template
    if isinstance(data, list):
        return "; ".join(_render(item, translate) for item in data)
    return data if isinstance(data, str | int | float) else str(data)


def english(data: dict) -> str:
    """A summary as stored for searching: in English, as its templates are written."""
    return _render(data, str)


def render_data(data) -> str:
    """A stored template and its values (an audit summary, a waiting reason) in the language of the current
    request; plain text stays as it is."""
    return _render(data, gettext)


def render(entry: AuditEntry) -> str:
    """An entry's summary in the language of the current request."""
    return _render(entry.summary_data, gettext) if entry.summary_data else entry.summary


def _user(actor):
    return actor if getattr(actor, "is_authenticated", False) else None


def record(
    action: str,
    *,
    summary: str,
    values: dict | None = None,
    actor=None,
    tenant_id: int | None = None,
    subject: tuple[str, object] = ("", ""),
    details: dict | None = None,
    at: datetime | None = None,
) -> AuditEntry:
    """Write one entry. `summary` is a template marked with `gettext_noop`, `values` its values."""
    data = {"template": summary, "params": values or {}}
    kind, pk = subject
    return AuditEntry.objects.create(
        at=at or timezone.now(),
        actor=_user(actor),
        action=action,
        tenant_id=tenant_id,
        subject_kind=kind,
        subject_id="" if pk is None else str(pk),
        summary=english(data),
        summary_data=data,
        details=details or {},
    )


# --- events of requests and pools ----------------------------------------------------------------------

REQUEST_CHANGED = gettext_noop("Request #%(request)s: %(to)s")
POOL_CHANGED = gettext_noop("Pool #%(pool)s of request #%(request)s: %(to)s")
REQUEST_NOTED = gettext_noop("Request #%(request)s: %(reason)s")
POOL_NOTED = gettext_noop("Pool #%(pool)s of request #%(request)s: %(reason)s")
WITH_REASON = gettext_noop("%(what)s (%(reason)s)")


def pool_event_entry(
    *,
    event_id: int,
    request_id: int,
    pool_id: int | None,
    from_state: str,
    to_state: str,
    reason: str,
    reason_data: dict | None,
    action: str = "",
) -> dict:
    """What an entry says of a request's or a pool's event (its fields as plain values): used as an event
    is written and to fill the trail from the events written before it existed.

    A change of state is `request.<state>` or `pool.<state>`; an event that keeps the state is a note on
    the subject (a new priority, a move), named by `action` or, for older events, `request.noted` /
    `pool.noted`."""
    family, subject = ("pool", pool_id) if pool_id else ("request", request_id)
    why = reason_data if reason_data else (text(reason) if reason else None)
    values = {"request": request_id, "pool": pool_id} if pool_id else {"request": request_id}
    if from_state != to_state:
        values["to"] = term(to_state)
        summary = POOL_CHANGED if pool_id else REQUEST_CHANGED
        if why is not None:
            values = {"what": {"template": summary, "params": values}, "reason": why}
            summary = WITH_REASON
        action = action or f"{family}.{to_state}"
    else:
        values["reason"] = why or ""
        summary = POOL_NOTED if pool_id else REQUEST_NOTED
        action = action or f"{family}.noted"
    details = {"event": event_id, "request": request_id, "from": from_state, "to": to_state}
    if pool_id:
        details["pool"] = pool_id
    return {
        "action": action,
        "summary": summary,
        "values": values,
        "subject": (family, subject),
        "details": details,
    }


def record_pool_event(event, *, tenant_id: int | None, action: str = "") -> AuditEntry:
    """The entry of a `pools.PoolEvent` just written, in its transaction."""
    fields = pool_event_entry(
        event_id=event.pk,
        request_id=event.request_id,
        pool_id=event.pool_id,
        from_state=event.from_state,
        to_state=event.to_state,
        reason=event.reason,
        reason_data=event.reason_data,
        action=action,
    )
    return record(**fields, actor=event.actor, tenant_id=tenant_id, at=event.at)
