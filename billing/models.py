"""Billing records: price lists with their versioned hourly prices, and what metering wrote.

Prices per spec (a GPU model with a MIG profile, or `full`) are valid over a time range; two
prices of one spec never overlap (a PostgreSQL exclusion constraint), none is negative. Metering
copies the price in force onto each usage record, so a later price never rewrites metered usage.
"""

from __future__ import annotations

from decimal import Decimal

from django.contrib.postgres.constraints import ExclusionConstraint
from django.contrib.postgres.fields import DateTimeRangeField, RangeBoundary, RangeOperators
from django.db import models
from django.utils.translation import gettext_lazy as _

from billing.conf import settings
from pools.specs import Spec

MONEY = {"max_digits": 14, "decimal_places": 4}


class PriceList(models.Model):
    """A set of prices published together, e.g. "2027 list"; its prices say when each applies. Every
    price is in the deployment's currency (BILLING_CURRENCY)."""

    name = models.CharField(_("name"), max_length=100, unique=True)
    description = models.TextField(_("description"), blank=True)
    created_at = models.DateTimeField(_("created"), auto_now_add=True)

    class Meta:
        ordering = ["-created_at"]
        verbose_name = _("price list")
        verbose_name_plural = _("price lists")

    def __str__(self) -> str:
        return self.name


class TsTzRange(models.Func):
    function = "TSTZRANGE"
    output_field = DateTimeRangeField()


class Price(models.Model):
    price_list = models.ForeignKey(
        PriceList, on_delete=models.PROTECT, related_name="prices", verbose_name=_("price list")
    )
    gpu_model = models.CharField(_("GPU model"), max_length=32)
    profile = models.CharField(_("profile"), max_length=32, help_text=_("A MIG profile, or full."))
    hourly_price = models.DecimalField(_("hourly price"), **MONEY, help_text=_("Per instance (or GPU) hour."))
    valid_from = models.DateTimeField(_("valid from"))
    valid_to = models.DateTimeField(
        _("valid until"), null=True, blank=True, help_text=_("Empty: until changed.")
    )

    class Meta:
        ordering = ["gpu_model", "profile", "valid_from"]
        verbose_name = _("price")
        verbose_name_plural = _("prices")
        constraints = [
            models.CheckConstraint(condition=models.Q(hourly_price__gte=0), name="price_not_negative"),
            models.CheckConstraint(
                condition=models.Q(valid_to__isnull=True) | models.Q(valid_to__gt=models.F("valid_from")),
                name="price_range_not_empty",
            ),
            ExclusionConstraint(
                name="price_no_overlap",
                expressions=[
                    ("gpu_model", RangeOperators.EQUAL),
                    ("profile", RangeOperators.EQUAL),
                    (TsTzRange("valid_from", "valid_to", RangeBoundary()), RangeOperators.OVERLAPS),
                ],
            ),
        ]

    def __str__(self) -> str:
        return f"{self.spec.id} {self.hourly_price} from {self.valid_from:%Y-%m-%d %H:%M}"

    @property
    def spec(self) -> Spec:
        return Spec(self.gpu_model, self.profile)


class MeteredPeriod(models.Model):
    """A period metered in full: every pool that held anything in it has its usage records."""

    start = models.DateTimeField(_("period start"), unique=True)
    records = models.PositiveIntegerField(_("usage records written"), default=0)
    metered_at = models.DateTimeField(_("metered"), auto_now_add=True)

    class Meta:
        ordering = ["-start"]
        verbose_name = _("metered period")
        verbose_name_plural = _("metered periods")

    def __str__(self) -> str:
        return f"{self.start:%Y-%m-%d %H:%M} UTC"


