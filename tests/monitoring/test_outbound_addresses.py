"""Alert webhooks and Prometheus reads reach only public addresses: refused by the rule's field however it
is given, and again when a notification is sent or Prometheus read, where a name that resolves elsewhere
since it was checked, or a redirect, leads nowhere. The system resolver is the one thing faked: it answers
for names of the tests' choosing; every connection is real."""

import pytest
from django.core.exceptions import ValidationError
from django.urls import reverse

from monitoring.models import AlertRule, Delivery
from monitoring.notifications import sending
from tests.monitoring.test_alert_notifications import T0, hot_then_cool, rule_form
from tests.monitoring.test_alerts import minutes, only
from tests.monitoring.test_dcgm_answers import unavailable

pytestmark = pytest.mark.django_db

PUBLIC = "93.184.216.34"
REFUSED = [
    "http://127.0.0.1:8080/hook",
    "http://localhost/hook",
    "http://169.254.169.254/latest/meta-data/",
    "http://10.1.2.3/hook",
    "http://172.16.0.9/hook",
    "http://192.168.0.1/hook",
    "http://100.64.0.1/hook",
    "http://[::1]/hook",
    "http://[fe80::1]/hook",
    "http://[fd12:3456::1]/hook",
    "http://[::ffff:169.254.169.254]/hook",
    "http://0.0.0.0/hook",
    "http://224.0.0.1/hook",
    "http://240.0.0.1/hook",
]


# --- given: the rule's field refuses, wherever the rule is changed -------------------------------------


@pytest.mark.parametrize("url", REFUSED)
def test_a_webhook_url_that_is_not_public_is_refused(url):
    rule = AlertRule.objects.get(kind="threshold")
    rule.webhook_url = url
    with pytest.raises(ValidationError, match="not a public address"):
        rule.full_clean()


def test_the_admin_refuses_a_webhook_url_that_is_not_public(superuser_client):
    rule = AlertRule.objects.get(kind="threshold")
    metadata = "http://169.254.169.254/latest/meta-data/"

    answer = superuser_client.post(
        reverse("admin:monitoring_alertrule_change", args=[rule.pk]), rule_form(rule, webhook_url=metadata)
    )

    assert answer.status_code == 200
    assert "not a public address" in " ".join(answer.context["adminform"].form.errors["webhook_url"])
    assert AlertRule.objects.get(pk=rule.pk).webhook_url == ""


def test_every_address_a_name_resolves_to_must_be_public(resolver):
    rule = AlertRule.objects.get(kind="threshold")
    resolver("hooks.example", [PUBLIC, "10.0.0.5"])
    rule.webhook_url = "https://hooks.example/alerts"
    with pytest.raises(ValidationError, match=r"hooks\.example resolves to 10\.0\.0\.5"):
        rule.full_clean()

    resolver("hooks.example", [PUBLIC, "2606:2800:220:1::1"])
    rule.full_clean()  # public, every one


def test_a_name_that_does_not_resolve_is_refused():
    rule = AlertRule.objects.get(kind="threshold")
    rule.webhook_url = "https://hooks.invalid/alerts"
    with pytest.raises(ValidationError, match="cannot be resolved"):
        rule.full_clean()


def test_operators_allow_their_own_networks_and_no_more(settings):
    rule = AlertRule.objects.get(kind="threshold")
    settings.OUTBOUND_ALLOWED_NETWORKS = ["10.20.0.0/16", "not a network"]
    rule.webhook_url = "http://10.20.3.4/hook"
    rule.full_clean()
    for refused in ("http://10.21.0.1/hook", "http://169.254.169.254/", "http://127.0.0.1/"):
        rule.webhook_url = refused
        with pytest.raises(ValidationError, match="not a public address"):
            rule.full_clean()
    settings.OUTBOUND_ALLOW_PRIVATE_NETWORKS = True
    rule.full_clean()


# --- sent: checked again, as the request is made ---------------------------------------------------------


def test_webhooks_that_are_not_public_are_refused_when_sending_and_never_posted(node, hook_server, settings):
    hook = hook_server()
    settings.MONITORING_ALERT_WEBHOOK_URL = hook.url  # the portal-wide one, from the environment
    rule = only("threshold")
    AlertRule.objects.filter(pk=rule.pk).update(webhook_url=hook.url + "?rule")  # saved before the check
    next(hot_then_cool(node))

    assert sending.deliver_due(now=T0 + minutes(6)).failed == 2

    assert hook.bodies == []
    for delivery in Delivery.objects.all():
        assert delivery.sent_at is None and "127.0.0.1 is not a public address" in delivery.last_error


def test_a_webhook_whose_name_resolves_elsewhere_since_it_was_checked_is_not_posted(
    node, hook_server, resolver
):
    hook = hook_server()
    port = hook.server.server_address[1]
    resolver("hooks.example", [PUBLIC], ["127.0.0.1"])  # public when checked, loopback when sending
    rule = only("threshold")
    rule.webhook_url = f"http://hooks.example:{port}/alerts"
    rule.full_clean()
    rule.save()
    next(hot_then_cool(node))

    assert sending.deliver_due(now=T0 + minutes(6)).failed == 1

    assert hook.bodies == []
    assert "hooks.example resolves to 127.0.0.1" in Delivery.objects.get().last_error


def test_a_webhook_redirect_is_a_failure_never_followed(
    node, hook_server, settings, private_networks_allowed
):
    elsewhere = hook_server()
    moved = hook_server(statuses=(307,), headers={"Location": elsewhere.url})
    settings.MONITORING_ALERT_WEBHOOK_URL = moved.url
    only("threshold")
    next(hot_then_cool(node))

    assert sending.deliver_due(now=T0 + minutes(6)).failed == 1

    assert len(moved.bodies) == 1 and elsewhere.bodies == []
    assert Delivery.objects.get().last_error.startswith("HTTP 307")


def test_prometheus_is_not_read_where_its_name_leads_to_an_address_that_is_not_public(
    fake_prometheus, resolver
):
    fake = fake_prometheus(200, {"status": "success", "data": {"resultType": "matrix", "result": []}})
    port = fake.http.server_address[1]
    url = f"http://prometheus.example:{port}"
    # Public when the read is checked, loopback when the connection is made: the address the connection
    # reached is refused before a request goes out.
    resolver("prometheus.example", [PUBLIC], ["127.0.0.1"])

    message = unavailable(url)

    assert message == (
        f"Prometheus at {url} is refused: prometheus.example resolves to 127.0.0.1, which is not a public "
        "address. The portal sends no requests to loopback, link-local, private or reserved addresses "
        "unless OUTBOUND_ALLOWED_NETWORKS or OUTBOUND_ALLOW_PRIVATE_NETWORKS allows them."
    )
    assert fake.requests == []
    resolver("prometheus.example", ["127.0.0.1"])
    assert "is refused" in unavailable(url) and fake.requests == []
