"""Celery tasks of the portal app: thin, idempotent wrappers."""

from __future__ import annotations

import logging

from celery import shared_task
from django.conf import settings
from django.contrib.sessions.models import Session
from django.core.mail import EmailMultiAlternatives
from django.db import transaction
from django.template.loader import render_to_string
from django.urls import reverse
from django.utils import timezone, translation

from portal import mail
from portal.models import Invitation

log = logging.getLogger(__name__)


@shared_task(autoretry_for=(OSError,), retry_backoff=True, retry_backoff_max=600, max_retries=8)
def send_invitation(invitation_id: int) -> str:
    """E-mail an invitation once; a redelivered or duplicated task finds it sent and stops."""
    with transaction.atomic():
        invitation = (
            Invitation.objects.select_for_update(of=("self",))
            .select_related("tenant", "invited_by")
            .filter(pk=invitation_id)
            .first()
        )
        if invitation is None or not invitation.is_pending:
            return "skipped"
        if invitation.sent_at is not None:
            return "already sent"
        context = {
            "invitation": invitation,
            "accept_url": settings.PORTAL_BASE_URL
            + reverse("invitation", kwargs={"token": invitation.token}),
        }
        # The invitee has no account yet: they are written to in the language of who invited them.
        with translation.override(mail.language_of(invitation.invited_by)):
            subject = render_to_string("portal/email/invitation_subject.txt", context).strip()
            body = render_to_string("portal/email/invitation_message.txt", context)
        message = EmailMultiAlternatives(
            subject=settings.EMAIL_SUBJECT_PREFIX + subject, body=body, to=[invitation.email]
        )
        message.send()
        invitation.sent_at = timezone.now()
        invitation.save(update_fields=["sent_at"])
    log.info("invitation %s sent to %s", invitation_id, invitation.email)
    return "sent"


@shared_task
def clear_expired_sessions() -> int:
    deleted, _ = Session.objects.filter(expire_date__lt=timezone.now()).delete()
    return deleted
