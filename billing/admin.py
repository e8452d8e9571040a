"""Django admin of billing: finance keeps the price lists; usage and metered periods are read-only."""

from __future__ import annotations

from django import forms
from django.contrib import admin
from django.utils.translation import gettext_lazy as _

from billing.models import MeteredPeriod, Price, PriceList, UsageRecord
from billing.prices import check_price, metered_until
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


class ReadOnlyAdmin(admin.ModelAdmin):
    list_per_page = 50
    show_full_result_count = False

    def has_add_permission(self, request) -> bool:
        return False

    def has_change_permission(self, request, obj=None) -> bool:
        return False

    def has_delete_permission(self, request, obj=None) -> bool:
        return False


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
