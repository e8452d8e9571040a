"""E-mails to tenants about their requests and pools, one per event that matters to them.

An event that a person should hear about (approved, rejected, active, failed, released) is e-mailed to who
asked, unless they turned these e-mails off (the topic `EMAIL_TOPIC` of the notification settings), in their
language. The shell's `portal.mail.send_once` sends it once per event and address, so a redelivered task
sends nothing twice.
"""

from __future__ import annotations

from django.urls import reverse
from django.utils.translation import gettext_noop

from pools import task_names
from pools.apps import EMAIL_TOPIC
from pools.conf import settings
from pools.models import PoolEvent, PoolState, RequestState
from portal import dispatch, mail
from portal.models import Preferences

# A pool's reminder of its end: an event with no change of state, e-mailed as the states below are.
END_REMINDER = gettext_noop("ends on %(at)s: ask for an extension before then to keep it")

NOTIFIED = {
    RequestState.APPROVED,
    RequestState.REJECTED,
    PoolState.ACTIVE,
    PoolState.RECLAIMING,
    PoolState.FAILED,
    PoolState.RELEASED,
}


def notify_after_commit(event: PoolEvent) -> None:
    """Queue the e-mail of an event, if it is one people hear about, once the event is committed."""
    if event.to_state in NOTIFIED and event.from_state != event.to_state:
        dispatch.after_commit(task_names.EVENT_EMAIL, event.pk)


def _template(event: PoolEvent) -> str:
    """The e-mail of an event: one per state it comes to, and its own for a reclaim called off."""
    if event.from_state == PoolState.RECLAIMING and event.to_state == PoolState.ACTIVE:
        return "reclaim_called_off"
    if (event.reason_data or {}).get("template") == END_REMINDER:
        return "end_reminder"
    return event.to_state


def send_event_email(event_id: int) -> str:
    """E-mail who asked about the event, unless they do not want it or were told already; what happened."""
    event = (
        PoolEvent.objects.select_related("request__project__tenant", "request__submitted_by", "pool")
        .filter(pk=event_id)
        .first()
    )
    if event is None:
        return "gone"
    request = event.request
    person = request.submitted_by
    if not person.email or not Preferences.wants_email(person, EMAIL_TOPIC):
        return "not wanted"
    tenant = request.project.tenant.slug
    link = (
        reverse("pool", kwargs={"tenant_slug": tenant, "pk": event.pool_id})
        if event.pool_id
        else reverse("pool-request", kwargs={"tenant_slug": tenant, "pk": request.pk})
    )
    sent = mail.send_once(
        key=f"pools.event:{event.pk}",
        to=[person.email],
        template=f"pools/email/{_template(event)}",
        context={
            "event": event,
            "request": request,
            "pool": event.pool,
            "link": settings.PORTAL_BASE_URL + link,
            "requeue": settings.RECLAIM_REQUEUE,
        },
        language=mail.language_of(person),
    )
    return "sent" if sent else "already sent"