class UsageRecord(models.Model):
    """Instance-seconds of one spec a pool held in one period, with the price in force then."""

    pool = models.ForeignKey(
        "pools.Pool", on_delete=models.PROTECT, related_name="usage", verbose_name=_("pool")
    )
    gpu_model = models.CharField(_("GPU model"), max_length=32)
    profile = models.CharField(_("profile"), max_length=32)
    period_start = models.DateTimeField(_("period start"))
    count = models.PositiveSmallIntegerField(_("instances"))
    seconds = models.PositiveIntegerField(_("instance-seconds"))
    unit_price = models.DecimalField(
        _("hourly price"), **MONEY, null=True, blank=True, help_text=_("Empty when no price was in force.")
    )
    currency = models.CharField(_("currency"), max_length=3)
    metered_at = models.DateTimeField(_("metered"), auto_now_add=True)

    class Meta:
        ordering = ["-period_start", "pool_id"]
        verbose_name = _("usage record")
        verbose_name_plural = _("usage records")
        constraints = [
            # A second, concurrent or late metering run writes nothing twice.
            models.UniqueConstraint(
                fields=["pool", "gpu_model", "profile", "period_start"], name="usage_once"
            ),
            models.CheckConstraint(condition=models.Q(seconds__gt=0), name="usage_seconds_positive"),
        ]
        indexes = [models.Index(fields=["period_start"], name="usage_period")]

    def __str__(self) -> str:
        return f"pool #{self.pool_id} {self.spec.id} {self.period_start:%Y-%m-%d %H:%M}: {self.seconds} s"

    @property
    def spec(self) -> Spec:
        return Spec(self.gpu_model, self.profile)


class BillingProfile(models.Model):
    """Who a tenant's invoices are addressed to, and the tax they carry."""

    tenant = models.OneToOneField(
        "portal.Tenant", on_delete=models.CASCADE, related_name="billing_profile", verbose_name=_("tenant")
    )
    legal_name = models.CharField(_("legal name"), max_length=200, blank=True)
    address = models.TextField(_("address"), blank=True)
    tax_id = models.CharField(_("tax ID"), max_length=64, blank=True)
    cost_centre = models.CharField(_("cost centre"), max_length=64, blank=True)
    po_number = models.CharField(_("PO number"), max_length=64, blank=True)
    contact_email = models.EmailField(_("billing contact e-mail"), blank=True)
    tax_rate = models.DecimalField(
        _("tax rate (%)"),
        max_digits=5,
        decimal_places=2,
        null=True,
        blank=True,
        help_text=_("Empty: the deployment's default (BILLING_TAX_RATE)."),
    )

    class Meta:
        verbose_name = _("billing profile")
        verbose_name_plural = _("billing profiles")
        constraints = [
            models.CheckConstraint(
                condition=models.Q(tax_rate__isnull=True) | models.Q(tax_rate__gte=0, tax_rate__lte=100),
                name="billing_profile_tax_rate_percent",
            )
        ]

    def __str__(self) -> str:
        return f"billing profile of {self.tenant}"


class InvoiceState(models.TextChoices):
    DRAFT = "draft", _("draft")
    ISSUED = "issued", _("issued")
    PAID = "paid", _("paid")
    VOID = "void", _("void")


