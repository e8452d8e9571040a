"""A billed pool left idle reaches the people who pay for it: who asked and the tenant's admins are e-mailed
once per idle spell, and the pool page shows since when, the idle hours and their cost, with a release button
for those who may release. Nobody outside the tenant learns of it."""

import re
from datetime import timedelta
from decimal import Decimal

import pytest
from django.core import mail
from django.urls import reverse
from django.utils import timezone

from monitoring.alerts import services as alerts
from monitoring.apps import IDLE_EMAIL_TOPIC
from monitoring.models import Alert, AlertRule, Delivery
from monitoring.notifications import sending
from monitoring.selectors import idle
from pools.models import PoolState, RequestState
from portal.models import Membership, Preferences, Role
from tests.factories import AllocationFactory, PoolFactory, PoolRequestFactory
from tests.factories.billing import PriceFactory
from tests.monitoring import test_alerts as rules

pytestmark = pytest.mark.django_db

only, feed, minutes, T0 = rules.only, rules.feed, rules.minutes, rules.T0
# 36 an hour is 0.01 a second: a few seconds between a test and its page never change a rounded figure.
HOURLY = Decimal("36")


@pytest.fixture
def pool(node, tenancy):
    """Alice's pool in Acme's vision project, holding GPU 0 whole for the last three hours, at 36 an hour."""
    request = PoolRequestFactory(
        project=tenancy.vision, submitted_by=tenancy.acme_member, state=RequestState.FULFILLED
    )
    pool = PoolFactory(
        project=tenancy.vision, request=request, cluster=node.cluster, reserved_at=T0 - minutes(60)
    )
    AllocationFactory(pool=pool, gpu=node.gpus.get(index=0))
    pool.allocations.update(allocated_at=T0 - minutes(60))
    PriceFactory(gpu_model="H100-80GB", profile="full", hourly_price=HOURLY, valid_from=T0 - minutes(120))
    return pool


def quiet(sm=1.0):
    return {"full": {"sm_active_pct": sm}}


def idle_for_a_while(node) -> None:
    """GPU 0 idle from T0 for eleven minutes: a ten-minute idle rule fires at T0 + 11 min, idle since
    T0 + 1 min."""
    only("idle_pool", duration_seconds=600)
    feed(node, T0, T0 + minutes(11), step=60, **quiet())


def told(now) -> list[str]:
    """Evaluate, send what is due, and say who got e-mails (one address each), in order."""
    alerts.evaluate(now=now)
    sending.deliver_due(now=now)
    assert all(len(message.to) == 1 for message in mail.outbox)
    return sorted(message.to[0] for message in mail.outbox)


def test_who_asked_and_the_tenant_admins_are_told_once_per_idle_spell(node, pool, tenancy):
    idle_for_a_while(node)
    people = sorted([tenancy.acme_member.email, tenancy.acme_admin.email])

    assert told(T0 + minutes(11)) == people
    assert told(T0 + minutes(11)) == people  # a second evaluation in the same spell: nothing more
    feed(node, T0 + minutes(12), T0 + minutes(12), **quiet())
    assert told(T0 + minutes(12)) == people

    # In use again: the spell ends, and nobody is told of its end.
    feed(node, T0 + minutes(13), T0 + minutes(13), **quiet(sm=40.0))
    assert alerts.evaluate(now=T0 + minutes(13)).resolved == 1
    assert told(T0 + minutes(13)) == people

    # Idle again for the rule's duration: a new spell, told again.
    feed(node, T0 + minutes(14), T0 + minutes(27), step=60, **quiet())
    assert told(T0 + minutes(22)) == people  # the busy minute is still in the rule's window
    assert told(T0 + minutes(27)) == sorted(people * 2)
    assert told(T0 + minutes(27)) == sorted(people * 2)


def test_the_email_links_to_the_pool_and_says_the_idle_hours_and_their_cost(node, pool, tenancy):
    idle_for_a_while(node)
    alerts.evaluate(now=T0 + minutes(11))
    sending.deliver_due(now=T0 + minutes(41))  # sent late: the figures are the spell's when it is written

    message = next(m for m in mail.outbox if m.to == [tenancy.acme_member.email])
    alert = Alert.objects.get(pool=pool)
    assert alert.condition_since == T0 + minutes(1)
    assert f"#{pool.pk}" in message.subject and "idle" in message.subject
    assert reverse("pool", kwargs={"tenant_slug": "acme", "pk": pool.pk}) in message.body
    # Forty minutes idle at 36 an hour.
    assert "Idle hours so far: 0.7, costing 24 KRW at 36 KRW per hour." in message.body
    assert (T0 + minutes(1)).strftime("%Y-%m-%d %H:%M UTC") in message.body
    spell = idle.spell_of(alert, now=T0 + minutes(41))
    assert (spell.hours, spell.cost) == (Decimal("0.7"), Decimal("24"))


