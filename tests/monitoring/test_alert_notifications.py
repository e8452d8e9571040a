"""Alert notifications: e-mail to operators who want it and the rule's addresses, a JSON webhook to a real
HTTP server, each sent once per event, retried with back-off, and given up after the last attempt."""

import time
from datetime import UTC, datetime, timedelta

import pytest
from django.contrib.auth.models import Group
from django.core import mail
from django.core.exceptions import ValidationError
from django.urls import reverse

from monitoring.alerts import services as alerts
from monitoring.models import Alert, AlertRule, Delivery
from monitoring.notifications import recording, sending
from portal.dispatch import Send
from portal.models import Preferences
from portal.roles import PlatformRole
from tests.factories import ClusterFactory, GpuCapacityFactory, NodeCapacityFactory, UserFactory
from tests.monitoring.test_alerts import feed, minutes, only

# The webhook servers listen on loopback, which the portal posts to only when allowed.
pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("private_networks_allowed")]

NOW = datetime.now(UTC).replace(second=0, microsecond=0)
T0 = NOW - timedelta(hours=2)


@pytest.fixture
def operators(db):
    group = Group.objects.get(name=PlatformRole.OPERATOR)
    wanting = UserFactory(username="olga", email="olga@ops.example", is_staff=True)
    opted_out = UserFactory(username="oscar", email="oscar@ops.example", is_staff=True)
    no_address = UserFactory(username="otto", email="", is_staff=True)
    UserFactory(username="tina", email="tina@tenant.example")  # not an operator
    for user in (wanting, opted_out, no_address):
        user.groups.add(group)
    Preferences.objects.create(user=opted_out, emails_off=["alerts", "pools"])
    return wanting


def hot_then_cool(node):
    """Fire the temperature rule at T0 + 6 min, resolve it at T0 + 7 min."""
    feed(node, T0, T0 + minutes(6), full={"temperature_c": 90.0})
    assert alerts.evaluate(now=T0 + minutes(6)).fired == 1
    yield Alert.objects.get()
    feed(node, T0 + minutes(7), T0 + minutes(7), full={"temperature_c": 60.0})
    assert alerts.evaluate(now=T0 + minutes(7)).resolved == 1
    yield Alert.objects.get()


def test_each_event_is_e_mailed_once_to_operators_who_want_it_and_the_rules_addresses(
    node, operators, settings
):
    settings.MONITORING_ALERT_WEBHOOK_URL = ""
    only("threshold", extra_emails="oncall@ops.example, olga@ops.example\npager@ops.example")
    steps = hot_then_cool(node)

    alert = next(steps)
    assert sending.deliver_due(now=T0 + minutes(6)).sent == 3
    assert sending.deliver_due(now=T0 + minutes(6)).sent == 0
    assert sorted(m.to[0] for m in mail.outbox) == [
        "olga@ops.example",
        "oncall@ops.example",
        "pager@ops.example",
    ]
    fired = mail.outbox[0]
    assert fired.subject == "[GPU Portal] [warning] GPU too hot on sim/gpu-node-1 GPU 0"
    assert "above 85 °C for 5 min" in fired.body and f"/monitoring/alerts/{alert.pk}/" in fired.body

    next(steps)
    mail.outbox.clear()
    assert sending.deliver_due(now=T0 + minutes(7)).sent == 3
    assert sending.deliver_due(now=T0 + minutes(8)).sent == 0
    assert len(mail.outbox) == 3
    assert all(m.subject.startswith("[GPU Portal] Resolved: GPU too hot") for m in mail.outbox)
    assert Delivery.objects.filter(sent_at__isnull=False, attempts=1).count() == 6


def test_an_event_is_recorded_once_however_often_it_is_recorded(node, operators):
    only("threshold")
    alert = next(hot_then_cool(node))
    before = Delivery.objects.count()
    again = recording.record(alert, "fired", operators=recording.operator_addresses(), now=T0)
    assert (before, again, Delivery.objects.count()) == (1, 0, 1)