class Invoice(models.Model):
    """One tenant's month. A draft may be rebuilt; once issued it never changes (a database trigger
    refuses it) except to be marked paid or void."""

    tenant = models.ForeignKey(
        "portal.Tenant", on_delete=models.PROTECT, related_name="invoices", verbose_name=_("tenant")
    )
    month = models.DateField(_("month"), help_text=_("Its first day, in the billing time zone."))
    state = models.CharField(
        _("state"), max_length=8, choices=InvoiceState.choices, default=InvoiceState.DRAFT
    )
    number = models.CharField(_("number"), max_length=20, null=True, blank=True, unique=True)
    currency = models.CharField(_("currency"), max_length=3)
    tax_rate = models.DecimalField(_("tax rate (%)"), max_digits=5, decimal_places=2)
    subtotal = models.DecimalField(_("subtotal"), **MONEY)
    tax = models.DecimalField(_("tax"), **MONEY)
    total = models.DecimalField(_("total"), **MONEY)
    created_at = models.DateTimeField(_("created"), auto_now_add=True)
    issued_at = models.DateTimeField(_("issued"), null=True, blank=True)
    paid_at = models.DateTimeField(_("paid"), null=True, blank=True)
    voided_at = models.DateTimeField(_("voided"), null=True, blank=True)
    void_reason = models.TextField(_("why void"), blank=True)

    class Meta:
        ordering = ["-month", "tenant_id"]
        verbose_name = _("invoice")
        verbose_name_plural = _("invoices")
        permissions = [
            ("issue_invoice", "Can issue, mark paid and void invoices"),
            ("export_invoice", "Can export invoices"),
        ]
        constraints = [
            models.UniqueConstraint(
                fields=["tenant", "month"], condition=~models.Q(state="void"), name="invoice_one_per_month"
            ),
            models.CheckConstraint(
                condition=models.Q(total=models.F("subtotal") + models.F("tax")), name="invoice_total_adds_up"
            ),
            # Issued and paid invoices carry their number, drafts none; a void one keeps what it had.
            models.CheckConstraint(
                condition=models.Q(state__in=["issued", "paid"], number__isnull=False)
                | models.Q(state="draft", number__isnull=True)
                | models.Q(state="void"),
                name="invoice_number_by_state",
            ),
        ]

    def __str__(self) -> str:
        return self.number or f"draft {self.tenant} {self.month:%Y-%m}"


class InvoiceLine(models.Model):
    invoice = models.ForeignKey(
        Invoice, on_delete=models.CASCADE, related_name="lines", verbose_name=_("invoice")
    )
    kind = models.CharField(_("kind"), max_length=8, choices=[("usage", _("usage")), ("tax", _("tax"))])
    project = models.ForeignKey(
        "portal.Project",
        on_delete=models.PROTECT,
        null=True,
        blank=True,
        related_name="+",
        verbose_name=_("project"),
    )
    gpu_model = models.CharField(_("GPU model"), max_length=32, blank=True)
    profile = models.CharField(_("profile"), max_length=32, blank=True)
    seconds = models.PositiveBigIntegerField(_("instance-seconds"), default=0)
    unit_price = models.DecimalField(_("hourly price"), **MONEY, null=True, blank=True)
    amount = models.DecimalField(_("amount"), **MONEY)

    class Meta:
        ordering = ["invoice_id", "kind", "project_id", "gpu_model", "profile", "pk"]
        verbose_name = _("invoice line")
        verbose_name_plural = _("invoice lines")

    def __str__(self) -> str:
        return f"{self.kind} {self.gpu_model} {self.profile}: {self.amount}"

    @property
    def hours(self) -> Decimal:
        return Decimal(self.seconds) / Decimal(3600)


class InvoiceSequence(models.Model):
    """The last number given in a year of one series (invoices: "", credit notes: "CN"): numbers are
    gap-free because they are taken under this row's lock in the transaction that issues."""

    INVOICES = ""
    CREDIT_NOTES = "CN"

    series = models.CharField(_("series"), max_length=8, blank=True, default=INVOICES)
    year = models.PositiveSmallIntegerField(_("year"))
    last = models.PositiveIntegerField(_("last number"), default=0)

    class Meta:
        verbose_name = _("invoice sequence")
        verbose_name_plural = _("invoice sequences")
        constraints = [models.UniqueConstraint(fields=["series", "year"], name="invoice_sequence_once")]

    def __str__(self) -> str:
        return f"{self.series or 'invoices'} {self.year}: {self.last}"


