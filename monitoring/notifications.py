"""Telling people about alerts: one e-mail per address and one JSON POST per webhook, for each alert firing
and each alert resolving, sent once and retried until sent or given up.

Who: the members of the operator group with an e-mail address who have not turned the topic
`EMAIL_TOPIC` off, the rule's extra addresses, the portal's webhook (MONITORING_ALERT_WEBHOOK_URL) and the
rule's own. The recipients are fixed when the event is recorded (in the transaction that fires or resolves
the alert), one `AlertDelivery` row each, which a unique constraint keeps to one per (alert, event,
channel, target).

Sending: `deliver_due` takes one due row at a time under a row lock that concurrent runs skip, sends it,
and records the outcome in the same transaction: sent, or the error and the next attempt, after
MONITORING_ALERT_RETRY_SECONDS doubled at each failure (capped at MONITORING_ALERT_RETRY_MAX_SECONDS),
until MONITORING_ALERT_MAX_ATTEMPTS attempts have failed. Any failure counts against its own row alone
(an unreachable server, a webhook address the portal refuses, a message the mail library will not build):
the rows behind it go out all the same. A worker killed between sending and committing leaves the row
unsent, so that one may go twice; no other case does.

Webhooks are posted only to addresses the portal may send requests to (portal/outbound.py), checked again
at each attempt, and a redirect is a failure, never followed.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from datetime import datetime, timedelta

import requests
from django.conf import settings
from django.contrib.auth import get_user_model
from django.core.mail import EmailMessage
from django.db import transaction
from django.template.loader import render_to_string
from django.urls import reverse
from django.utils import timezone, translation

from monitoring.apps import EMAIL_TOPIC
from monitoring.models import Alert, AlertDelivery
from portal import mail, outbound
from portal.models import Preferences
from portal.roles import PlatformRole

Channel = AlertDelivery.Channel
log = logging.getLogger(__name__)


def operator_addresses() -> list[str]:
    """The operators who want alert e-mails, by address."""
    operators = (
        get_user_model()
        .objects.filter(groups__name=PlatformRole.OPERATOR, is_active=True)
        .exclude(email="")
        .order_by("pk")
        .distinct()
    )
    return [user.email for user in operators if Preferences.wants_email(user, EMAIL_TOPIC)]


def _unique(items: list[str]) -> list[str]:
    return list(dict.fromkeys(item for item in items if item))


def record(alert: Alert, event: str, *, operators: list[str], now: datetime) -> int:
    """The deliveries of one event of `alert`, due now; returns how many were new."""
    rule = alert.rule
    emails = _unique([*operators, *rule.email_addresses()])
    hooks = _unique([settings.MONITORING_ALERT_WEBHOOK_URL, rule.webhook_url])
    targets = [(Channel.EMAIL, address) for address in emails] + [(Channel.WEBHOOK, url) for url in hooks]
    recorded = set(AlertDelivery.objects.filter(alert=alert, event=event).values_list("channel", "target"))
    rows = [
        AlertDelivery(alert=alert, event=event, channel=channel, target=target, next_attempt_at=now)
        for channel, target in targets
        if (channel, target) not in recorded
    ]
    AlertDelivery.objects.bulk_create(rows, ignore_conflicts=True)  # the constraint has the last word
    return len(rows)


# --- sending -------------------------------------------------------------------------------------


def alert_url(alert: Alert) -> str:
    return settings.PORTAL_BASE_URL + reverse("monitoring-alert", kwargs={"pk": alert.pk})


def payload(alert: Alert, event: str) -> dict:
    """The webhook's JSON body."""
    return {
        "id": alert.pk,
        "rule": alert.rule.name,
        "kind": alert.rule.kind,
        "severity": alert.severity,
        "state": event,
        "subject": alert.subject,
        "where": alert.where,
        "message": alert.message,
        "value": alert.value,
        "fired_at": alert.fired_at.isoformat(),
        "resolved_at": alert.resolved_at.isoformat() if alert.resolved_at else None,
        "url": alert_url(alert),
    }


def _email(delivery: AlertDelivery) -> None:
    alert = delivery.alert
    context = {"alert": alert, "event": delivery.event, "link": alert_url(alert)}
    (language,) = mail.by_language([delivery.target])
    with translation.override(language):
        subject = render_to_string("monitoring/email/alert_subject.txt", context).strip()
        body = render_to_string("monitoring/email/alert_message.txt", context)
    EmailMessage(settings.EMAIL_SUBJECT_PREFIX + subject, body, to=[delivery.target]).send()


def _webhook(delivery: AlertDelivery) -> None:
    with outbound.Session() as session:
        response = session.post(
            delivery.target,
            json=payload(delivery.alert, delivery.event),
            timeout=settings.MONITORING_ALERT_WEBHOOK_TIMEOUT_SECONDS,
        )
    if not 200 <= response.status_code < 300:
        raise requests.HTTPError(f"HTTP {response.status_code} {response.reason}", response=response)


SENDERS = {Channel.EMAIL: _email, Channel.WEBHOOK: _webhook}


def retry_delay(attempts: int) -> timedelta:
    """How long to wait after the `attempts`-th failed attempt."""
    seconds = settings.MONITORING_ALERT_RETRY_SECONDS * 2 ** min(attempts - 1, 30)
    return timedelta(seconds=min(seconds, settings.MONITORING_ALERT_RETRY_MAX_SECONDS))


def _failure(error: Exception) -> str:
    """The failure in one line: the server's or the network's words, else the error's kind and words."""
    if isinstance(error, OSError):  # requests' errors among them
        return str(error) or type(error).__name__
    if isinstance(error, outbound.AddressRefused):
        return error.message
    log.warning("alert notification failed", exc_info=error)
    return f"{type(error).__name__}: {error}"


@dataclass
class Delivered:
    sent: int = 0
    failed: int = 0
    gave_up: int = 0

    def summary(self) -> str:
        return f"{self.sent} sent, {self.failed} failed (to retry), {self.gave_up} given up"


def deliver_due(*, now: datetime | None = None, limit: int = 500) -> Delivered:
    """Send the notifications that are due, one transaction each; safe to run concurrently."""
    result = Delivered()
    for _attempt in range(limit):
        moment = now or timezone.now()
        with transaction.atomic():
            delivery = (
                AlertDelivery.objects.select_for_update(skip_locked=True, of=("self",))
                .select_related("alert__rule", "alert__gpu__node__cluster", "alert__node__cluster")
                .select_related("alert__pool", "alert__agent_token__cluster")
                .filter(sent_at__isnull=True, gave_up_at__isnull=True, next_attempt_at__lte=moment)
                .order_by("next_attempt_at", "pk")
                .first()
            )
            if delivery is None:
                break
            delivery.attempts += 1
            try:
                with transaction.atomic():  # what a failed send did to the database is undone, alone
                    SENDERS[delivery.channel](delivery)
            except Exception as error:  # any failure is this delivery's, never the whole queue's
                delivery.last_error = _failure(error)[:1000]
                if delivery.attempts >= settings.MONITORING_ALERT_MAX_ATTEMPTS:
                    delivery.gave_up_at = moment
                    delivery.next_attempt_at = None
                    result.gave_up += 1
                else:
                    delivery.next_attempt_at = moment + retry_delay(delivery.attempts)
                    result.failed += 1
            else:
                delivery.sent_at = moment
                delivery.next_attempt_at = None
                result.sent += 1
            delivery.save(
                update_fields=["attempts", "last_error", "next_attempt_at", "sent_at", "gave_up_at"]
            )
    return result
