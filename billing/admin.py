"""Django admin of billing: finance keeps price lists and billing profiles, acts on invoices and issues
credit notes; usage, metered periods, credit notes once issued and invoice e-mails are read-only."""

from __future__ import annotations

from django import forms
from django.contrib import admin, messages
from django.contrib.admin import helpers
from django.utils.translation import gettext_lazy as _

from billing import invoices, invoicing, services
from billing.models import (
    BillingProfile,
    CreditNote,
    Invoice,
    InvoiceLine,
    InvoiceMail,
    InvoiceState,
    MeteredPeriod,
    Price,
    PriceList,
    UsageRecord,
)
from billing.prices import check_price, metered_until
from pools.admin.capacity import ReadOnlyAdmin as PoolsReadOnlyAdmin
from portal.errors import PortalError
from portal.permissions import staff_may


@admin.register(PriceList)
class PriceListAdmin(admin.ModelAdmin):
    list_per_page = 50
    show_full_result_count = False
    list_display = ["name", "created_at"]
    search_fields = ["name"]

    def save_model(self, request, obj, form, change):
        services.save_price_list(price_list=obj, actor=request.user)


class PriceForm(forms.ModelForm):
    """Checked as `add_price` checks: known spec, not negative, no overlap, no metered time rewritten."""

    class Meta:
        model = Price
        fields = ["price_list", "gpu_model", "profile", "hourly_price", "valid_from", "valid_to"]

    def clean(self):
        data = super().clean()
        if not self.errors:
            wanted = Price(pk=self.instance.pk, **{name: data.get(name) for name in self.Meta.fields})
            stored = Price.objects.filter(pk=self.instance.pk).first() if self.instance.pk else None
            try:
                check_price(wanted, before=stored)
            except PortalError as error:
                self.add_error(error.field if error.field in self.fields else None, error.message)
        return data

    def validate_unique(self):
        """`check_price` has said it in words already; the database constraints stay the last guard."""


@admin.register(Price)
class PriceAdmin(admin.ModelAdmin):
    form = PriceForm
    list_per_page = 50
    show_full_result_count = False
    list_display = ["gpu_model", "profile", "hourly_price", "valid_from", "valid_to", "price_list"]
    list_filter = ["price_list", "gpu_model"]
    list_select_related = ["price_list"]
    search_fields = ["gpu_model", "profile"]

    def has_delete_permission(self, request, obj=None) -> bool:
        # A price that applied to metered time stays, as the record of what was charged.
        frozen = metered_until()
        if obj is not None and frozen is not None and obj.valid_from < frozen:
            return False
        return super().has_delete_permission(request, obj)

    def save_model(self, request, obj, form, change):
        services.save_price(price=obj, actor=request.user)

    def delete_model(self, request, obj):
        self.delete_queryset(request, Price.objects.filter(pk=obj.pk))

    def delete_queryset(self, request, queryset):
        frozen = metered_until()
        if frozen is not None:
            queryset = queryset.filter(valid_from__gte=frozen)
        services.delete_prices(prices=queryset, actor=request.user)


class ReadOnlyAdmin(PoolsReadOnlyAdmin):
    list_per_page = 50
    show_full_result_count = False


@admin.register(UsageRecord)
class UsageRecordAdmin(ReadOnlyAdmin):
    list_display = [
        "period_start",
        "pool",
        "gpu_model",
        "profile",
        "count",
        "hours",
        "unit_price",
        "currency",
    ]
    list_filter = ["gpu_model", "period_start"]
    list_select_related = ["pool__project__tenant"]
    search_fields = ["pool__project__slug", "pool__project__tenant__slug"]
    date_hierarchy = "period_start"

    @admin.display(description=_("instance-hours"))
    def hours(self, record):
        return f"{record.seconds / 3600:.2f}"


@admin.register(MeteredPeriod)
class MeteredPeriodAdmin(ReadOnlyAdmin):
    list_display = ["start", "records", "metered_at"]
    date_hierarchy = "start"


@admin.register(BillingProfile)
class BillingProfileAdmin(admin.ModelAdmin):
    list_per_page = 50
    show_full_result_count = False
    list_display = ["tenant", "legal_name", "cost_centre", "po_number", "contact_email", "tax_rate"]
    list_select_related = ["tenant"]
    search_fields = ["tenant__slug", "tenant__name", "legal_name", "cost_centre", "po_number"]


class InvoiceActionForm(helpers.ActionForm):
    reason = forms.CharField(label=_("Reason (to void)"), required=False, max_length=2000)


class InvoiceLineInline(admin.TabularInline):
    model = InvoiceLine
    extra = 0
    can_delete = False
    fields = ["kind", "project", "gpu_model", "profile", "hours", "unit_price", "amount"]
    readonly_fields = fields

    def has_add_permission(self, request, obj=None) -> bool:
        return False

    @admin.display(description=_("hours"))
    def hours(self, line):
        return f"{line.hours:.2f}" if line.kind == "usage" else ""


class CreditNoteInline(admin.TabularInline):
    model = CreditNote
    extra = 0
    can_delete = False
    show_change_link = True
    fields = ["number", "issued_at", "subtotal", "tax", "total", "reason", "issued_by"]
    readonly_fields = fields

    def has_add_permission(self, request, obj=None) -> bool:
        return False

    def has_change_permission(self, request, obj=None) -> bool:
        return False


