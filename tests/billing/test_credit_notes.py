"""Credit notes: the only correction of an issued invoice. Numbered in their own gap-free series, taxed at
the invoice's rate, never more than the invoice (even two at once), never changed or deleted — the
database refuses it — and shown in the admin, the API and as a PDF."""

import io
import threading
from datetime import UTC, datetime, timedelta
from decimal import Decimal

import pytest
from django.db import DatabaseError, connection, transaction
from django.test.utils import CaptureQueriesContext
from django.urls import reverse

from billing.invoices import close_month, credit, issue, void
from billing.models import BillingProfile, CreditNote, Invoice, InvoiceSequence
from billing.services import meter
from portal.errors import Conflict, InvalidInput
from tests.factories import PoolFactory, PriceFactory

NOVEMBER_START = datetime(2026, 10, 31, 15, tzinfo=UTC)  # 1 November in Seoul
AFTER = datetime(2026, 11, 30, 17, tzinfo=UTC)


def november_invoices(tenancy) -> dict[str, Invoice]:
    """Draft invoices of acme (6 GPU-hours: 25200 + 2520 tax = 27720 KRW) and globex (4200 + 420)."""
    PriceFactory(
        gpu_model="H100-80GB",
        profile="full",
        hourly_price=Decimal("4200"),
        valid_from=NOVEMBER_START - timedelta(days=1),
    )
    for project, count in ((tenancy.vision, 2), (tenancy.recsys, 1)):
        PoolFactory(
            allocated=True,
            project=project,
            request__items=[("h100-80gb.full", count)],
            reserved_at=NOVEMBER_START,
            released_at=NOVEMBER_START + timedelta(hours=3 if count == 2 else 1),
            state="released",
        )
    meter(now=AFTER)
    closing = close_month("2026-11", now=AFTER)
    return {invoice.tenant.slug: invoice for invoice in closing.created}


@pytest.fixture
def invoice(tenancy) -> Invoice:
    BillingProfile.objects.create(tenant=tenancy.acme, legal_name="에이크미 주식회사", po_number="PO-42")
    return issue(invoice_id=november_invoices(tenancy)["acme"].pk, at=AFTER)


def test_a_credit_note_carries_the_invoices_tax_and_its_own_gap_free_numbers(invoice, tenancy):
    first = credit(invoice_id=invoice.pk, amount=Decimal("1000"), reason="two hours of a broken GPU",
                   by=tenancy.acme_admin, at=AFTER)  # fmt: skip
    assert (first.number, first.subtotal, first.tax, first.total) == ("CN-2026-00001", 1000, 100, 1100)
    assert (first.currency, first.tax_rate, first.issued_at) == ("KRW", Decimal("10"), AFTER)
    with pytest.raises(InvalidInput):
        credit(invoice_id=invoice.pk, amount=Decimal("0"), reason="nothing", at=AFTER)
    second = credit(invoice_id=invoice.pk, amount=Decimal("1005"), reason="again", at=AFTER)
    assert (second.number, second.tax, second.total) == ("CN-2026-00002", Decimal("101"), Decimal("1106"))
    # the invoices' series goes on from where it was, untouched by the credit notes
    invoice.refresh_from_db()
    globex = Invoice.objects.get(tenant=tenancy.globex)
    assert (invoice.number, issue(invoice_id=globex.pk, at=AFTER).number) == ("2026-00001", "2026-00002")
    assert dict(InvoiceSequence.objects.values_list("series", "last")) == {"": 2, "CN": 2}
    # a new year starts each series at one
    next_year = credit(
        invoice_id=invoice.pk, amount=Decimal("1"), reason="late", at=AFTER + timedelta(days=40)
    )
    assert next_year.number == "CN-2027-00001"


def test_the_database_refuses_to_change_or_delete_a_credit_note(invoice, tenancy):
    note = credit(invoice_id=invoice.pk, amount=Decimal("1000"), reason="broken GPU", by=tenancy.acme_admin)
    note.reason = "something else"
    with pytest.raises(DatabaseError, match="cannot change"), transaction.atomic():
        note.save()
    with pytest.raises(DatabaseError, match="cannot change"), transaction.atomic():
        CreditNote.objects.filter(pk=note.pk).update(subtotal=Decimal("1"), tax=0, total=Decimal("1"))
    with pytest.raises(DatabaseError, match="cannot be deleted"), transaction.atomic():
        CreditNote.objects.get(pk=note.pk).delete()
    with pytest.raises(DatabaseError, match="cannot be deleted"), transaction.atomic():
        CreditNote.objects.all().delete()
    with pytest.raises(DatabaseError, match="cannot be credited"), transaction.atomic():
        draft = Invoice.objects.get(tenant=tenancy.globex)
        CreditNote.objects.create(invoice=draft, number="CN-X", currency="KRW", tax_rate=10, subtotal=10,
                                  tax=1, total=11, reason="behind the service", issued_at=AFTER)  # fmt: skip
    note.refresh_from_db()
    assert (note.reason, note.total) == ("broken GPU", Decimal("1100"))
    # Who issued it is forgotten when that person's account goes; nothing else changes.
    tenancy.acme_admin.delete()
    note.refresh_from_db()
    assert (note.issued_by, note.number, note.total) == (None, "CN-2026-00001", Decimal("1100"))