class CreditNote(models.Model):
    """A correction of an issued (or paid) invoice: an amount given back, with the invoice's tax on it.
    It is issued when it is made and never changes or goes away (a database trigger refuses it); the
    credit notes of an invoice never add up to more than its total."""

    invoice = models.ForeignKey(
        Invoice, on_delete=models.PROTECT, related_name="credit_notes", verbose_name=_("invoice")
    )
    number = models.CharField(_("number"), max_length=20, unique=True)
    currency = models.CharField(_("currency"), max_length=3)
    tax_rate = models.DecimalField(_("tax rate (%)"), max_digits=5, decimal_places=2)
    subtotal = models.DecimalField(_("net amount"), **MONEY)
    tax = models.DecimalField(_("tax"), **MONEY)
    total = models.DecimalField(_("total"), **MONEY)
    reason = models.TextField(_("reason"))
    issued_at = models.DateTimeField(_("issued"))
    issued_by = models.ForeignKey(
        settings.AUTH_USER_MODEL,
        on_delete=models.SET_NULL,
        null=True,
        blank=True,
        related_name="+",
        verbose_name=_("issued by"),
    )

    class Meta:
        ordering = ["-issued_at", "-pk"]
        verbose_name = _("credit note")
        verbose_name_plural = _("credit notes")
        constraints = [
            models.CheckConstraint(
                condition=models.Q(subtotal__gt=0, tax__gte=0, total__gt=0), name="credit_note_positive"
            ),
            models.CheckConstraint(
                condition=models.Q(total=models.F("subtotal") + models.F("tax")),
                name="credit_note_total_adds_up",
            ),
            models.CheckConstraint(condition=~models.Q(reason=""), name="credit_note_has_reason"),
        ]

    def __str__(self) -> str:
        return self.number


class InvoiceMail(models.Model):
    """That an invoice or a credit note was e-mailed (or had nobody to go to): at most once each, as the
    unique constraints say. Issued documents never change, so the fact is kept beside them."""

    invoice = models.OneToOneField(
        Invoice,
        on_delete=models.PROTECT,
        null=True,
        blank=True,
        related_name="mail",
        verbose_name=_("invoice"),
    )
    credit_note = models.OneToOneField(
        CreditNote,
        on_delete=models.PROTECT,
        null=True,
        blank=True,
        related_name="mail",
        verbose_name=_("credit note"),
    )
    recipients = models.TextField(_("sent to"), blank=True, help_text=_("Empty: nobody to send it to."))
    sent_at = models.DateTimeField(_("sent"))

    class Meta:
        ordering = ["-sent_at"]
        verbose_name = _("invoice e-mail")
        verbose_name_plural = _("invoice e-mails")
        constraints = [
            models.CheckConstraint(
                condition=models.Q(invoice__isnull=False, credit_note__isnull=True)
                | models.Q(invoice__isnull=True, credit_note__isnull=False),
                name="invoice_mail_of_one_document",
            )
        ]

    def __str__(self) -> str:
        return f"{self.invoice or self.credit_note} → {self.recipients or '—'}"


class Budget(models.Model):
    """What a tenant (or one of its projects) means to spend in a calendar month of billing's time zone, in
    billing's currency. Its admins are warned as the month's projection reaches 80 % and 100 % of it; a hard
    budget also holds any request that would take the projection past it until an approver overrides."""

    tenant = models.ForeignKey(
        "portal.Tenant", on_delete=models.CASCADE, related_name="budgets", verbose_name=_("tenant")
    )
    project = models.ForeignKey(
        "portal.Project",
        on_delete=models.CASCADE,
        null=True,
        blank=True,
        related_name="budgets",
        verbose_name=_("project"),
        help_text=_("Empty: the whole tenant."),
    )
    month_limit = models.DecimalField(_("monthly limit"), **MONEY)
    currency = models.CharField(_("currency"), max_length=3)
    hard = models.BooleanField(
        _("hard"), default=False, help_text=_("Requests that would pass it wait for an approver's override.")
    )
    updated_at = models.DateTimeField(_("updated"), auto_now=True)

    class Meta:
        ordering = ["tenant", "project"]
        verbose_name = _("budget")
        verbose_name_plural = _("budgets")
        constraints = [
            models.UniqueConstraint(
                fields=["tenant"], condition=models.Q(project__isnull=True), name="budget_one_per_tenant"
            ),
            models.UniqueConstraint(
                fields=["tenant", "project"],
                condition=models.Q(project__isnull=False),
                name="budget_one_per_project",
            ),
            models.CheckConstraint(condition=models.Q(month_limit__gte=0), name="budget_limit_not_negative"),
        ]

    def __str__(self) -> str:
        return f"budget of {self.project or self.tenant}: {self.month_limit} {self.currency}"