def test_evaluation_queues_the_sending_once_it_commits(node, operators, django_capture_on_commit_callbacks):
    only("threshold")
    feed(node, T0, T0 + minutes(6), full={"temperature_c": 90.0})
    with django_capture_on_commit_callbacks() as callbacks:
        alerts.evaluate(now=T0 + minutes(6))
    assert [c for c in callbacks if isinstance(c, Send)] == [
        Send("monitoring.tasks.deliver_alert_notifications")
    ]
    with django_capture_on_commit_callbacks() as callbacks:
        alerts.evaluate(now=T0 + minutes(6))  # nothing new: nothing queued
    assert [c for c in callbacks if isinstance(c, Send)] == []


def test_the_webhook_gets_the_alert_as_json(node, hook_server, settings):
    hook = hook_server()
    settings.MONITORING_ALERT_WEBHOOK_URL = hook.url
    settings.PORTAL_BASE_URL = "https://portal.example"
    rule = only("threshold")
    steps = hot_then_cool(node)
    alert = next(steps)
    gpu = node.gpus.get(index=0)

    assert sending.deliver_due(now=T0 + minutes(6)).sent == 1
    assert hook.bodies == [
        {
            "id": alert.pk,
            "rule": "GPU too hot",
            "kind": "threshold",
            "severity": "warning",
            "state": "fired",
            "subject": f"gpu:{gpu.pk}",
            "where": "sim/gpu-node-1 GPU 0",
            "message": alert.message,
            "value": 90.0,
            "fired_at": (T0 + minutes(6)).isoformat(),
            "resolved_at": None,
            "url": f"https://portal.example/monitoring/alerts/{alert.pk}/",
        }
    ]
    rule.webhook_url = hook.url + "?rule"  # a rule's own webhook is told too (of the events after this)
    rule.save()
    next(steps)
    assert sending.deliver_due(now=T0 + minutes(7)).sent == 2
    assert sending.deliver_due(now=T0 + minutes(8)).sent == 0
    assert len(hook.bodies) == 3
    resolved = hook.bodies[1]
    assert hook.bodies[2] == resolved
    assert (resolved["state"], resolved["resolved_at"]) == ("resolved", (T0 + minutes(7)).isoformat())


def test_a_failing_webhook_is_retried_with_back_off_until_it_answers(node, hook_server, settings):
    hook = hook_server(statuses=(500, 500, 200))
    settings.MONITORING_ALERT_WEBHOOK_URL = hook.url
    settings.MONITORING_ALERT_RETRY_SECONDS = 30
    only("threshold")
    next(hot_then_cool(node))
    t = T0 + minutes(6)

    assert sending.deliver_due(now=t).failed == 1
    delivery = Delivery.objects.get()
    assert (delivery.attempts, delivery.sent_at, delivery.next_attempt_at) == (
        1,
        None,
        t + timedelta(seconds=30),
    )
    assert delivery.last_error.startswith("HTTP 500")

    assert sending.deliver_due(now=t + timedelta(seconds=29)).failed == 0  # not due yet
    assert len(hook.bodies) == 1
    assert sending.deliver_due(now=t + timedelta(seconds=30)).failed == 1
    delivery.refresh_from_db()
    assert (delivery.attempts, delivery.next_attempt_at) == (2, t + timedelta(seconds=90))  # twice as long

    assert sending.deliver_due(now=t + timedelta(seconds=89)).sent == 0
    assert sending.deliver_due(now=t + timedelta(seconds=90)).sent == 1
    delivery.refresh_from_db()
    assert (delivery.attempts, delivery.sent_at, delivery.next_attempt_at) == (
        3,
        t + timedelta(seconds=90),
        None,
    )
    assert sending.deliver_due(now=t + timedelta(hours=1)).sent == 0
    assert len(hook.bodies) == 3 and all(body["id"] == delivery.alert_id for body in hook.bodies)


