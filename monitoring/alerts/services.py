"""Alerts: each enabled rule checked against storage, alerts fired and resolved once, acknowledged by hand.

Policy. `evaluate` runs in beat every minute and may run twice at once (a slow run and the next tick):
- A rule's check (monitoring/alerts/rules.py) says, in SQL over samples, newest figures and events, which
  subjects its condition holds for and which open alerts it is over for.
- A subject with no open alert of the rule gets one: the database allows one open alert per (rule,
  subject), so of two runs that find it at once, one inserts and the other's insert fails and is skipped.
  The alert's `fired` notifications are recorded in the same transaction, so they exist exactly when it does.
- An open alert whose condition is over is resolved by an UPDATE that only a still-open row matches, so
  one run resolves it and records its `resolved` notifications; a later return of the condition is a new
  alert. The alerts of a rule turned off resolve at the next run.
- Acknowledging says someone is on it: the alert stays open until its condition is over. Acknowledging
  twice changes nothing; a resolved alert is past acknowledging.
- A GPU fault nobody has been told of is told in the evaluation after it (sent for when it opens): with the
  alert its event fires, when an XID or ECC rule fires one, else alone once the rules are checked
  (monitoring/notifications/recording.py), so that each person gets one e-mail of the event.
Notifications are sent by their own task (monitoring/notifications/sending.py), queued once evaluation
commits.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from django.db import IntegrityError, connection, transaction
from django.utils import timezone
from django.utils.translation import gettext as _

from monitoring.alerts.rules import CHECKS, Finding, Verdict
from monitoring.models import Alert, AlertRule, Delivery
from monitoring.models.alerts import Severity
from monitoring.notifications import recording
from monitoring.task_names import DELIVER_NOTIFICATIONS
from portal import dispatch
from portal.errors import Conflict


@dataclass
class Evaluation:
    rules: int = 0
    fired: int = 0
    resolved: int = 0
    faults: int = 0  # told alone, with no alert fired with them
    notifications: int = 0

    def summary(self) -> str:
        return (
            f"{self.rules} rules: {self.fired} fired, {self.resolved} resolved, {self.faults} faults told, "
            f"{self.notifications} notifications queued"
        )


def evaluate(*, now: datetime | None = None) -> Evaluation:
    """Check every rule once (enabled ones; a disabled one's open alerts resolve), and tell of the faults
    nobody has been told of."""
    now = now or timezone.now()
    result = Evaluation()
    untold = recording.untold_faults()  # before any rule is checked: see recording's words
    operators = recording.operator_addresses()  # once per run, not per alert
    for rule in AlertRule.objects.order_by("pk"):
        with transaction.atomic():
            open_alerts = {alert.subject: alert for alert in rule.alerts.open()}
            if rule.enabled:
                verdict = CHECKS[rule.kind](rule, now=now, open=open_alerts)
            else:
                verdict = Verdict(cleared=set(open_alerts))
            fired, kept = _fire(rule, verdict.findings, open_alerts, now=now)
            resolved = _resolve(verdict.cleared - kept, open_alerts, now=now)
            for alert in fired:
                result.notifications += recording.record(
                    alert, Delivery.Event.FIRED, operators=operators, now=now
                )
            for alert in resolved:
                result.notifications += recording.record(
                    alert, Delivery.Event.RESOLVED, operators=operators, now=now
                )
        result.rules += rule.enabled
        result.fired += len(fired)
        result.resolved += len(resolved)
    for fault_id in untold:  # those no alert of this run was told with
        with transaction.atomic():
            told = recording.record_fault(fault_id, now=now)
        result.faults += told > 0
        result.notifications += told
    if result.notifications:
        dispatch.after_commit(DELIVER_NOTIFICATIONS)
    return result


def _fire(
    rule: AlertRule, findings: list[Finding], open_alerts: dict[str, Alert], *, now: datetime
) -> tuple[list[Alert], set[str]]:
    """New alerts for the findings that have none open; the open ones learn the newest value. Returns the
    alerts fired and the subjects whose condition holds."""
    fired, seen = [], []
    for finding in findings:
        severity = finding.severity or rule.severity
        alert = open_alerts.get(finding.subject)
        if alert is not None:
            alert.last_seen_at = max(alert.last_seen_at, finding.seen_at)
            alert.value = finding.value
            if severity == Severity.CRITICAL:
                alert.severity = severity  # a fatal XID after a harmless one makes the alert critical
            seen.append(alert)
            continue
        try:
            with transaction.atomic():  # a savepoint: a twin run's alert must not undo this run's others
                fired.append(
                    Alert.objects.create(
                        rule=rule,
                        subject=finding.subject,
                        gpu_id=finding.gpu_id,
                        slot=finding.slot,
                        node_id=finding.node_id,
                        pool_id=finding.pool_id,
                        agent_token_id=finding.agent_token_id,
                        message=finding.message[:500],
                        value=finding.value,
                        severity=severity,
                        fired_at=now,
                        last_seen_at=finding.seen_at,
                        condition_since=finding.since,
                    )
                )
        except IntegrityError:
            continue  # another evaluation fired it first
    if seen:
        Alert.objects.bulk_update(seen, ["last_seen_at", "value", "severity"])
    return fired, {finding.subject for finding in findings}


def _resolve(subjects: set[str], open_alerts: dict[str, Alert], *, now: datetime) -> list[Alert]:
    ids = [open_alerts[subject].pk for subject in subjects if subject in open_alerts]
    if not ids:
        return []
    with connection.cursor() as cursor:
        # Only a row still open matches: of two runs resolving one alert, one gets it back.
        cursor.execute(
            "UPDATE monitoring_alert SET resolved_at = GREATEST(%s, fired_at) "
            "WHERE id = ANY(%s) AND resolved_at IS NULL RETURNING id",
            [now, ids],
        )
        resolved = [pk for (pk,) in cursor.fetchall()]
    return list(Alert.objects.filter(pk__in=resolved).select_related("rule"))


def acknowledge(*, alert: Alert, user) -> Alert:
    """Someone is on it. Harmless when done already; refused once the alert has resolved."""
    with transaction.atomic():
        locked = Alert.objects.select_for_update().get(pk=alert.pk)
        if locked.resolved_at is not None:
            raise Conflict(
                _("This alert resolved at %(at)s; there is nothing left to acknowledge.")
                % {"at": timezone.localtime(locked.resolved_at).strftime("%Y-%m-%d %H:%M:%S")}
            )
        if locked.acknowledged_at is None:
            locked.acknowledged_at = timezone.now()
            locked.acknowledged_by = user
            locked.save(update_fields=["acknowledged_at", "acknowledged_by"])
    return locked
