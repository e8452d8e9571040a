"""A tenant's invoices page: its admins (and finance) see the issued, paid and void invoices, never a
draft, and download each as the API exports it; its other members are told why not; anyone else finds
nothing there."""

import csv
import io
from datetime import UTC, date, datetime, timedelta
from decimal import Decimal

import pytest
from django.urls import reverse

from billing import exports
from billing.invoices import close_month, issue
from billing.models import Invoice
from billing.services import meter
from tests.factories import InvoiceFactory, PoolFactory, PriceFactory

NOVEMBER_START = datetime(2026, 10, 31, 15, tzinfo=UTC)
AFTER = datetime(2026, 11, 30, 17, tzinfo=UTC)


def invoices_page(tenant="acme"):
    return reverse("tenant-invoices", kwargs={"tenant_slug": tenant})


def download(invoice, kind, tenant="acme"):
    return reverse("tenant-invoice-download", kwargs={"tenant_slug": tenant, "pk": invoice.pk, "kind": kind})


def invoice(tenant, month: date, state: str, number: str | None = None, total: str = "1000") -> Invoice:
    return InvoiceFactory(
        tenant=tenant,
        month=month,
        state=state,
        number=number,
        subtotal=Decimal(total),
        tax=Decimal(0),
        issued_at=None if state == "draft" else datetime(month.year, month.month, 3, tzinfo=UTC),
    )


@pytest.fixture
def months(tenancy):
    return {
        "draft": invoice(tenancy.acme, date(2026, 11, 1), "draft", total="999"),
        "issued": invoice(tenancy.acme, date(2026, 10, 1), "issued", "2026-00003", "27720"),
        "paid": invoice(tenancy.acme, date(2026, 9, 1), "paid", "2026-00002"),
        "void": invoice(tenancy.acme, date(2026, 8, 1), "void", "2026-00001"),
        "theirs": invoice(tenancy.globex, date(2026, 10, 1), "issued", "2026-00004"),
    }


def test_an_admin_sees_issued_paid_and_void_newest_month_first_never_a_draft(months, tenancy, client_for):
    response = client_for(tenancy.acme_admin).get(invoices_page())
    assert response.status_code == 200
    page = response.content.decode()
    positions = [page.index(number) for number in ("2026-00003", "2026-00002", "2026-00001")]
    assert positions == sorted(positions)
    assert "2026-10" in page and "27,720 KRW" in page and "2026-10-03" in page
    assert "2026-11" not in page and "999" not in page  # the draft is finance's
    assert "2026-00004" not in page  # globex's
    for kind in ("csv", "xlsx", "pdf"):
        assert download(months["issued"], kind) in page
    assert download(months["draft"], "csv") not in page


