"""Sending notifications: each `Delivery` row once, retried until sent or given up; an e-mail per address
(about an alert's event, a GPU fault, or both, or to a pool's people about its idle spell) and a JSON POST
per webhook.

`deliver_due` takes one due row at a time under a row lock that concurrent runs skip, sends it, and records
the outcome in the same transaction: sent, or the error and the next attempt, after
MONITORING_ALERT_RETRY_SECONDS doubled at each failure (capped at MONITORING_ALERT_RETRY_MAX_SECONDS),
until MONITORING_ALERT_MAX_ATTEMPTS attempts have failed. Any failure counts against its own row alone
(an unreachable server, a webhook address the portal refuses, a message the mail library will not build):
the rows behind it go out all the same. E-mails go through `portal.mail.send_once`, once per subject and
address; a worker killed between sending and committing leaves the row unsent, so that one may go twice;
no other case does.

Webhooks are posted only to addresses the portal may send requests to (portal/outbound.py), checked again
at each attempt, and a redirect is a failure, never followed.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from datetime import datetime, timedelta

import requests
from django.db import transaction
from django.urls import reverse
from django.utils import timezone
from django.utils.functional import lazy

from monitoring.conf import settings
from monitoring.faults.audience import describe
from monitoring.models import Alert, Delivery
from monitoring.selectors import idle
from pools.models import Pool
from portal import mail, outbound

Channel = Delivery.Channel
log = logging.getLogger(__name__)


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


def _fault_context(delivery: Delivery) -> dict:
    """What a fault's e-mail says: the fault, the pools this person hears of, and the alert fired with it."""
    fault = delivery.fault
    pools = Pool.objects.filter(pk__in=delivery.fault_pools).select_related("project__tenant").order_by("pk")
    base = settings.PORTAL_BASE_URL
    return {
        "alert": delivery.alert,
        "alert_link": alert_url(delivery.alert) if delivery.alert else "",
        "fault": fault,
        "gpu": fault.gpu,
        # Put in words in each recipient's language, as the e-mail is written.
        "what": lazy(describe, str)(fault),
        "as_approver": delivery.as_approver,
        "pools": [
            {
                "pool": pool,
                "tenant": pool.project.tenant,
                "project": pool.project,
                "link": _pool_link(pool),
            }
            for pool in pools
        ],
        "pool_ids": ", ".join(f"#{pool.pk}" for pool in pools),
        "faults_link": base + reverse("monitoring-faults"),
    }


def _pool_link(pool: Pool) -> str:
    return settings.PORTAL_BASE_URL + reverse(
        "pool", kwargs={"tenant_slug": pool.project.tenant.slug, "pk": pool.pk}
    )


def _idle_context(delivery: Delivery, *, now: datetime) -> dict:
    """What the e-mail of an idle spell says to the pool's people: the pool, its page, and the spell's figures
    as its page shows them, up to now (or to the spell's end, where it ended before this was sent)."""
    alert = delivery.alert
    pool = Pool.objects.select_related("project__tenant").prefetch_related("items").get(pk=alert.pool_id)
    alert.pool = pool
    return {
        "pool": pool,
        "project": pool.project,
        "tenant": pool.project.tenant,
        "level": f"{alert.rule.threshold:g}",
        "spell": idle.spell_of(alert, now=now),
        "link": _pool_link(pool),
        "settings_link": settings.PORTAL_BASE_URL + reverse("preferences"),
    }


def _email(delivery: Delivery, *, now: datetime) -> None:
    if delivery.event == Delivery.Event.IDLE:
        key, template, context = (
            f"monitoring.idle:{delivery.alert_id}",
            "monitoring/email/idle_pool",
            _idle_context(delivery, now=now),
        )
    elif delivery.fault_id is not None:
        key, template, context = (
            f"monitoring.fault:{delivery.fault_id}",
            "monitoring/email/fault",
            _fault_context(delivery),
        )
    else:
        alert = delivery.alert
        key, template, context = (
            f"monitoring.alert:{alert.pk}:{delivery.event}",
            "monitoring/email/alert",
            {"alert": alert, "event": delivery.event, "link": alert_url(alert)},
        )
    mail.send_once(key=key, to=[delivery.target], template=template, context=context)


def _webhook(delivery: Delivery, *, now: datetime) -> None:
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
    if isinstance(error, OSError):  # requests' and smtplib's errors among them
        return str(error) or type(error).__name__
    if isinstance(error, outbound.AddressRefused):
        return error.message
    log.warning("notification failed", exc_info=error)
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
                Delivery.objects.select_for_update(skip_locked=True, of=("self",))
                .select_related("alert__rule", "alert__gpu__node__cluster", "alert__node__cluster")
                .select_related("alert__pool", "alert__agent_token__cluster", "fault__gpu__node__cluster")
                .filter(sent_at__isnull=True, gave_up_at__isnull=True, next_attempt_at__lte=moment)
                .order_by("next_attempt_at", "pk")
                .first()
            )
            if delivery is None:
                break
            delivery.attempts += 1
            try:
                with transaction.atomic():  # what a failed send did to the database is undone, alone
                    SENDERS[delivery.channel](delivery, now=moment)
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
