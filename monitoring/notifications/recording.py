"""Who hears of what: the notifications of an alert's event and of a GPU fault, one `Delivery` row per
channel and target, due at once. `monitoring.notifications.sending` sends them.

Who:
- an alert firing or resolving: the members of the operator group with an e-mail address who keep the topic
  EMAIL_TOPIC on, the rule's extra addresses (by e-mail), the portal's webhook
  (MONITORING_ALERT_WEBHOOK_URL) and the rule's own;
- a GPU fault: its audience (monitoring/faults/audience.py), by e-mail;
- an idle pool's alert firing: besides the above, the pool's own people, once per idle spell
  (monitoring/notifications/idle.py), by e-mail;
- both at once when an XID or ECC alert fires on a GPU whose fault nobody has been told of yet: the alert
  its fatal event fired. Each person then gets one e-mail for the two, saying what fired and which pools
  it affects: the row of the alert's event and of the fault.

When: a fault waits for the alert evaluation after it (sent for when the fault opens), which records it
with its alert, or alone after the rules are checked. A fault is told once: it is claimed by setting its
`notified_at` in an UPDATE that matches it only while unset, in the transaction that records its rows.
The recipients are fixed then; unique constraints keep one row per (alert, event, channel, target) and one
per (fault, channel, target).
"""

from __future__ import annotations

from datetime import datetime

from monitoring.apps import EMAIL_TOPIC
from monitoring.conf import settings
from monitoring.faults.audience import Told, audience
from monitoring.models import Alert, Delivery, GpuFault
from monitoring.models.alerts import RuleKind
from monitoring.notifications import idle
from portal import permissions
from portal.models import Preferences
from portal.roles import PlatformRole

Channel = Delivery.Channel
# The rules whose alerts a fault's event fires, and which a fault's notifications go out with.
EVENT_RULES = (RuleKind.XID, RuleKind.ECC)


def operator_addresses() -> list[str]:
    """The operators who want alert e-mails, by address."""
    operators = permissions.platform_staff(role=PlatformRole.OPERATOR).exclude(email="")
    return [user.email for user in operators if Preferences.wants_email(user, EMAIL_TOPIC)]


def untold_faults() -> list[int]:
    """The faults nobody has been told of yet. An evaluation reads them before it checks any rule: a fault
    stored later is stored with its event, which a later evaluation sees, and tells with it."""
    return list(GpuFault.objects.filter(notified_at__isnull=True).order_by("pk").values_list("pk", flat=True))


def _claim(fault_id: int, *, now: datetime) -> bool:
    """Whether this transaction is the one to tell of the fault (it was not told, and now is)."""
    return bool(GpuFault.objects.filter(pk=fault_id, notified_at__isnull=True).update(notified_at=now))


def _unique(items: list[str]) -> list[str]:
    return list(dict.fromkeys(item for item in items if item))


def _fault_row(fault: GpuFault, told: Told, *, now: datetime, **row) -> Delivery:
    """The e-mail of `fault` to one person of its audience, due now (with an alert's event too in `row`)."""
    return Delivery(
        fault=fault,
        fault_pools=told.pools,
        as_approver=told.approver,
        channel=Channel.EMAIL,
        next_attempt_at=now,
        **row,
    )


def record(alert: Alert, event: str, *, operators: list[str], now: datetime) -> int:
    """The notifications of one event of `alert`, due now, with those of the fault its event fired when
    nobody has been told of that fault yet, and those of the idle spell it begins; returns how many rows
    are new."""
    rule = alert.rule
    emails = _unique([*operators, *rule.email_addresses()])
    hooks = _unique([settings.MONITORING_ALERT_WEBHOOK_URL, rule.webhook_url])
    fault, told = _fault_fired_with(alert, event, now=now)
    recorded = set(Delivery.objects.filter(alert=alert, event=event).values_list("channel", "target"))
    rows = []
    for address in emails:
        if (Channel.EMAIL, address) in recorded:
            continue
        _spelt, also = told.pop(address.lower(), (address, None))
        if also is None:
            rows.append(
                Delivery(alert=alert, event=event, channel=Channel.EMAIL, target=address, next_attempt_at=now)
            )
        else:
            rows.append(_fault_row(fault, also, now=now, alert=alert, event=event, target=address))
    rows += [_fault_row(fault, also, now=now, target=address) for address, also in told.values()]
    rows += [
        Delivery(alert=alert, event=event, channel=Channel.WEBHOOK, target=url, next_attempt_at=now)
        for url in hooks
        if (Channel.WEBHOOK, url) not in recorded
    ]
    if idle.tells(alert, event):
        rows += idle.deliveries(alert, now=now)
    Delivery.objects.bulk_create(rows, ignore_conflicts=True)  # the constraints have the last word
    return len(rows)


def _fault_fired_with(
    alert: Alert, event: str, *, now: datetime
) -> tuple[GpuFault | None, dict[str, tuple[str, Told]]]:
    """The fault not told yet of the GPU that `alert` fired on for an XID or ECC event, claimed, with its
    audience as (address, what they hear) by lower-case address; (None, {}) for any other alert or event."""
    if event != Delivery.Event.FIRED or alert.rule.kind not in EVENT_RULES or alert.gpu_id is None:
        return None, {}
    for fault in GpuFault.objects.filter(gpu_id=alert.gpu_id, notified_at__isnull=True).order_by("pk"):
        if _claim(fault.pk, now=now):
            return fault, {address.lower(): (address, told) for address, told in audience(fault).items()}
    return None, {}


def record_fault(fault_id: int, *, now: datetime) -> int:
    """The notifications of a fault nobody has been told of, alone (no alert fired with it), due now;
    returns how many rows are new (none when it was told already)."""
    if not _claim(fault_id, now=now):
        return 0
    fault = GpuFault.objects.get(pk=fault_id)
    rows = [_fault_row(fault, told, now=now, target=address) for address, told in audience(fault).items()]
    Delivery.objects.bulk_create(rows, ignore_conflicts=True)
    return len(rows)
