"""E-mails to tenants about their requests and pools, one per event that matters to them.

An event that a person should hear about (approved, rejected, active, failed, released)
is e-mailed to who asked, unless they turned these e-mails off
(the topic `EMAIL_TOPIC` of the notification settings). The Celery task marks the
event as e-mailed in the same transaction, so a redelivered task sends nothing twice.
"""

from __future__ import annotations

from django.conf import settings
from django.core.mail import EmailMultiAlternatives
from django.db import transaction
from django.template.loader import render_to_string
from django.urls import reverse
from django.utils import timezone, translation

from pools.apps import EMAIL_TOPIC
from pools.models import PoolEvent, PoolState, RequestState
from pools.services import dispatch
from portal import mail
from portal.models import Preferences

NOTIFIED = {
    RequestState.APPROVED,
    RequestState.REJECTED,
    PoolState.ACTIVE,
    PoolState.FAILED,
    PoolState.RELEASED,
}


def notify_after_commit(event: PoolEvent) -> None:
    """Queue the e-mail of an event, if it is one people hear about, once the event is committed."""
    if event.to_state in NOTIFIED and event.from_state != event.to_state:
        dispatch.after_commit(dispatch.EVENT_EMAIL, event.pk)


def send_event_email(event_id: int) -> str:
    with transaction.atomic():
        event = (
            PoolEvent.objects.select_for_update(of=("self",))
            .select_related("request__project__tenant", "request__submitted_by", "pool")
            .filter(pk=event_id)
            .first()
        )
        if event is None or event.emailed_at is not None:
            return "already sent"
        request = event.request
        person = request.submitted_by
        if not person.email or not Preferences.wants_email(person, EMAIL_TOPIC):
            event.emailed_at = timezone.now()  # nothing to send, ever
            event.save(update_fields=["emailed_at"])
            return "not wanted"
        tenant = request.project.tenant.slug
        link = (
            reverse("pool", kwargs={"tenant_slug": tenant, "pk": event.pool_id})
            if event.pool_id
            else reverse("pool-request", kwargs={"tenant_slug": tenant, "pk": request.pk})
        )
        context = {
            "event": event,
            "request": request,
            "pool": event.pool,
            "link": settings.PORTAL_BASE_URL + link,
        }
        with translation.override(mail.language_of(person)):
            subject = render_to_string(f"pools/email/{event.to_state}_subject.txt", context).strip()
            body = render_to_string(f"pools/email/{event.to_state}_message.txt", context)
        EmailMultiAlternatives(settings.EMAIL_SUBJECT_PREFIX + subject, body, to=[person.email]).send()
        event.emailed_at = timezone.now()
        event.save(update_fields=["emailed_at"])
    return "sent"
