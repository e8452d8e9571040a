"""Django admin of billing: finance keeps price lists and billing profiles and acts on invoices; usage
and metered periods are read-only."""

from __future__ import annotations

from django import forms
from django.contrib import admin, messages
from django.contrib.admin import helpers
from django.utils.translation import gettext_lazy as _

from billing import invoices
from billing.models import (
    BillingProfile,
    Invoice,
    InvoiceLine,
    MeteredPeriod,
    Price,
    PriceList,
    UsageRecord,
)
from billing.prices import check_price, metered_until
from pools.admin.capacity import ReadOnlyAdmin as PoolsReadOnlyAdmin
from portal.errors import PortalError


@admin.register(PriceList)
class PriceListAdmin(admin.ModelAdmin):
    list_per_page = 50
    show_full_result_count = False
    list_display = ["name", "created_at"]
    search_fields = ["name"]


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

    def delete_queryset(self, request, queryset):
        frozen = metered_until()
        if frozen is not None:
            queryset = queryset.filter(valid_from__gte=frozen)
        super().delete_queryset(request, queryset)


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
    inlines = [InvoiceLineInline]
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
        self._each(request, queryset, lambda i: invoices.issue(invoice_id=i.pk), _("%(count)d issued."))

    @admin.action(description=_("Mark the selected invoices paid"), permissions=["issue"])
    def mark_paid_selected(self, request, queryset):
        self._each(
            request, queryset, lambda i: invoices.mark_paid(invoice_id=i.pk), _("%(count)d marked paid.")
        )

    @admin.action(description=_("Void the selected invoices (give the reason)"), permissions=["issue"])
    def void_selected(self, request, queryset):
        reason = request.POST.get("reason", "")
        self._each(
            request, queryset, lambda i: invoices.void(invoice_id=i.pk, reason=reason), _("%(count)d voided.")
        )

    def has_issue_permission(self, request) -> bool:
        return request.user.has_perm("billing.issue_invoice")