def test_only_the_first_alert_of_a_pool_tells_where_two_rules_find_it_idle(node, pool, tenancy):
    idle_for_a_while(node)
    AlertRule.objects.create(name="idle, stricter", kind="idle_pool", threshold=2, duration_seconds=300)

    assert alerts.evaluate(now=T0 + minutes(11)).fired == 2
    assert Delivery.objects.filter(event=Delivery.Event.IDLE).count() == 2  # Alice and Bob, once
    assert len({d.alert_id for d in Delivery.objects.filter(event=Delivery.Event.IDLE)}) == 1


def test_people_who_turned_the_topic_off_and_everyone_outside_the_tenant_hear_nothing(node, pool, tenancy):
    Preferences.objects.update_or_create(user=tenancy.acme_admin, defaults={"emails_off": [IDLE_EMAIL_TOPIC]})
    Membership.objects.filter(user=tenancy.globex_member).update(role=Role.ADMIN)  # another tenant's admin
    idle_for_a_while(node)

    assert told(T0 + minutes(11)) == [tenancy.acme_member.email]
    for outside in (tenancy.globex_member, tenancy.outsider, tenancy.acme_viewer):
        assert all(outside.email not in message.to for message in mail.outbox)


# --- the pool page -------------------------------------------------------------------------------


def _page(pool) -> str:
    return reverse("pool", kwargs={"tenant_slug": pool.project.tenant.slug, "pk": pool.pk})


def _release(pool) -> str:
    return reverse("pool-release", kwargs={"tenant_slug": pool.project.tenant.slug, "pk": pool.pk})


def _idle_section(page: str) -> str:
    found = re.search(r'<section class="card pool-idle">.*?</section>', page, re.S)
    return found.group(0) if found else ""


@pytest.fixture
def idle_three_hours(node, pool):
    """The pool's idle spell, fired by the rule, begun three hours ago."""
    idle_for_a_while(node)
    alerts.evaluate(now=T0 + minutes(11))
    Alert.objects.filter(pool=pool).update(condition_since=timezone.now() - timedelta(hours=3))
    return Alert.objects.get(pool=pool)


def test_the_pool_page_shows_the_idle_hours_and_their_cost_as_the_email_does(
    idle_three_hours, pool, tenancy, client
):
    client.force_login(tenancy.acme_viewer)

    section = _idle_section(client.get(_page(pool)).content.decode())

    spell = idle.spell_of(idle_three_hours, now=timezone.now())
    assert (spell.hours, spell.cost, spell.hourly) == (Decimal("3.0"), Decimal("108"), HOURLY)
    assert '<dd class="idle-hours">3.0</dd>' in section
    assert '<dd class="idle-cost">108 KRW</dd>' in section
    assert timezone.localtime(idle_three_hours.condition_since).strftime("%Y-%m-%d %H:%M") in section


@pytest.mark.parametrize(
    ("who", "may_release"),
    [("acme_member", True), ("acme_admin", True), ("acme_viewer", False)],
)
def test_the_release_button_shows_only_to_who_may_release(
    idle_three_hours, pool, tenancy, client, who, may_release
):
    client.force_login(getattr(tenancy, who))

    section = _idle_section(client.get(_page(pool)).content.decode())

    assert "3.0" in section
    assert (f'action="{_release(pool)}"' in section) is may_release
    assert ("csrfmiddlewaretoken" in section) is may_release


def test_the_button_releases_the_pool_and_the_section_goes(idle_three_hours, pool, tenancy, client):
    client.force_login(tenancy.acme_member)
    section = _idle_section(client.get(_page(pool)).content.decode())
    token = re.search(r'name="csrfmiddlewaretoken" value="([^"]+)"', section).group(1)

    answer = client.post(_release(pool), {"csrfmiddlewaretoken": token}, follow=True)

    pool.refresh_from_db()
    assert pool.state == PoolState.RELEASING and pool.released_at is not None
    assert _idle_section(answer.content.decode()) == ""  # no longer in use: no longer idle


def test_a_viewer_may_not_release_through_the_form_either(idle_three_hours, pool, tenancy, client):
    client.force_login(tenancy.acme_viewer)
    client.post(_release(pool))
    pool.refresh_from_db()
    assert pool.state == PoolState.ACTIVE


def test_another_tenant_learns_nothing_of_the_idle_pool(idle_three_hours, pool, tenancy, client):
    client.force_login(tenancy.globex_member)
    assert client.get(_page(pool)).status_code == 404
    assert client.post(_release(pool)).status_code == 404
    pool.refresh_from_db()
    assert pool.state == PoolState.ACTIVE


def test_once_the_spell_ends_the_page_shows_nothing_of_it(idle_three_hours, node, pool, tenancy, client):
    feed(node, T0 + minutes(12), T0 + minutes(12), **quiet(sm=40.0))
    assert alerts.evaluate(now=T0 + minutes(12)).resolved == 1
    client.force_login(tenancy.acme_member)

    page = client.get(_page(pool)).content.decode()

    assert page.count("Release the pool") == 1  # the page's own button, no idle one
    assert _idle_section(page) == ""
