"""The audit trail's page: platform staff read it newest first, filter it, are told why a filter is bad,
and export exactly its rows as CSV, never a formula; tenants do not find it."""

import csv
import io
from datetime import timedelta

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.urls import reverse
from django.utils import timezone

from portal import audit
from tests.factories import TenantFactory, UserFactory


@pytest.fixture
def entries(db, tenancy, approver):
    """Three entries: two of acme's (a decision by the approver, a step of the portal), one of no tenant."""
    now = timezone.now()
    made = [
        audit.record(
            "request.approved", summary="Request #%(request)s: approved", values={"request": 1},
            actor=approver, tenant_id=tenancy.acme.pk, at=now - timedelta(days=3),
        ),
        audit.record(
            "pool.active", summary="Pool #%(pool)s: active", values={"pool": 2},
            tenant_id=tenancy.globex.pk, at=now - timedelta(days=1),
        ),
        audit.record("gpu.drained", summary="GPU %(index)s drained", values={"index": 5}, at=now),
    ]  # fmt: skip
    return made


def actions_on(response) -> list[str]:
    assert response.status_code == 200
    return [entry.action for entry, _summary in response.context["rows"]]


@pytest.mark.parametrize("role", ["approver", "operator", "finance"])
def test_each_platform_role_reads_the_audit_newest_first(role, entries, staff_user, client):
    client.force_login(staff_user(role) if role != "approver" else entries[0].actor)
    response = client.get(reverse("audit"))
    assert actions_on(response) == ["gpu.drained", "pool.active", "request.approved"]
    assert reverse("audit").encode() in client.get(reverse("home"), follow=True).content  # the top-bar link


@pytest.mark.parametrize(
    ("query", "expected"),
    [
        ({"action": "pool.active"}, ["pool.active"]),
        ({"action": "request"}, ["request.approved"]),
        ({"action": "pool.released"}, []),
        ({"tenant": "acme"}, ["request.approved"]),
        ({"actor": "staff-approver"}, ["request.approved"]),
        ({"q": "gpu 5"}, ["gpu.drained"]),
        ({"since": "{two_days_ago}"}, ["gpu.drained", "pool.active"]),
        ({"until": "{two_days_ago}"}, ["request.approved"]),
        ({"since": "{two_days_ago}", "until": "{two_days_ago}"}, []),
    ],
)
def test_the_filters_select_the_rows(query, expected, entries, client):
    day = f"{timezone.localdate() - timedelta(days=2):%Y-%m-%d}"
    client.force_login(entries[0].actor)
    query = {key: value.replace("{two_days_ago}", day) for key, value in query.items()}
    assert actions_on(client.get(reverse("audit"), query)) == expected


@pytest.mark.parametrize(
    ("query", "words"),
    [
        ({"action": "DROP TABLE"}, "An action is a code"),
        ({"tenant": "nobody"}, "No tenant has the short name nobody"),
        ({"actor": "ghost"}, "No one has the user name ghost"),
        ({"since": "2026-13-01"}, "valid date"),
        ({"since": "2026-05-02", "until": "2026-05-01"}, "ends before it starts"),
        ({"until": "9999-12-31"}, "from 1970 to 9998"),
        ({"q": "x" * 201}, "at most 200"),
        ({"format": "xml"}, "Unknown format"),
        ({"format": "csv", "tenant": "nobody"}, "No tenant has the short name nobody"),
    ],
)
def test_bad_filters_answer_400_saying_why(query, words, entries, client):
    client.force_login(entries[0].actor)
    response = client.get(reverse("audit"), query)
    assert response.status_code == 400
    assert words in response.content.decode()


def test_the_csv_holds_exactly_the_filtered_rows_under_a_stable_header(entries, client, tenancy):
    audit.record("request.rejected", summary="%(text)s", values={"text": "=cmd()"}, tenant_id=tenancy.acme.pk)
    client.force_login(entries[0].actor)
    response = client.get(reverse("audit"), {"format": "csv", "tenant": "acme"})
    assert response.status_code == 200 and response["Content-Type"].startswith("text/csv")
    rows = list(csv.reader(io.StringIO(b"".join(response.streaming_content).decode())))
    assert rows[0] == ["at", "action", "actor", "tenant", "subject_kind", "subject_id", "summary", "details"]
    assert [(r[1], r[2], r[3], r[6]) for r in rows[1:]] == [
        ("request.rejected", "", "acme", "'=cmd()"),  # never a formula in a spreadsheet
        ("request.approved", "staff-approver", "acme", "Request #1: approved"),
    ]
    everything = client.get(reverse("audit"), {"format": "csv"})
    assert len(list(csv.reader(io.StringIO(b"".join(everything.streaming_content).decode())))) == 5


@pytest.mark.parametrize("username", ["+1", "-2+3", "@SUM", "-cmd"])
def test_no_cell_of_the_csv_runs_as_a_formula(username, entries, client, tenancy):
    # A user name may start with + - or @; as the actor of an entry it must stay text too.
    actor = UserFactory(username=username)
    audit.record(
        "request.rejected", summary="%(text)s", values={"text": "\tX"}, actor=actor, subject=("", "-1")
    )
    client.force_login(entries[0].actor)
    response = client.get(reverse("audit"), {"format": "csv", "action": "request.rejected"})
    rows = list(csv.reader(io.StringIO(b"".join(response.streaming_content).decode())))
    assert [(r[2], r[5], r[6]) for r in rows[1:]] == [(f"'{username}", "'-1", "'\tX")]


@pytest.mark.parametrize("who", ["acme_admin", "acme_member", "outsider"])
def test_tenants_and_staff_without_the_permission_do_not_find_it(who, entries, tenancy, client):
    client.force_login(getattr(tenancy, who))
    assert client.get(reverse("audit")).status_code == 404
    assert client.get(reverse("audit"), {"format": "csv"}).status_code == 404
    assert reverse("audit").encode() not in client.get(reverse("home")).content
    client.force_login(UserFactory(username="bare-staff", is_staff=True))  # staff of no platform role
    assert client.get(reverse("audit")).status_code == 404


def test_the_page_reads_in_the_same_number_of_queries_for_more_entries(entries, client):
    client.force_login(entries[0].actor)

    def queries() -> int:
        with CaptureQueriesContext(connection) as captured:
            assert client.get(reverse("audit")).status_code == 200
        return len(captured)

    few = queries()
    for n in range(10):
        tenant = TenantFactory()
        audit.record("pool.active", summary="Pool #%(pool)s", values={"pool": n}, tenant_id=tenant.pk)
    assert queries() == few