def test_an_unreachable_webhook_is_given_up_after_the_last_attempt(node, settings):
    settings.MONITORING_ALERT_WEBHOOK_URL = "http://127.0.0.1:9/nobody-listens"
    settings.MONITORING_ALERT_MAX_ATTEMPTS = 3
    settings.MONITORING_ALERT_RETRY_MAX_SECONDS = 40
    only("threshold")
    next(hot_then_cool(node))
    t = T0 + minutes(6)
    waits = []
    for _ in range(3):
        sending.deliver_due(now=t)
        delivery = Delivery.objects.get()
        if delivery.next_attempt_at:
            waits.append((delivery.next_attempt_at - t).total_seconds())
            t = delivery.next_attempt_at
    assert waits == [30, 40]  # doubled, then capped
    assert (delivery.attempts, delivery.sent_at, delivery.gave_up_at) == (3, None, t)
    assert "Connection refused" in delivery.last_error or "Max retries" in delivery.last_error
    assert sending.deliver_due(now=t + timedelta(days=1)).gave_up == 0


def test_a_slow_webhook_times_out(node, settings):
    """A webhook that accepts the connection and never answers costs the timeout, not the worker."""
    import socket

    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen()
    settings.MONITORING_ALERT_WEBHOOK_URL = f"http://127.0.0.1:{listener.getsockname()[1]}/"
    settings.MONITORING_ALERT_WEBHOOK_TIMEOUT_SECONDS = 0.5
    only("threshold")
    next(hot_then_cool(node))
    started = time.monotonic()
    try:
        assert sending.deliver_due(now=T0 + minutes(6)).failed == 1
    finally:
        listener.close()
    assert time.monotonic() - started < 5
    assert "timed out" in Delivery.objects.get().last_error


@pytest.mark.celery
@pytest.mark.django_db(transaction=True, serialized_rollback=True)
def test_the_worker_evaluates_and_posts_to_the_webhook_once(celery_worker, hook_server):
    from monitoring.tasks import deliver_alert_notifications, evaluate_alerts

    hook = hook_server()
    node = NodeCapacityFactory(cluster=ClusterFactory(name="sim"), name="gpu-node-1", gpu_model="H100-80GB")
    GpuCapacityFactory(node=node, index=0)
    GpuCapacityFactory(node=node, index=1, mig={"3g.40gb": 2})
    # The worker's clock is now: the figures are of the last six minutes.
    start = datetime.now(UTC) - minutes(6)
    only("threshold", webhook_url=hook.url)
    feed(node, start, start + minutes(6), step=20, full={"temperature_c": 92.0})

    assert evaluate_alerts.delay().get(timeout=30).startswith("1 rules: 1 fired")
    deadline = time.monotonic() + 30
    while not Delivery.objects.filter(sent_at__isnull=False).exists():
        assert time.monotonic() < deadline, celery_worker.log.read_text()[-3000:]
        time.sleep(0.2)
    assert evaluate_alerts.delay().get(timeout=30).startswith("1 rules: 0 fired")
    assert deliver_alert_notifications.delay().get(timeout=30).startswith("0 sent")
    assert [body["state"] for body in hook.bodies] == ["fired"]
    assert AlertRule.objects.filter(enabled=True).count() == 1


def test_an_operator_reads_alert_e_mails_in_their_language(node, operators, settings):
    settings.MONITORING_ALERT_WEBHOOK_URL = ""
    Preferences.objects.update_or_create(user=operators, defaults={"language": "ko"})
    only("threshold", extra_emails="oncall@ops.example")
    next(hot_then_cool(node))
    assert sending.deliver_due(now=T0 + minutes(6)).sent == 2
    by_address = {m.to[0]: m for m in mail.outbox}
    assert "경고" in by_address["olga@ops.example"].subject  # the severity, in Korean
    assert "[warning]" in by_address["oncall@ops.example"].subject  # no known person: the site's language


# --- one notification that cannot go out holds up no other ------------------------------------------