@pytest.mark.parametrize(
    ("amount", "reason", "error", "field", "words"),
    [
        (Decimal("0"), "x", InvalidInput, "amount", "more than zero"),
        (Decimal("-5"), "x", InvalidInput, "amount", "more than zero"),
        (Decimal("12.5"), "x", InvalidInput, "amount", "at most 0 decimal"),
        ("lots", "x", InvalidInput, "amount", "a number"),
        (Decimal("NaN"), "x", InvalidInput, "amount", "more than zero"),
        (Decimal("100"), "   ", InvalidInput, "reason", "Say why"),
        (Decimal("25201"), "x", Conflict, "amount", "27720 KRW (tax included) is left"),
    ],
)
def test_a_refused_credit_writes_nothing(invoice, amount, reason, error, field, words):
    with pytest.raises(error, match=words.replace("(", r"\(").replace(")", r"\)")) as refused:
        credit(invoice_id=invoice.pk, amount=amount, reason=reason)
    assert refused.value.field == field
    assert not CreditNote.objects.exists() and not InvoiceSequence.objects.filter(series="CN").exists()


def test_only_issued_or_paid_invoices_are_credited(invoice, tenancy):
    draft = Invoice.objects.get(tenant=tenancy.globex)
    with pytest.raises(Conflict, match="draft") as refused:
        credit(invoice_id=draft.pk, amount=Decimal("10"), reason="x")
    assert refused.value.field == "invoice"
    with pytest.raises(InvalidInput, match="Choose the invoice"):
        credit(invoice_id=10**9, amount=Decimal("10"), reason="x")
    void(invoice_id=invoice.pk, reason="duplicate")
    with pytest.raises(Conflict, match="void"):
        credit(invoice_id=invoice.pk, amount=Decimal("10"), reason="x")
    assert not CreditNote.objects.exists()


def test_credit_notes_never_add_up_to_more_than_their_invoice(invoice):
    credit(invoice_id=invoice.pk, amount=Decimal("20000"), reason="first")  # 22000 with tax
    with pytest.raises(Conflict, match="5720 KRW") as refused:
        credit(invoice_id=invoice.pk, amount=Decimal("5300"), reason="too much")  # 5830
    assert refused.value.field == "amount" and CreditNote.objects.count() == 1
    last = credit(invoice_id=invoice.pk, amount=Decimal("5200"), reason="the rest")  # 5720: all of it
    assert last.total == Decimal("5720")
    with pytest.raises(Conflict, match="0 KRW"):
        credit(invoice_id=invoice.pk, amount=Decimal("1"), reason="more")
    assert sum(n.total for n in CreditNote.objects.all()) == invoice.total