def test_the_list_is_paginated(tenancy, client_for, db):
    for index in range(30):
        invoice(tenancy.acme, date(2024 + index // 12, index % 12 + 1, 1), "issued", f"2026-{index:05d}")
    client = client_for(tenancy.acme_admin)
    first = client.get(invoices_page()).content.decode()
    second = client.get(invoices_page(), {"page": 2}).content.decode()
    assert first.count("<tr>") - 1 == 25 and second.count("<tr>") - 1 == 5  # less the heading row
    assert "2026-00029" in first and "2026-00000" in second and "Page 2 of 2" in second


@pytest.mark.parametrize("who", ["acme_member", "acme_viewer"])
def test_other_members_are_told_only_admins_see_invoices(who, months, tenancy, client_for):
    client = client_for(getattr(tenancy, who))
    for url in (invoices_page(), download(months["issued"], "csv")):
        response = client.get(url)
        assert response.status_code == 403
        assert "Only the admins of Acme see its invoices" in response.content.decode()
        assert "2026-00003" not in response.content.decode()


@pytest.mark.parametrize("who", ["globex_member", "outsider"])
def test_anyone_outside_the_tenant_finds_nothing(who, months, tenancy, client_for):
    client = client_for(getattr(tenancy, who))
    assert client.get(invoices_page()).status_code == 404
    assert client.get(download(months["issued"], "csv")).status_code == 404


def test_a_foreign_draft_or_unknown_file_is_not_found(months, tenancy, client_for, staff_user):
    client = client_for(tenancy.acme_admin)
    assert client.get(download(months["theirs"], "csv")).status_code == 404  # globex's, under acme
    assert client.get(download(months["draft"], "csv")).status_code == 404
    assert client.get(download(months["issued"], "docx")).status_code == 404
    finance = client_for(staff_user("finance"))
    assert finance.get(download(months["draft"], "csv")).status_code == 404  # a draft is not the tenant's yet


def test_finance_sees_the_page_and_other_staff_do_not(months, tenancy, client_for, staff_user):
    page = client_for(staff_user("finance")).get(invoices_page())
    assert page.status_code == 200 and "2026-00003" in page.content.decode()
    assert client_for(staff_user("approver")).get(invoices_page()).status_code == 403


@pytest.mark.parametrize(
    ("who", "shown"), [("acme_admin", True), ("acme_member", False), ("acme_viewer", False)]
)
def test_the_invoices_tab_shows_to_the_tenants_admins(who, shown, tenancy, client_for):
    page = client_for(getattr(tenancy, who)).get(reverse("tenant", kwargs={"slug": "acme"})).content.decode()
    assert (f'href="{invoices_page()}"' in page) == shown


@pytest.fixture
def issued(tenancy):
    PriceFactory(
        gpu_model="H100-80GB",
        profile="full",
        hourly_price=Decimal("4200"),
        valid_from=NOVEMBER_START - timedelta(1),
    )
    PoolFactory(
        allocated=True,
        project=tenancy.vision,
        request__items=[("h100-80gb.full", 2)],
        reserved_at=NOVEMBER_START,
        released_at=NOVEMBER_START + timedelta(hours=3),
        state="released",
    )
    meter(now=AFTER)
    closing = close_month("2026-11", now=AFTER)
    acme = next(i for i in closing.created if i.tenant_id == tenancy.acme.pk)
    return issue(invoice_id=acme.pk, at=AFTER)


def test_downloads_read_back_as_the_api_exports_them(issued, tenancy, client_for):
    from openpyxl import load_workbook
    from pypdf import PdfReader

    client = client_for(tenancy.acme_admin)
    expected = [["vision", "h100-80gb.full", "6.0000", "4200", "25200"]]

    response = client.get(download(issued, "csv"))
    assert response.status_code == 200 and response["Content-Type"] == exports.FORMATS["csv"]
    assert response["Content-Disposition"] == f'attachment; filename="{exports.filename(issued, "csv")}"'
    assert response.content == exports.as_csv(issued)
    table = list(csv.reader(io.StringIO(response.content.decode())))
    assert table[0][:2] == ["invoice", issued.number] and table[2:3] == expected

    response = client.get(download(issued, "xlsx"))
    assert response.status_code == 200 and response["Content-Type"] == exports.FORMATS["xlsx"]
    sheet = load_workbook(io.BytesIO(response.content)).active
    rows = [list(row[:5]) for row in sheet.iter_rows(min_row=3, max_row=3, values_only=True)]
    assert rows == [["vision", "h100-80gb.full", 6, 4200, 25200]]

    response = client.get(download(issued, "pdf"))
    assert response.status_code == 200 and response["Content-Type"] == "application/pdf"
    text = "".join(page.extract_text() for page in PdfReader(io.BytesIO(response.content)).pages)
    text = text.replace("\x00", "")  # the CJK font's text comes back with NULs between letters
    assert issued.number in text and "25200" in text.replace(",", "")


def test_an_admin_sees_the_credit_notes_of_an_invoice_and_downloads_them(months, tenancy, client_for):
    from billing.invoices import credit

    note = credit(invoice_id=months["issued"].pk, amount=Decimal("1000"), reason="node down on the 9th")
    theirs = credit(invoice_id=months["theirs"].pk, amount=Decimal("10"), reason="theirs")
    page = client_for(tenancy.acme_admin).get(invoices_page()).content.decode()
    assert note.number in page and "node down on the 9th" in page and "−1,100 KRW" in page
    assert theirs.number not in page

    def pdf(pk):
        return reverse("tenant-credit-note-pdf", kwargs={"tenant_slug": "acme", "pk": pk})

    answer = client_for(tenancy.acme_admin).get(pdf(note.pk))
    assert answer.status_code == 200 and answer.content[:4] == b"%PDF"
    assert client_for(tenancy.acme_admin).get(pdf(theirs.pk)).status_code == 404
    assert client_for(tenancy.acme_member).get(pdf(note.pk)).status_code == 403
    assert client_for(tenancy.globex_member).get(pdf(note.pk)).status_code == 404
