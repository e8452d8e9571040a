"""Journey 3: finance closes last month with a preview, issues an invoice, downloads its PDF and the
month's XLSX, and both files read back to the invoices the portal holds."""

import io
import re
from decimal import Decimal

import pytest
from openpyxl import load_workbook
from pypdf import PdfReader

from billing.models import Invoice
from billing.templatetags.money import money
from tests.billing.test_finance import _month_rows
from tests.billing.test_invoices import november  # noqa: F401  (the fixture)

from .conftest import JOURNEY, settle

pytestmark = JOURNEY
MONTH = "/billing/2026-11/"


@pytest.fixture
def finance(staff_user, november):  # noqa: F811
    """Finance, and November's two tenants metered past the month's end."""
    user = staff_user("finance")
    settle()
    return user, november


def test_finance_closes_a_month_issues_an_invoice_and_reads_back_its_files(
    journey, finance, client, settings
):
    user, (acme, globex) = finance
    page = journey.page
    journey.sign_in_with_cookie(client, user, settings)
    page.goto(journey.base + MONTH)
    journey.check_language()
    journey.shot("month")

    page.click(f"a.button[href='{MONTH}close/']")
    page.wait_for_url(f"**{MONTH}close/")
    journey.check_language()
    assert not Invoice.objects.exists()  # a preview writes nothing
    settle()
    journey.shot("close-preview")
    page.click("main form[method=post] button[type=submit]")
    page.wait_for_url(f"**{MONTH}")
    journey.check_language()
    drafts = {invoice.tenant_id: invoice for invoice in Invoice.objects.filter(state="draft")}
    settle()
    assert set(drafts) == {acme.pk, globex.pk}
    journey.shot("closed")

    invoice = drafts[acme.pk]
    page.click(f"a[href='/billing/invoices/{invoice.pk}/']")
    page.wait_for_url(f"**/billing/invoices/{invoice.pk}/")
    page.click(f"form[action='/billing/invoices/{invoice.pk}/issue/'] button")
    page.wait_for_selector(f"form[action='/billing/invoices/{invoice.pk}/paid/']")
    journey.check_language()
    invoice.refresh_from_db()
    settle()
    assert invoice.state == "issued" and invoice.number
    assert invoice.number in page.locator("main").inner_text()
    journey.shot("issued")

    with page.expect_download() as pdf:
        page.click(f"a[href='/api/v1/invoices/{invoice.pk}/export/?format=pdf']")
    assert pdf.value.suggested_filename.endswith(".pdf")
    text = "\n".join(p.extract_text() for p in PdfReader(pdf.value.path()).pages).replace("\x00", "")
    assert invoice.number in text and acme.name in text
    assert money(invoice.total, invoice.currency).replace(",", "") in text.replace(",", "")

    page.goto(journey.base + MONTH)
    with page.expect_download() as xlsx:
        page.click(f"a[href='{MONTH}export/xlsx/']")
    assert re.search(r"invoices-2026-11.*\.xlsx$", xlsx.value.suggested_filename)
    with open(xlsx.value.path(), "rb") as file:
        content = file.read()
    load_workbook(io.BytesIO(content))  # a workbook that opens
    rows = _month_rows(content, "xlsx")
    assert {row["tenant"] for row in rows} == {acme.slug, globex.slug}
    for held in Invoice.objects.all():
        mine = [row for row in rows if row["tenant"] == held.tenant.slug]
        assert sum(Decimal(row["amount"]) for row in mine if row["amount"]) == held.subtotal
        assert {row["invoice"] for row in mine} == {held.number or ""}
        assert {row["state"] for row in mine} == {held.state}
    settle()