@admin.register(Invoice)
class InvoiceAdmin(admin.ModelAdmin):
    """Finance issues, marks paid and voids here; what an invoice says comes only from closing a month."""

    list_per_page = 50
    show_full_result_count = False
    list_display = ["__str__", "tenant", "month", "state", "total", "currency", "issued_at", "paid_at"]
    list_filter = ["state", "month"]
    list_select_related = ["tenant"]
    search_fields = ["number", "tenant__slug", "tenant__name"]
    date_hierarchy = "month"
    inlines = [InvoiceLineInline, CreditNoteInline]
    action_form = InvoiceActionForm
    actions = ["issue_selected", "mark_paid_selected", "void_selected"]
    fields = [
        "tenant",
        "month",
        "state",
        "number",
        "currency",
        "subtotal",
        "tax_rate",
        "tax",
        "total",
        "credited",
        "issued_at",
        "paid_at",
        "voided_at",
        "void_reason",
    ]
    readonly_fields = fields

    def has_add_permission(self, request) -> bool:
        return False

    def has_delete_permission(self, request, obj=None) -> bool:
        return False  # a draft is rebuilt by closing its month again, or voided

    def _each(self, request, queryset, change, done: str) -> None:
        changed, refused = 0, []
        for invoice in queryset.order_by("tenant__slug"):
            try:
                change(invoice)
                changed += 1
            except PortalError as error:
                refused.append(error.message)
        if changed:
            self.message_user(request, done % {"count": changed}, messages.SUCCESS)
        for message in refused:
            self.message_user(request, message, messages.ERROR)

    @admin.action(description=_("Issue the selected drafts"), permissions=["issue"])
    def issue_selected(self, request, queryset):
        self._each(
            request,
            queryset,
            lambda i: invoices.issue(invoice_id=i.pk, by=request.user),
            _("%(count)d issued."),
        )

    @admin.action(description=_("Mark the selected invoices paid"), permissions=["issue"])
    def mark_paid_selected(self, request, queryset):
        self._each(
            request,
            queryset,
            lambda i: invoices.mark_paid(invoice_id=i.pk, by=request.user),
            _("%(count)d marked paid."),
        )

    @admin.action(description=_("Void the selected invoices (give the reason)"), permissions=["issue"])
    def void_selected(self, request, queryset):
        reason = request.POST.get("reason", "")
        self._each(
            request,
            queryset,
            lambda i: invoices.void(invoice_id=i.pk, reason=reason, by=request.user),
            _("%(count)d voided."),
        )

    def has_issue_permission(self, request) -> bool:
        return staff_may(user=request.user, permission="billing.issue_invoice")

    @admin.display(description=_("credited"))
    def credited(self, invoice):
        return invoicing.round_money(invoices.credited(invoice), invoice.currency) if invoice.pk else ""


class CreditNoteForm(forms.ModelForm):
    """Checked as `invoices.credit` checks, each refusal beside its field; the service checks again as
    it issues, under the invoice's lock."""

    invoice = forms.ModelChoiceField(
        label=_("invoice"),
        queryset=Invoice.objects.filter(state__in=[InvoiceState.ISSUED, InvoiceState.PAID])
        .select_related("tenant")
        .order_by("-issued_at", "-pk"),
    )
    amount = forms.DecimalField(
        label=_("net amount"), help_text=_("Before tax; the invoice's tax rate is added."), max_digits=14
    )

    class Meta:
        model = CreditNote
        fields = ["invoice", "amount", "reason"]

    def clean(self):
        data = super().clean()
        if not self.errors:
            try:
                invoices.check_credit(
                    invoice_id=data["invoice"].pk, amount=data["amount"], reason=data.get("reason", "")
                )
            except PortalError as error:
                self.add_error(error.field if error.field in self.fields else None, error.message)
        return data

    def _post_clean(self):
        """The number, amounts and times come from the service when it issues, not from the form."""


@admin.register(CreditNote)
class CreditNoteAdmin(admin.ModelAdmin):
    """Finance issues credit notes here; once issued, one is only read (the database refuses changes)."""

    list_per_page = 50
    show_full_result_count = False
    list_display = ["number", "invoice", "tenant", "total", "currency", "issued_at", "issued_by"]
    list_select_related = ["invoice__tenant", "issued_by"]
    search_fields = ["number", "invoice__number", "invoice__tenant__slug", "reason"]
    date_hierarchy = "issued_at"
    shown = [
        "number",
        "invoice",
        "currency",
        "subtotal",
        "tax_rate",
        "tax",
        "total",
        "reason",
        "issued_at",
        "issued_by",
    ]

    def get_form(self, request, obj=None, change=False, **kwargs):
        if obj is None:
            kwargs["form"] = CreditNoteForm
        return super().get_form(request, obj, change=change, **kwargs)

    def get_fields(self, request, obj=None):
        return ["invoice", "amount", "reason"] if obj is None else self.shown

    def get_readonly_fields(self, request, obj=None):
        return [] if obj is None else self.shown

    def has_change_permission(self, request, obj=None) -> bool:
        return False

    def has_delete_permission(self, request, obj=None) -> bool:
        return False

    @admin.display(description=_("tenant"), ordering="invoice__tenant__slug")
    def tenant(self, note):
        return note.invoice.tenant

    def save_model(self, request, obj, form, change):
        # Checked by the form already; a refusal now (another credit meanwhile) is answered as such.
        data = form.cleaned_data
        note = invoices.credit(
            invoice_id=data["invoice"].pk, amount=data["amount"], reason=data["reason"], by=request.user
        )
        obj.pk, obj.number, obj.invoice = note.pk, note.number, note.invoice

    def save_related(self, request, form, formsets, change):
        """A credit note has nothing related to save."""


@admin.register(InvoiceMail)
class InvoiceMailAdmin(ReadOnlyAdmin):
    list_display = ["sent_at", "invoice", "credit_note", "recipients"]
    list_select_related = ["invoice", "credit_note"]
    search_fields = ["invoice__number", "credit_note__number", "recipients"]
    date_hierarchy = "sent_at"
