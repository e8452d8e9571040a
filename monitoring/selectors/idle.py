"""A billed pool's idle spell as its page and its people's e-mail say it: since when, how many hours, and
what they cost. Both call `spell_of`, so the two always agree.

Words:
- idle spell: the time an idle-pool alert of the pool is open (monitoring/alerts/rules.py: idle_pool). It
  begins where the pool became idle, the start of the window the rule found idle (`condition_since`), and
  ends when the alert resolves; a pool idle again later is in a new spell.
- idle hours: whole seconds from the spell's start to its end, or to now while it lasts.
- idle cost: the idle seconds at the pool's hourly cost (pools/pricing.py: pool_hourly_cost, from its
  items), rounded once as billing rounds money (pools/pricing.py: round_money); unknown (None) while a price
  is.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta
from decimal import ROUND_HALF_UP, Decimal

from django.utils import timezone

from monitoring.models import Alert
from monitoring.models.alerts import RuleKind
from pools import pricing
from pools.models import IN_USE_STATES, Pool

HOUR = Decimal(3600)
TENTH = Decimal("0.1")


@dataclass(frozen=True)
class IdleSpell:
    """One idle spell of a pool, figured at a moment."""

    alert_id: int
    since: datetime
    until: datetime | None  # when it ended; None while it lasts
    seconds: int
    hourly: Decimal | None  # the pool's hourly cost; None while a price is unknown
    currency: str | None

    @property
    def hours(self) -> Decimal:
        """The idle hours, to a tenth."""
        return (self.seconds / HOUR).quantize(TENTH, rounding=ROUND_HALF_UP)

    @property
    def cost(self) -> Decimal | None:
        """What the idle seconds cost, rounded once as billing rounds money (from the seconds, not the
        rounded hours)."""
        if self.hourly is None:
            return None
        return pricing.round_money(self.hourly * self.seconds / HOUR)


def _as_set(amount: Decimal | None) -> Decimal | None:
    """A price with the digits it was set with, not the stored scale's zeros: 36, not 36.0000."""
    return None if amount is None else Decimal(f"{amount.normalize():f}")


def spell_of(alert: Alert, *, now: datetime | None = None) -> IdleSpell:
    """The idle spell of an idle-pool alert, up to its resolution or `now` (select_related `rule` and `pool`,
    prefetch `pool__items`, when listing). An alert that does not know when its pool became idle
    began the rule's duration before it fired."""
    now = now or timezone.now()
    since = alert.condition_since or alert.fired_at - timedelta(seconds=alert.rule.duration_seconds)
    end = alert.resolved_at or now
    return IdleSpell(
        alert_id=alert.pk,
        since=since,
        until=alert.resolved_at,
        seconds=max(0, int((end - since).total_seconds())),
        hourly=_as_set(pricing.pool_hourly_cost(alert.pool)),
        currency=pricing.currency(),
    )


def open_spell_alert(pool_id: int) -> Alert | None:
    """The pool's open idle-pool alert that began its current spell (the first fired, where several rules
    watch idle pools), or None."""
    return (
        Alert.objects.open()
        .filter(pool_id=pool_id, rule__kind=RuleKind.IDLE_POOL)
        .select_related("rule")
        .order_by("fired_at", "pk")
        .first()
    )


def idle_spell(*, pool: Pool, now: datetime | None = None) -> IdleSpell | None:
    """The pool's idle spell going on now, or None: a pool no longer in use is not idle, even before the
    next evaluation resolves its alert."""
    if pool.state not in IN_USE_STATES:
        return None
    alert = open_spell_alert(pool.pk)
    if alert is None:
        return None
    alert.pool = pool
    return spell_of(alert, now=now)
