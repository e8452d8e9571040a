"""Budgets through the API and the budgets page: GET lists what each person may see with the month's
figures, paginated; PUT creates or replaces a budget for a tenant's admins only (another tenant answers
404); bad input is a 400 on the field at fault and changes nothing."""

from decimal import Decimal

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.urls import reverse

from billing.budgets.services import set_budget
from billing.models import Budget
from portal.models import Role
from tests.factories import MembershipFactory, ProjectFactory

URL = "/api/v1/budgets/"


def put(client, **body):
    return client.put(
        URL, {"tenant": "acme", "month_limit": "1500000", "currency": "KRW", **body}, format="json"
    )


def test_an_admin_puts_a_budget_and_puts_it_again_to_replace_it(tenancy, api_for):
    client = api_for(tenancy.acme_admin)
    created = put(client, hard=True)
    assert created.status_code == 200
    row = created.json()
    assert row["tenant"] == "acme" and row["project"] is None and row["hard"] is True
    assert row["currency"] == "KRW" and row["projected"] == "0" and row["spent_to_date"] == "0"
    assert Decimal(row["month_limit"]) == Decimal(1500000)
    replaced = put(client, month_limit="2000000")
    assert replaced.status_code == 200 and replaced.json()["hard"] is False
    project = put(client, project="vision", month_limit="10")
    assert project.status_code == 200 and project.json()["project"] == "vision"
    assert sorted(Budget.objects.values_list("month_limit", flat=True)) == [Decimal(10), Decimal(2000000)]


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"month_limit": "-5"}, "month_limit"),
        ({"month_limit": "many"}, "month_limit"),
        ({"currency": "USD"}, "currency"),
        ({"project": "nowhere"}, "project"),
        ({"project": "recsys"}, "project"),  # globex's
        ({"hard": "perhaps"}, "hard"),
    ],
)
def test_bad_input_is_a_400_on_its_field_and_changes_nothing(tenancy, api_for, body, field):
    answer = put(api_for(tenancy.acme_admin), **body)
    assert answer.status_code == 400 and field in answer.json()
    assert not Budget.objects.exists()


@pytest.mark.parametrize(
    ("who", "tenant", "status"),
    [
        ("acme_member", "acme", 403),  # a member, not an admin
        ("acme_viewer", "acme", 403),
        ("acme_admin", "globex", 404),  # another tenant: as if it did not exist
        ("acme_admin", "no-such-tenant", 404),
        ("outsider", "acme", 404),
    ],
)
def test_only_the_tenants_admins_put_its_budgets(tenancy, api_for, who, tenant, status):
    answer = put(api_for(getattr(tenancy, who)), tenant=tenant)
    assert answer.status_code == status and "detail" in answer.json()
    assert not Budget.objects.exists()


def test_finance_puts_no_budget(tenancy, staff_user, api_for):
    assert put(api_for(staff_user("finance"))).status_code == 403


def test_each_sees_the_budgets_of_their_tenants_paginated(tenancy, staff_user, api_for):
    globex_admin = MembershipFactory(tenant=tenancy.globex, role=Role.ADMIN).user
    set_budget(actor=tenancy.acme_admin, tenant=tenancy.acme, month_limit=100, currency="KRW")
    set_budget(
        actor=tenancy.acme_admin, tenant=tenancy.acme, project=tenancy.vision, month_limit=50, currency="KRW"
    )
    set_budget(actor=globex_admin, tenant=tenancy.globex, month_limit=7, currency="KRW")

    def listed(user, query=""):
        answer = api_for(user).get(URL + query)
        assert answer.status_code == 200
        return answer.json()

    assert [(r["tenant"], r["project"]) for r in listed(tenancy.acme_admin)["results"]] == [
        ("acme", None),
        ("acme", "vision"),
    ]
    assert listed(tenancy.acme_member)["count"] == 0  # budgets are the admins'
    assert [r["tenant"] for r in listed(globex_admin)["results"]] == ["globex"]
    everyone = listed(staff_user("finance"), "?limit=1&offset=1")
    assert everyone["count"] == 3 and len(everyone["results"]) == 1 and everyone["next"]
    assert api_for(tenancy.acme_admin).get(URL + "?limit=-1").status_code == 400


def test_the_list_reads_a_fixed_number_of_queries_however_many_budgets(tenancy, staff_user, api_for):
    client = api_for(staff_user("finance"))

    def queries() -> int:
        with CaptureQueriesContext(connection) as seen:
            assert client.get(URL).status_code == 200
        return len(seen)

    set_budget(actor=tenancy.acme_admin, tenant=tenancy.acme, month_limit=1, currency="KRW")
    queries()  # the first request also reads what stays cached (the person's permissions)
    few = queries()
    for n in range(4):
        project = ProjectFactory(tenant=tenancy.acme, slug=f"more-{n}")
        set_budget(
            actor=tenancy.acme_admin, tenant=tenancy.acme, project=project, month_limit=n, currency="KRW"
        )
    assert queries() == few


# --- the budgets page -------------------------------------------------------------------------------------


def test_an_admin_sets_a_budget_on_the_page_and_a_bad_one_is_shown_its_error(tenancy, client_for):
    client = client_for(tenancy.acme_admin)
    url = reverse("tenant-budgets", kwargs={"tenant_slug": "acme"})
    assert "Set a budget" in client.get(url).content.decode()
    bad = client.post(url, {"project": "", "month_limit": "-3"})
    assert bad.status_code == 400 and "greater than or equal to 0" in bad.content.decode()
    assert not Budget.objects.exists()
    done = client.post(url, {"project": "vision", "month_limit": "250000", "hard": "on"})
    assert done.status_code == 302
    assert Budget.objects.get().project == tenancy.vision and Budget.objects.get().hard
    page = client.get(url).content.decode()
    assert "250,000" in page and "Remove" in page
    removed = client.post(
        reverse("tenant-budget-remove", kwargs={"tenant_slug": "acme"}), {"project": "vision"}
    )
    assert removed.status_code == 302 and not Budget.objects.exists()


def test_the_page_is_for_the_admins_and_another_tenants_is_not_found(tenancy, client_for):
    url = reverse("tenant-budgets", kwargs={"tenant_slug": "acme"})
    assert client_for(tenancy.acme_member).get(url).status_code == 403
    assert client_for(tenancy.acme_member).post(url, {"month_limit": "1"}).status_code == 403
    assert client_for(tenancy.globex_member).get(url).status_code == 404
    remove = reverse("tenant-budget-remove", kwargs={"tenant_slug": "acme"})
    set_budget(actor=tenancy.acme_admin, tenant=tenancy.acme, month_limit=1, currency="KRW")
    assert client_for(tenancy.acme_member).post(remove, {}).status_code == 403
    assert Budget.objects.exists()


def test_the_tenant_and_project_pages_show_their_budgets(tenancy, client_for):
    set_budget(actor=tenancy.acme_admin, tenant=tenancy.acme, month_limit=1234567, currency="KRW", hard=True)
    tenant_page = (
        client_for(tenancy.acme_member).get(reverse("tenant", kwargs={"slug": "acme"})).content.decode()
    )
    assert "Budgets in" in tenant_page and "1,234,567" in tenant_page
    project_page = (
        client_for(tenancy.acme_member)
        .get(reverse("project", kwargs={"tenant_slug": "acme", "slug": "vision"}))
        .content.decode()
    )
    assert "Budgets in" in project_page and "1,234,567" in project_page
    globex_page = client_for(tenancy.globex_member).get(reverse("tenant", kwargs={"slug": "globex"}))
    assert "Budgets in" not in globex_page.content.decode()
