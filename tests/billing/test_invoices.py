"""Invoices: a month closed into drafts once it has ended and is metered, rebuilt safely, issued with
gap-free numbers, and never changed once issued — the database refuses it whatever writes."""

from datetime import UTC, datetime, timedelta
from decimal import Decimal

import pytest
from django.core.management import CommandError, call_command
from django.db import DatabaseError, transaction

from billing.invoices import close_month, issue, mark_paid, void
from billing.models import BillingProfile, Invoice, InvoiceLine, InvoiceState
from billing.services import meter
from portal.errors import Conflict, InvalidInput
from tests.factories import PoolFactory, PriceFactory, ProjectFactory

HOUR = timedelta(hours=1)
NOVEMBER = (datetime(2026, 10, 31, 15, tzinfo=UTC), datetime(2026, 11, 30, 15, tzinfo=UTC))  # in Seoul
AFTER = NOVEMBER[1] + timedelta(hours=2)


@pytest.fixture
def november(db):
    """Two tenants' pools in November (Seoul), priced, metered up to after the month's end."""
    start = NOVEMBER[0]
    PriceFactory(
        gpu_model="H100-80GB",
        profile="full",
        hourly_price=Decimal("4200"),
        valid_from=start - timedelta(days=30),
    )
    PriceFactory(
        gpu_model="H100-80GB",
        profile="1g.10gb",
        hourly_price=Decimal("600"),
        valid_from=start - timedelta(days=30),
    )
    acme, globex = ProjectFactory(tenant__slug="acme"), ProjectFactory(tenant__slug="globex")
    PoolFactory(
        allocated=True,
        project=acme,
        request__items=[("h100-80gb.full", 1)],
        reserved_at=start + 10 * HOUR,
        released_at=start + 20 * HOUR,
        state="released",
    )
    PoolFactory(
        allocated=True,
        project=acme,
        request__items=[("h100-80gb.mig-1g.10gb", 3)],
        reserved_at=start - 5 * HOUR,
        released_at=None,
    )
    PoolFactory(
        allocated=True,
        project=globex,
        request__items=[("h100-80gb.full", 2)],
        reserved_at=start + HOUR / 2,
        released_at=start + 3 * HOUR,
        state="released",
    )
    meter(now=AFTER)
    return acme.tenant, globex.tenant


def test_closing_a_month_bills_each_tenant_its_usage_with_tax(november):
    acme, globex = november
    closing = close_month("2026-11", now=AFTER)
    assert len(closing.created) == 2
    invoice = Invoice.objects.get(tenant=acme)
    usage = {(line.gpu_model, line.profile): line for line in invoice.lines.filter(kind="usage")}
    assert usage[("H100-80GB", "full")].seconds == 10 * 3600
    assert usage[("H100-80GB", "full")].amount == Decimal("42000")
    days = (NOVEMBER[1] - NOVEMBER[0]).days  # the MIG pool held 3 instances the whole month
    assert usage[("H100-80GB", "1g.10gb")].amount == Decimal(3 * days * 24 * 600)
    assert invoice.tax == (invoice.subtotal / 10).quantize(Decimal("1"))
    assert invoice.total == sum(line.amount for line in invoice.lines.all())
    assert Invoice.objects.get(tenant=globex).subtotal == Decimal(2 * 4200 * 2.5)


def test_closing_again_rebuilds_drafts_and_keeps_issued_invoices(november):
    acme, globex = november
    close_month("2026-11", now=AFTER)
    issued = issue(invoice_id=Invoice.objects.get(tenant=acme).pk)
    BillingProfile.objects.create(tenant=globex, tax_rate=Decimal("0"))
    again = close_month("2026-11", now=AFTER)
    assert [i.pk for i in again.kept] == [issued.pk] and len(again.rebuilt) == 1
    assert Invoice.objects.get(tenant=globex).tax == 0
    assert Invoice.objects.count() == 2 and InvoiceLine.objects.filter(invoice__tenant=globex).count() == 2


@pytest.mark.parametrize(
    ("month", "now", "words"),
    [
        ("2026-12", AFTER, "has not ended yet"),
        ("2027-01", AFTER, "has not ended yet"),
        ("2026-11", NOVEMBER[1] - timedelta(seconds=1), "has not ended yet"),
        ("2026/11", AFTER, "YYYY-MM"),
    ],
)
def test_a_month_not_over_or_badly_written_is_refused_and_nothing_is_written(month, now, words, november):
    with pytest.raises(InvalidInput, match=words):
        close_month(month, now=now)
    assert not Invoice.objects.exists()


