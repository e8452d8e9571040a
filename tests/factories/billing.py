"""Factories of billing's given state: price lists, prices and invoices."""

from datetime import timedelta
from decimal import Decimal

import factory
from django.utils import timezone

from pools import mig
from tests.factories.tenancy import TenantFactory


class PriceListFactory(factory.django.DjangoModelFactory):
    """`PriceListFactory(name="2027 list")`."""

    class Meta:
        model = "billing.PriceList"
        django_get_or_create = ["name"]

    name = factory.Sequence(lambda n: f"price list {n}")


class PriceFactory(factory.django.DjangoModelFactory):
    """An hourly price of one spec, in force from a day ago until changed:
    `PriceFactory(gpu_model="H100-80GB", profile="1g.10gb", hourly_price=Decimal("600"))`."""

    class Meta:
        model = "billing.Price"

    price_list = factory.SubFactory(PriceListFactory)
    gpu_model = "H100-80GB"
    profile = mig.FULL_GPU
    hourly_price = factory.LazyFunction(lambda: Decimal("4200"))
    valid_from = factory.LazyFunction(lambda: timezone.now() - timedelta(days=1))
    valid_to = None


class InvoiceFactory(factory.django.DjangoModelFactory):
    """A tenant's invoice of a month as given state (usually a month before the one a test closes):
    `InvoiceFactory(tenant=acme, month=date(2026, 10, 1), subtotal=Decimal("10000"), tax=Decimal("1000"))`.
    Issued, paid and void ones get a number and the moments of their state; no lines."""

    class Meta:
        model = "billing.Invoice"

    tenant = factory.SubFactory(TenantFactory)
    month = factory.LazyFunction(lambda: timezone.now().date().replace(day=1))
    state = "draft"
    currency = "KRW"
    tax_rate = Decimal("10")
    subtotal = Decimal("0")
    tax = factory.LazyAttribute(
        lambda invoice: (invoice.subtotal * invoice.tax_rate / 100).quantize(Decimal(1))
    )
    total = factory.LazyAttribute(lambda invoice: invoice.subtotal + invoice.tax)
    # A series of its own, so that it never takes a number `billing.invoices.issue` would give.
    number = factory.LazyAttributeSequence(
        lambda invoice, n: None if invoice.state == "draft" else f"F{invoice.month.year}-{n + 1:05d}"
    )
    issued_at = factory.LazyAttribute(lambda invoice: None if invoice.state == "draft" else timezone.now())
    paid_at = factory.LazyAttribute(lambda invoice: timezone.now() if invoice.state == "paid" else None)
    voided_at = factory.LazyAttribute(lambda invoice: timezone.now() if invoice.state == "void" else None)
    void_reason = factory.LazyAttribute(lambda invoice: "test" if invoice.state == "void" else "")
