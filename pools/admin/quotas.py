"""Django admin of quotas and the tenants' admission policy, for operators and approvers: every change goes
through pools/services/quotas.py, so it is checked against the capacity in service and audited, as on the
quotas page."""

from __future__ import annotations

from django import forms
from django.contrib import admin

from pools.models import Quota, TenantPolicy
from pools.services.quotas import check_quota, set_auto_approve, set_quota
from portal.errors import InvalidInput


class QuotaForm(forms.ModelForm):
    class Meta:
        model = Quota
        fields = ["tenant", "project", "group", "gpu_model", "guaranteed", "limit"]

    def clean(self):
        data = super().clean()
        if self.errors:
            return data
        self.quota = {
            "tenant": data["tenant"],
            "project": data.get("project"),
            "group": data.get("group") or "",
            "gpu_model": data["gpu_model"],
            "guaranteed": data["guaranteed"],
            "limit": data.get("limit"),  # empty: no limit
        }
        try:
            check_quota(**self.quota)
        except InvalidInput as error:
            raise forms.ValidationError(error.message) from None
        return data


@admin.register(Quota)
class QuotaAdmin(admin.ModelAdmin):
    form = QuotaForm
    list_display = ["tenant", "project", "group", "gpu_model", "guaranteed", "limit", "updated_at"]
    list_filter = ["gpu_model", "group"]
    search_fields = ["tenant__slug", "tenant__name", "project__slug"]
    list_select_related = ["tenant", "project"]
    list_per_page = 50
    show_full_result_count = False

    def save_model(self, request, obj, form, change):
        obj.pk = set_quota(actor=request.user, **form.quota).pk


@admin.register(TenantPolicy)
class TenantPolicyAdmin(admin.ModelAdmin):
    list_display = ["tenant", "auto_approve_within_guarantee"]
    fields = ["tenant", "auto_approve_within_guarantee"]
    list_select_related = ["tenant"]
    list_per_page = 50
    show_full_result_count = False

    def save_model(self, request, obj, form, change):
        saved = set_auto_approve(
            actor=request.user, tenant=obj.tenant, on=form.cleaned_data["auto_approve_within_guarantee"]
        )
        obj.pk = saved.pk
