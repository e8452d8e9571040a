"""Celery tasks of the portal app: thin, idempotent wrappers."""

from __future__ import annotations

import logging

from celery import shared_task
from django.conf import settings
from django.contrib.sessions.models import Session
from django.db import transaction
from django.urls import reverse
from django.utils import timezone

from portal import mail
from portal.models import Invitation
from portal.services import INVITATION_EMAIL

log = logging.getLogger(__name__)


@shared_task(
    name=INVITATION_EMAIL, autoretry_for=(OSError,), retry_backoff=True, retry_backoff_max=600, max_retries=8
)
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
        accept = reverse("invitation", kwargs={"token": invitation.token})
        mail.send_once(
            key=f"portal.invitation:{invitation.pk}",
            to=[invitation.email],
            template="portal/email/invitation",
            context={"invitation": invitation, "accept_url": settings.PORTAL_BASE_URL + accept},
            # The invitee has no account yet: they are written to in the language of who invited them.
            language=mail.language_of(invitation.invited_by),
        )
        invitation.sent_at = timezone.now()  # shown in the admin
        invitation.save(update_fields=["sent_at"])
    log.info("invitation %s sent to %s", invitation_id, invitation.email)
    return "sent"


@shared_task
def clear_expired_sessions() -> int:
    deleted, _ = Session.objects.filter(expire_date__lt=timezone.now()).delete()
    return deleted
