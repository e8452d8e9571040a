"""Who hears of a billed pool's idle spell besides the operators: the pool's own people, once per spell.

- Who: who asked for the pool (its request's `submitted_by`) and its tenant's admins, active, with an
  e-mail address, while they keep the topic IDLE_EMAIL_TOPIC on. Nobody outside the tenant.
- When: as the spell begins, in the transaction that fires its idle-pool alert: one `Delivery` of event
  `idle` per person, which the unique (alert, event, channel, target) keeps to one however often the
  evaluation runs. The spell ends when the alert resolves; the next alert of the pool is a new spell, told
  again.
- One spell, however many rules: where several idle-pool rules watch a pool, only the first alert open for
  it tells. Which is first is decided under an advisory lock per pool, taken in the transaction that fires,
  so that two evaluations firing two rules at once agree; the idle-pool check lists its pools in order, so
  that evaluations take these locks in one order.
What the e-mail says is `monitoring.notifications.sending`'s, with the figures of the pool's page
(monitoring/selectors/idle.py).
"""

from __future__ import annotations

from datetime import datetime

from django.db import connection

from monitoring.apps import IDLE_EMAIL_TOPIC
from monitoring.models import Alert, Delivery
from monitoring.models.alerts import RuleKind
from pools.models import Pool
from portal import permissions
from portal.models import Preferences

SPELL_LOCK = 0x69646C65  # pg advisory lock class of idle spells ("idle"); the pool's id is the other key


def tells(alert: Alert, event: str) -> bool:
    """Whether this event of `alert` is one the pool's people hear of: an idle pool's alert firing."""
    fired = event == Delivery.Event.FIRED
    return fired and alert.rule.kind == RuleKind.IDLE_POOL and alert.pool_id is not None


def pool_people(pool: Pool) -> list[str]:
    """The addresses of the pool's people who want to hear of it idle: who asked, then the tenant's admins."""
    people = {}
    asker = pool.request.submitted_by
    if asker.is_active and asker.email:
        people[asker.pk] = asker
    for admin in permissions.tenant_admins(tenant_id=pool.project.tenant_id).exclude(email=""):
        people.setdefault(admin.pk, admin)
    addresses: dict[str, str] = {}
    for user in people.values():
        if Preferences.wants_email(user, IDLE_EMAIL_TOPIC):
            addresses.setdefault(user.email.lower(), user.email)
    return list(addresses.values())


def _begins_spell(alert: Alert) -> bool:
    """Whether `alert` begins its pool's idle spell: no other idle-pool alert of the pool is open. Holds the
    pool's spell lock until the transaction ends."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_advisory_xact_lock(%s, %s)", [SPELL_LOCK, alert.pool_id % 2**31])
    others = Alert.objects.open().filter(pool_id=alert.pool_id, rule__kind=RuleKind.IDLE_POOL)
    return not others.exclude(pk=alert.pk).exists()


def deliveries(alert: Alert, *, now: datetime) -> list[Delivery]:
    """The e-mails of the idle spell `alert` begins, one per person of its pool, due now; none when another
    alert of the pool began the spell."""
    if not _begins_spell(alert):
        return []
    pool = Pool.objects.select_related("project", "request__submitted_by").get(pk=alert.pool_id)
    return [
        Delivery(
            alert=alert,
            event=Delivery.Event.IDLE,
            channel=Delivery.Channel.EMAIL,
            target=address,
            next_attempt_at=now,
        )
        for address in pool_people(pool)
    ]
