"""Operators' alert pages: the list (filtered, paged, newest first), one alert with its notifications and
the Acknowledge button, the rules; anyone else gets 404, bad input a 4xx."""

from datetime import timedelta

import pytest
from django.contrib.auth.models import Group, Permission
from django.test import Client
from django.urls import reverse
from django.utils import timezone

from monitoring.models import Delivery
from portal.roles import PlatformRole
from tests.factories import AlertFactory, AlertRuleFactory, GpuCapacityFactory, PoolFactory

pytestmark = pytest.mark.django_db


@pytest.fixture
def gpu():
    return GpuCapacityFactory(node__name="gpu-node-7", node__cluster__name="east", index=3)


def test_operators_see_alerts_newest_first_and_the_link_in_the_top_bar(client_for, operator, gpu):
    now = timezone.now()
    older = AlertFactory(gpu=gpu, fired_at=now - timedelta(hours=1), message="older one")
    newer = AlertFactory(
        gpu=GpuCapacityFactory(node=gpu.node), fired_at=now, severity="critical", message="newer one"
    )
    client = client_for(operator)

    assert reverse("monitoring-alerts") in client.get("/", follow=True).content.decode()
    page = client.get(reverse("monitoring-alerts")).content.decode()
    assert page.index("newer one") < page.index("older one")
    assert "east/gpu-node-7 GPU 3" in page
    assert reverse("monitoring-alert", kwargs={"pk": older.pk}) in page
    assert reverse("monitoring-alert", kwargs={"pk": newer.pk}) in page


@pytest.mark.parametrize(
    ("query", "shown"),
    [
        ("", {"open", "acknowledged", "resolved"}),
        ("state=open", {"open"}),
        ("state=acknowledged", {"acknowledged"}),
        ("state=resolved", {"resolved"}),
        ("severity=critical", {"acknowledged"}),
        ("state=open&severity=critical", set()),
    ],
)
def test_the_list_filters_by_state_and_severity(client_for, operator, gpu, query, shown):
    now = timezone.now()
    AlertFactory(gpu=gpu, message="is open")
    AlertFactory(
        gpu=GpuCapacityFactory(node=gpu.node),
        message="is acknowledged",
        severity="critical",
        acknowledged_at=now,
        acknowledged_by=operator,
    )
    AlertFactory(gpu=gpu, message="is resolved", resolved_at=now)
    response = client_for(operator).get(f"{reverse('monitoring-alerts')}?{query}")
    assert response.status_code == 200
    page = response.content.decode()
    assert {state for state in ("open", "acknowledged", "resolved") if f"is {state}" in page} == shown


@pytest.mark.parametrize(
    ("query", "why"),
    [
        ("state=closed", "Select a valid choice. closed is not one of the available choices."),
        ("severity=fatal", "Select a valid choice. fatal is not one of the available choices."),
        ("state=%00", "contains a NUL character"),  # the site's own guard, before the view
        ("severity=" + "x" * 3000, "longer than 2048 characters"),
    ],
)
def test_an_unknown_filter_is_a_400_that_says_so(client_for, operator, gpu, query, why):
    AlertFactory(gpu=gpu, message="not shown")
    response = client_for(operator).get(f"{reverse('monitoring-alerts')}?{query}")
    assert response.status_code == 400
    page = response.content.decode()
    assert why in page and "not shown" not in page


def test_the_list_pages_and_its_queries_do_not_grow_with_its_rows(
    client_for, operator, gpu, django_assert_max_num_queries
):
    client = client_for(operator)
    AlertFactory(gpu=gpu)
    with django_assert_max_num_queries(100) as few:
        client.get(reverse("monitoring-alerts"))
    for n in range(60):
        AlertFactory(
            gpu=GpuCapacityFactory(node=gpu.node),
            pool=PoolFactory() if n % 2 else None,
            acknowledged_by=operator if n % 3 else None,
            acknowledged_at=timezone.now() if n % 3 else None,
        )
    with django_assert_max_num_queries(len(few.captured_queries)):
        first = client.get(reverse("monitoring-alerts"))
    assert first.content.decode().count("/monitoring/alerts/") >= 50
    second = client.get(f"{reverse('monitoring-alerts')}?page=2").content.decode()
    assert "Page 2 of 2" in second
    assert client.get(f"{reverse('monitoring-alerts')}?page=x").status_code == 200


def test_the_alert_page_shows_the_subject_times_and_each_notification(client_for, operator, gpu):
    alert = AlertFactory(gpu=gpu, value=91.5)
    Delivery.objects.create(
        alert=alert, event="fired", channel="webhook", target="https://hooks.example/x", attempts=2,
        next_attempt_at=timezone.now(), last_error="HTTP 500 Internal Server Error",
    )  # fmt: skip
    Delivery.objects.create(
        alert=alert, event="fired", channel="email", target="olga@ops.example", attempts=1,
        sent_at=timezone.now(),
    )  # fmt: skip
    page = client_for(operator).get(reverse("monitoring-alert", kwargs={"pk": alert.pk})).content.decode()
    for text in ("GPU too hot", "east/gpu-node-7 GPU 3", "91.5", "https://hooks.example/x", "HTTP 500"):
        assert text in page
    assert "olga@ops.example" in page and "Acknowledge" in page


