"""Alerts as the pages list them: newest first, with the rows that say what each is about."""

from __future__ import annotations

from django.db.models import QuerySet

from monitoring.models import Alert

SUBJECT_ROWS = (
    "rule",
    "gpu__node__cluster",
    "node__cluster",
    "pool",
    "agent_token__cluster",
    "acknowledged_by",
)


def listed(*, state: str = "", severity: str = "") -> QuerySet[Alert]:
    """Alerts newest first, with what their pages show of them, in a state (open: not acknowledged) and of a
    severity when given."""
    found = Alert.objects.select_related(*SUBJECT_ROWS).order_by("-fired_at", "-pk")
    if state == Alert.State.OPEN:
        found = found.filter(resolved_at__isnull=True, acknowledged_at__isnull=True)
    elif state == Alert.State.ACKNOWLEDGED:
        found = found.filter(resolved_at__isnull=True, acknowledged_at__isnull=False)
    elif state == Alert.State.RESOLVED:
        found = found.filter(resolved_at__isnull=False)
    if severity:
        found = found.filter(severity=severity)
    return found
