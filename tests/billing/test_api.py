"""The billing API: usage per pool and spec for members of its tenant and finance; invoices for a
tenant's admins (issued ones) and finance (all)."""

from datetime import UTC, datetime, timedelta
from decimal import Decimal

import pytest

from billing.invoices import close_month, issue
from billing.services import meter
from tests.factories import PoolFactory, PriceFactory

NOVEMBER_START = datetime(2026, 10, 31, 15, tzinfo=UTC)
AFTER = datetime(2026, 11, 30, 17, tzinfo=UTC)


@pytest.fixture
def billed(tenancy):
    PriceFactory(
        gpu_model="H100-80GB",
        profile="full",
        hourly_price=Decimal("4200"),
        valid_from=NOVEMBER_START - timedelta(days=1),
    )
    mine = PoolFactory(
        project=tenancy.vision,
        request__items=[("h100-80gb.full", 2)],
        reserved_at=NOVEMBER_START,
        released_at=NOVEMBER_START + timedelta(hours=3),
        state="released",
    )
    theirs = PoolFactory(
        project__tenant=tenancy.globex,
        request__items=[("h100-80gb.full", 1)],
        reserved_at=NOVEMBER_START,
        released_at=NOVEMBER_START + timedelta(hours=1),
        state="released",
    )
    meter(now=AFTER)
    return mine, theirs


def test_members_see_their_tenants_usage_per_pool_and_spec(billed, tenancy, api_for):
    mine, _theirs = billed
    rows = api_for(tenancy.acme_viewer).get("/api/v1/usage/?month=2026-11").json()
    assert rows["count"] == 1
    (row,) = rows["results"]
    assert (row["pool"], row["spec"], row["seconds"], row["hours"]) == (
        mine.pk,
        "h100-80gb.full",
        6 * 3600,
        "6.0000",
    )
    assert (row["amount"], row["currency"]) == ("25200", "KRW")
    assert api_for(tenancy.acme_viewer).get("/api/v1/usage/?month=2026-11&project=nope").json()["count"] == 0
    assert api_for(tenancy.acme_viewer).get("/api/v1/usage/").json()["count"] == 0  # this month: nothing


def test_finance_sees_every_tenants_usage(billed, staff_user, api_for):
    assert api_for(staff_user("finance")).get("/api/v1/usage/?month=2026-11").json()["count"] == 2


@pytest.mark.parametrize("month", ["2026-13", "11-2026", "x"])
def test_a_bad_month_is_a_400(month, tenancy, api_for, db):
    response = api_for(tenancy.acme_viewer).get(f"/api/v1/usage/?month={month}")
    assert response.status_code == 400 and "YYYY-MM" in response.json()["month"][0]


def test_tenant_admins_see_their_issued_invoices_and_finance_sees_all(billed, tenancy, staff_user, api_for):
    closing = close_month("2026-11", now=AFTER)
    acme = next(i for i in closing.created if i.tenant_id == tenancy.acme.pk)
    assert api_for(tenancy.acme_admin).get("/api/v1/invoices/").json()["count"] == 0  # a draft is finance's
    assert api_for(staff_user("finance")).get("/api/v1/invoices/").json()["count"] == 2
    issue(invoice_id=acme.pk, at=AFTER)
    listed = api_for(tenancy.acme_admin).get("/api/v1/invoices/").json()
    assert [i["number"] for i in listed["results"]] == ["2026-00001"]
    shown = api_for(tenancy.acme_admin).get(f"/api/v1/invoices/{acme.pk}/").json()
    assert shown["month"] == "2026-11" and Decimal(shown["total"]) == Decimal("27720")
    assert [line["kind"] for line in shown["lines"]] == ["tax", "usage"] or len(shown["lines"]) == 2
    assert api_for(tenancy.acme_member).get(f"/api/v1/invoices/{acme.pk}/").status_code == 404
    assert api_for(tenancy.globex_member).get(f"/api/v1/invoices/{acme.pk}/").status_code == 404