def test_an_operator_acknowledges_an_alert_once_and_a_resolved_one_is_refused(client_for, operator, gpu):
    alert = AlertFactory(gpu=gpu)
    client = client_for(operator)
    url = reverse("monitoring-alert-acknowledge", kwargs={"pk": alert.pk})

    assert client.get(url).status_code == 405
    response = client.post(url, follow=True)
    assert response.redirect_chain[-1][0] == reverse("monitoring-alert", kwargs={"pk": alert.pk})
    assert "acknowledged" in response.content.decode()
    alert.refresh_from_db()
    assert (alert.acknowledged_by, alert.resolved_at) == (operator, None)
    first = alert.acknowledged_at
    assert client.post(url).status_code == 302
    alert.refresh_from_db()
    assert alert.acknowledged_at == first

    resolved = AlertFactory(gpu=gpu, resolved_at=timezone.now())
    response = client.post(reverse("monitoring-alert-acknowledge", kwargs={"pk": resolved.pk}))
    assert response.status_code == 409
    assert "nothing left to acknowledge" in response.content.decode()


def test_acknowledging_needs_the_csrf_token(operator, gpu):
    alert = AlertFactory(gpu=gpu)
    client = Client(enforce_csrf_checks=True)
    client.force_login(operator)
    assert client.post(reverse("monitoring-alert-acknowledge", kwargs={"pk": alert.pk})).status_code == 403
    alert.refresh_from_db()
    assert alert.acknowledged_at is None


def test_viewing_without_changing_shows_no_button_and_refuses_the_post(client_for, staff_user, gpu):
    group = Group.objects.get(name=PlatformRole.APPROVER)
    group.permissions.add(Permission.objects.get(content_type__app_label="monitoring", codename="view_alert"))
    viewer = client_for(staff_user("approver"))
    alert = AlertFactory(gpu=gpu)
    assert (
        "Acknowledge</button>"
        not in viewer.get(reverse("monitoring-alert", kwargs={"pk": alert.pk})).content.decode()
    )
    assert viewer.post(reverse("monitoring-alert-acknowledge", kwargs={"pk": alert.pk})).status_code == 404
    alert.refresh_from_db()
    assert alert.acknowledged_at is None


def test_the_rules_page_lists_each_rule_and_its_open_alerts(client_for, operator, gpu):
    AlertFactory(gpu=gpu)
    AlertFactory(gpu=gpu, resolved_at=timezone.now())
    AlertRuleFactory(
        name="Idle instance", kind="threshold", metric="sm_active_pct", comparison="below", threshold=3
    )
    page = client_for(operator).get(reverse("monitoring-rules")).content.decode()
    for name in ("GPU too hot", "Uncorrected ECC error", "XID error", "Node silent", "Agent silent",
                 "Billed pool idle", "Idle instance"):  # fmt: skip
        assert name in page
    assert "SM activity under 5 %" in page


ROUTES = [
    ("get", "monitoring-alerts", False),
    ("get", "monitoring-alert", True),
    ("post", "monitoring-alert-acknowledge", True),
    ("get", "monitoring-rules", False),
]


@pytest.mark.parametrize(("method", "name", "takes_pk"), ROUTES)
@pytest.mark.parametrize("who", ["acme_admin", "outsider", "finance"])
def test_anyone_but_operators_gets_a_404(client_for, tenancy, staff_user, gpu, method, name, takes_pk, who):
    alert = AlertFactory(gpu=gpu)
    user = staff_user("finance") if who == "finance" else getattr(tenancy, who)
    url = reverse(name, kwargs={"pk": alert.pk} if takes_pk else {})
    assert getattr(client_for(user), method)(url).status_code == 404
    assert reverse("monitoring-alerts") not in client_for(user).get("/", follow=True).content.decode()
    alert.refresh_from_db()
    assert alert.acknowledged_at is None


def test_signed_out_people_are_sent_to_sign_in(client, gpu):
    response = client.get(reverse("monitoring-alerts"))
    assert response.status_code == 302 and "/accounts/login/" in response["Location"]


@pytest.mark.parametrize("pk", [0, 999999, 10**30])
@pytest.mark.parametrize(
    ("method", "name"), [("get", "monitoring-alert"), ("post", "monitoring-alert-acknowledge")]
)
def test_an_unknown_alert_is_a_404(client_for, operator, pk, method, name):
    assert getattr(client_for(operator), method)(reverse(name, kwargs={"pk": pk})).status_code == 404
