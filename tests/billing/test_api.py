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
        allocated=True,
        project=tenancy.vision,
        request__items=[("h100-80gb.full", 2)],
        reserved_at=NOVEMBER_START,
        released_at=NOVEMBER_START + timedelta(hours=3),
        state="released",
    )
    theirs = PoolFactory(
        allocated=True,
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
    assert shown["month"] == "2026-11"
    # Money in the currency's minor unit (none for KRW), the unit price as it was set.
    assert (shown["subtotal"], shown["tax"], shown["total"]) == ("25200", "2520", "27720")
    lines = {line["kind"]: line for line in shown["lines"]}
    assert len(shown["lines"]) == 2
    assert (lines["usage"]["amount"], lines["usage"]["unit_price"], lines["usage"]["hours"]) == (
        "25200",
        "4200",
        "6.0000",
    )
    assert (lines["tax"]["amount"], lines["tax"]["unit_price"]) == ("2520", None)
    assert api_for(tenancy.acme_member).get(f"/api/v1/invoices/{acme.pk}/").status_code == 404
    assert api_for(tenancy.globex_member).get(f"/api/v1/invoices/{acme.pk}/").status_code == 404


@pytest.fixture
def issued(billed, tenancy):
    from billing.models import BillingProfile

    BillingProfile.objects.create(
        tenant=tenancy.acme,
        legal_name="에이크미 주식회사",
        tax_id="123-45-67890",
        cost_centre="CC-7",
        po_number="PO-42",
    )
    closing = close_month("2026-11", now=AFTER)
    acme = next(i for i in closing.created if i.tenant_id == tenancy.acme.pk)
    return issue(invoice_id=acme.pk, at=AFTER)


def test_an_invoice_exports_as_csv_xlsx_and_pdf_that_read_back_the_same(issued, tenancy, api_for):
    import csv
    import io

    from openpyxl import load_workbook
    from pypdf import PdfReader

    client = api_for(tenancy.acme_admin)
    url = f"/api/v1/invoices/{issued.pk}/export/"
    expected = [["vision", "h100-80gb.full", "6.0000", "4200", "25200"]]

    response = client.get(url, {"format": "csv"})
    assert response.status_code == 200 and response["Content-Type"].startswith("text/csv")
    assert "2026-00001" in response["Content-Disposition"]
    table = list(csv.reader(io.StringIO(response.content.decode())))
    assert table[0][:2] == ["invoice", "2026-00001"] and table[1] == [
        "project",
        "spec",
        "hours",
        "unit_price",
        "amount",
    ]
    assert table[2:3] == expected and table[-1] == ["", "total", "", "", "27720"]

    sheet = load_workbook(io.BytesIO(client.get(url, {"format": "xlsx"}).content)).active
    values = [[cell.value for cell in row] for row in sheet.iter_rows()]
    assert values[2][:2] == ["vision", "h100-80gb.full"] and Decimal(str(values[2][4])) == Decimal("25200")
    assert values[-1][1] == "total" and Decimal(str(values[-1][4])) == Decimal("27720")

    pdf = client.get(url, {"format": "pdf"})
    assert pdf["Content-Type"] == "application/pdf"
    text = "".join(page.extract_text() for page in PdfReader(io.BytesIO(pdf.content)).pages).replace(
        "\x00", ""
    )
    for word in ("2026-00001", "에이크미 주식회사", "PO-42", "h100-80gb.full", "25200", "2520", "27720"):
        assert word in text


@pytest.mark.parametrize("query", ["?format=doc", "?format=json", ""])
def test_an_export_format_not_offered_is_a_400_that_names_them(query, issued, tenancy, api_for):
    response = api_for(tenancy.acme_admin).get(f"/api/v1/invoices/{issued.pk}/export/{query}")
    assert response.status_code == 400
    assert "csv, xlsx, pdf" in response.json()["format"][0]


def test_nobody_else_exports_a_tenants_invoice(issued, tenancy, api_for):
    for user in (tenancy.acme_member, tenancy.globex_member):
        assert api_for(user).get(f"/api/v1/invoices/{issued.pk}/export/?format=csv").status_code == 404