def test_a_month_not_yet_metered_to_its_end_is_refused(db):
    PoolFactory(allocated=True, reserved_at=NOVEMBER[1] - 3 * HOUR, released_at=None)
    meter(now=NOVEMBER[1] - HOUR)
    with pytest.raises(InvalidInput, match=r"run manage\.py meter"):
        close_month("2026-11", now=AFTER)
    with pytest.raises(CommandError, match="has not ended yet"):
        call_command("close_month", "2099-01")


def test_numbers_are_given_at_issue_without_gaps_per_year(november):
    close_month("2026-11", now=AFTER)
    first, second = Invoice.objects.order_by("tenant__slug")
    assert first.number is None
    issued = [issue(invoice_id=second.pk, at=AFTER), issue(invoice_id=first.pk, at=AFTER)]
    assert [i.number for i in issued] == ["2026-00001", "2026-00002"]
    with pytest.raises(Conflict, match="issued already"):
        issue(invoice_id=first.pk)


def test_an_issued_invoice_never_changes_whatever_writes_to_it(november):
    close_month("2026-11", now=AFTER)
    invoice = issue(invoice_id=Invoice.objects.first().pk, at=AFTER)
    line = invoice.lines.first()
    attempts = [
        lambda: Invoice.objects.filter(pk=invoice.pk).update(
            total=Decimal("1"), subtotal=Decimal("1"), tax=0
        ),
        lambda: Invoice.objects.filter(pk=invoice.pk).update(number="2026-99999"),
        lambda: Invoice.objects.filter(pk=invoice.pk).update(state="draft"),
        lambda: Invoice.objects.filter(pk=invoice.pk).delete(),
        lambda: InvoiceLine.objects.filter(pk=line.pk).update(amount=Decimal("0")),
        lambda: InvoiceLine.objects.filter(pk=line.pk).delete(),
        lambda: InvoiceLine.objects.create(invoice=invoice, kind="usage", amount=Decimal("5")),
    ]
    for attempt in attempts:
        with pytest.raises(DatabaseError), transaction.atomic():
            attempt()
    invoice.refresh_from_db()
    assert invoice.state == InvoiceState.ISSUED and invoice.lines.count() == 3
    paid = mark_paid(invoice_id=invoice.pk)
    assert paid.state == InvoiceState.PAID
    with pytest.raises(Conflict):
        void(invoice_id=invoice.pk, reason="typo")
    with pytest.raises(DatabaseError), transaction.atomic():
        Invoice.objects.filter(pk=invoice.pk).update(state="issued")


def test_void_needs_a_reason_and_frees_the_month_for_a_new_draft(november):
    close_month("2026-11", now=AFTER)
    invoice = issue(invoice_id=Invoice.objects.first().pk, at=AFTER)
    with pytest.raises(InvalidInput, match="why"):
        void(invoice_id=invoice.pk, reason="  ")
    voided = void(invoice_id=invoice.pk, reason="wrong tax rate")
    assert (voided.state, voided.number, voided.void_reason) == ("void", invoice.number, "wrong tax rate")
    closing = close_month("2026-11", now=AFTER)
    assert len(closing.created) == 1  # the voided month gets a new draft; its number stays taken
    assert Invoice.objects.filter(tenant=invoice.tenant).count() == 2


def test_finance_issues_pays_and_voids_in_the_admin(november, staff_user, client):
    from django.urls import reverse

    close_month("2026-11", now=AFTER)
    client.force_login(staff_user("finance"))
    url = reverse("admin:billing_invoice_changelist")
    first, second = Invoice.objects.order_by("tenant__slug")
    post = {"action": "issue_selected", "_selected_action": [first.pk, second.pk]}
    assert "2 issued" in client.post(url, post, follow=True).content.decode()
    refused = client.post(url, {"action": "void_selected", "_selected_action": [first.pk]}, follow=True)
    assert "Say why" in refused.content.decode()
    voiding = {"action": "void_selected", "_selected_action": [first.pk], "reason": "duplicate"}
    assert "1 voided" in client.post(url, voiding, follow=True).content.decode()
    paying = {"action": "mark_paid_selected", "_selected_action": [first.pk, second.pk]}
    page = client.post(url, paying, follow=True).content.decode()
    assert "1 marked paid" in page and "Only an issued invoice" in page
    assert client.get(reverse("admin:billing_invoice_change", args=[first.pk])).status_code == 200
    assert client.post(reverse("admin:billing_invoice_delete", args=[second.pk])).status_code == 403