def test_a_notification_that_cannot_be_sent_fails_alone_and_the_others_go_out(
    node, operators, hook_server, settings
):
    hook = hook_server()
    settings.MONITORING_ALERT_WEBHOOK_URL = hook.url
    settings.MONITORING_ALERT_MAX_ATTEMPTS = 2
    settings.MONITORING_ALERT_RETRY_SECONDS = 30
    rule = only("threshold", extra_emails="oncall@ops.example")
    # A name stored before names were checked: a line break no e-mail subject may hold.
    AlertRule.objects.filter(pk=rule.pk).update(name="GPU too hot\nBcc: everyone@example.com")
    next(hot_then_cool(node))
    t = T0 + minutes(6)
    # Another alert's e-mail, due at the same moment, behind the two that cannot be sent.
    other = Alert.objects.create(
        rule=AlertRule.objects.exclude(pk=rule.pk).first(),
        subject="node:elsewhere",
        message="silent",
        severity="warning",
        fired_at=T0,
        last_seen_at=T0,
    )
    Delivery.objects.create(
        alert=other, event="fired", channel="email", target="pager@ops.example", next_attempt_at=t
    )

    done = sending.deliver_due(now=t)

    assert (done.sent, done.failed, done.gave_up) == (2, 2, 0)
    assert [m.to for m in mail.outbox] == [["pager@ops.example"]]
    assert [body["rule"] for body in hook.bodies] == ["GPU too hot\nBcc: everyone@example.com"]
    failed = Delivery.objects.filter(sent_at__isnull=True).order_by("target")
    assert [(d.target, d.attempts, d.next_attempt_at) for d in failed] == [
        ("olga@ops.example", 1, t + timedelta(seconds=30)),
        ("oncall@ops.example", 1, t + timedelta(seconds=30)),
    ]
    assert all(d.last_error.startswith("BadHeaderError: ") for d in failed)

    # The retry rule holds for them as for any failure: the last attempt gives up.
    assert sending.deliver_due(now=t + timedelta(seconds=30)).gave_up == 2
    assert Delivery.objects.filter(gave_up_at=t + timedelta(seconds=30), attempts=2).count() == 2
    assert sending.deliver_due(now=t + timedelta(days=1)) == sending.Delivered()
    assert len(mail.outbox) == 1


def rule_form(rule: AlertRule, **changes) -> dict:
    """The admin's form of `rule`, as its page sends it back, with `changes`."""
    fields = ["name", "kind", "severity", "metric", "comparison", "threshold", "scope", "duration_seconds"]
    form = {name: getattr(rule, name) for name in fields}
    form.update(threshold="" if rule.threshold is None else rule.threshold, enabled="on")
    form.update(extra_emails=rule.extra_emails, webhook_url=rule.webhook_url)
    return {**form, **changes}


@pytest.mark.parametrize(
    "name", ["Too hot\nBcc: x@example.com", "Too\rhot", "Too\thot", "Too\x1bhot", "Too\u2028hot"]
)
def test_a_rule_name_holds_no_control_characters_however_it_is_given(name, superuser_client):
    rule = AlertRule.objects.get(kind="threshold")
    before = rule.name

    answer = superuser_client.post(
        reverse("admin:monitoring_alertrule_change", args=[rule.pk]), rule_form(rule, name=name)
    )
    assert answer.status_code == 200
    assert "control characters" in " ".join(answer.context["adminform"].form.errors["name"])
    added = superuser_client.post(reverse("admin:monitoring_alertrule_add"), rule_form(rule, name=name))
    assert added.status_code == 200 and AlertRule.objects.filter(name=name).count() == 0
    rule.name = name
    with pytest.raises(ValidationError, match="control characters"):
        rule.full_clean()
    assert AlertRule.objects.get(pk=rule.pk).name == before


def test_a_rules_extra_addresses_are_e_mail_addresses(superuser_client):
    rule = AlertRule.objects.get(kind="threshold")
    answer = superuser_client.post(
        reverse("admin:monitoring_alertrule_change", args=[rule.pk]),
        rule_form(rule, extra_emails="oncall@ops.example\nnot an address"),
    )
    assert answer.status_code == 200
    assert "not an address is not an e-mail address" in " ".join(
        answer.context["adminform"].form.errors["extra_emails"]
    )
    assert AlertRule.objects.get(pk=rule.pk).extra_emails == ""