@pytest.mark.django_db(transaction=True, serialized_rollback=True)
def test_two_credits_at_once_that_together_exceed_the_invoice_cannot_both_be_issued(tenancy):
    BillingProfile.objects.create(tenant=tenancy.acme)
    invoice = issue(invoice_id=november_invoices(tenancy)["acme"].pk, at=AFTER)
    barrier = threading.Barrier(2)
    issued, refused, failures = [], [], []

    def run(reason):
        try:
            barrier.wait()
            issued.append(credit(invoice_id=invoice.pk, amount=Decimal("15000"), reason=reason))  # 16500
        except Conflict as error:
            refused.append(error)
        except Exception as error:  # reported below
            failures.append(error)
        finally:
            connection.close()

    threads = [threading.Thread(target=run, args=(f"credit {n}",)) for n in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert failures == []
    assert (len(issued), len(refused)) == (1, 1)
    assert "left to credit" in refused[0].message
    assert list(CreditNote.objects.values_list("number", flat=True)) == ["CN-2026-00001"]


def test_finance_credits_in_the_admin_with_each_refusal_beside_its_field(
    invoice, tenancy, staff_user, client
):
    finance = staff_user("finance")
    client.force_login(finance)
    url = reverse("admin:billing_creditnote_add")
    page = client.get(url)
    offered = [
        value for value, _label in page.context_data["adminform"].form.fields["invoice"].choices if value
    ]
    assert [int(str(value)) for value in offered] == [invoice.pk]  # not globex's draft

    too_much = client.post(url, {"invoice": invoice.pk, "amount": "30000", "reason": "broken GPU"})
    form = too_much.context_data["adminform"].form
    assert too_much.status_code == 200 and "left to credit" in form.errors["amount"][0]
    assert "left to credit" in too_much.content.decode()
    no_reason = client.post(url, {"invoice": invoice.pk, "amount": "1000", "reason": " "})
    assert "reason" in no_reason.context_data["adminform"].form.errors
    decimals = client.post(url, {"invoice": invoice.pk, "amount": "10.5", "reason": "x"})
    assert "decimal" in decimals.context_data["adminform"].form.errors["amount"][0]
    assert not CreditNote.objects.exists()

    done = client.post(url, {"invoice": invoice.pk, "amount": "1000", "reason": "broken GPU"})
    assert done.status_code == 302
    note = CreditNote.objects.get()
    assert (note.number, note.total, note.issued_by) == ("CN-2026-00001", Decimal("1100"), finance)

    change = reverse("admin:billing_creditnote_change", args=[note.pk])
    shown = client.get(change)
    assert shown.status_code == 200 and "broken GPU" in shown.content.decode()
    assert client.post(change, {"reason": "changed"}).status_code == 403
    assert client.post(reverse("admin:billing_creditnote_delete", args=[note.pk])).status_code == 403
    note.refresh_from_db()
    assert note.reason == "broken GPU"

    invoice_page = client.get(reverse("admin:billing_invoice_change", args=[invoice.pk])).content.decode()
    assert "CN-2026-00001" in invoice_page and "1100" in invoice_page


def test_the_api_shows_an_invoices_credit_notes_and_what_they_add_up_to(invoice, tenancy, api_for):
    client = api_for(tenancy.acme_admin)
    shown = client.get(f"/api/v1/invoices/{invoice.pk}/").json()
    assert (shown["credit_notes"], shown["credited"]) == ([], "0")
    credit(invoice_id=invoice.pk, amount=Decimal("1000"), reason="broken GPU", at=AFTER)
    credit(invoice_id=invoice.pk, amount=Decimal("1005"), reason="again", at=AFTER + timedelta(hours=1))
    shown = client.get(f"/api/v1/invoices/{invoice.pk}/").json()
    assert shown["credited"] == "2206" and shown["number"] == "2026-00001" and shown["total"] == "27720"
    first, second = shown["credit_notes"]
    assert first == {"number": "CN-2026-00001", "issued_at": "2026-11-30T17:00:00Z", "subtotal": "1000",
                     "tax": "100", "total": "1100", "reason": "broken GPU"}  # fmt: skip
    assert (second["number"], second["tax"], second["total"]) == ("CN-2026-00002", "101", "1106")
    assert api_for(tenancy.globex_member).get(f"/api/v1/invoices/{invoice.pk}/").status_code == 404


def test_listing_invoices_does_not_query_once_per_credit_note(invoice, tenancy, api_for):
    client = api_for(tenancy.acme_admin)
    credit(invoice_id=invoice.pk, amount=Decimal("10"), reason="one")
    with CaptureQueriesContext(connection) as few:
        client.get("/api/v1/invoices/")
    for n in range(5):
        credit(invoice_id=invoice.pk, amount=Decimal("10"), reason=f"more {n}")
    with CaptureQueriesContext(connection) as many:
        listed = client.get("/api/v1/invoices/").json()
    assert len(listed["results"][0]["credit_notes"]) == 6
    assert len(many) == len(few)


def test_a_credit_note_reads_back_as_a_pdf(invoice):
    from pypdf import PdfReader

    from billing.exports import credit_note_filename, credit_note_pdf

    note = credit(invoice_id=invoice.pk, amount=Decimal("1005"), reason="세 시간 GPU 고장", at=AFTER)
    assert credit_note_filename(note) == "credit-note-CN-2026-00001-acme.pdf"
    reader = PdfReader(io.BytesIO(credit_note_pdf(note)))
    text = "".join(page.extract_text() for page in reader.pages).replace("\x00", "")
    for word in ("CN-2026-00001", "2026-00001", "2026-11", "에이크미 주식회사", "PO-42", "세 시간 GPU 고장",
                 "1005", "101", "1106", "2026-12-01"):  # fmt: skip
        assert word in text, word
