"""Django admin of monitoring: operators keep the alert rules; alerts are read here and acknowledged
through the service, never edited by hand."""

from __future__ import annotations

from django import forms
from django.contrib import admin, messages
from django.db import models
from django.http import HttpResponseRedirect
from django.utils.translation import gettext_lazy as _
from django.utils.translation import ngettext

from monitoring.alerts import services as alerts
from monitoring.ingest import tokens
from monitoring.models import (
    AgentToken,
    Alert,
    AlertRule,
    CollectorStatus,
    Delivery,
    GpuEvent,
    GpuFault,
    Latest,
)
from portal.errors import PortalError


@admin.register(AlertRule)
class AlertRuleAdmin(admin.ModelAdmin):
    list_display = [
        "name",
        "kind",
        "metric",
        "comparison",
        "threshold",
        "duration_seconds",
        "severity",
        "enabled",
    ]
    list_filter = ["kind", "severity", "enabled"]
    search_fields = ["name"]
    formfield_overrides = {models.URLField: {"assume_scheme": "https"}}
    fieldsets = [
        (None, {"fields": ["name", "kind", "severity", "enabled"]}),
        (
            _("Condition"),
            {
                "fields": ["metric", "comparison", "threshold", "scope", "duration_seconds"],
                "description": _(
                    "Metric, comparison and scope are for threshold rules; an idle-pool rule's threshold "
                    "is the SM activity (%) under which a pool counts as idle."
                ),
            },
        ),
        (_("Who else is told"), {"fields": ["extra_emails", "webhook_url"]}),
    ]


class DeliveryInline(admin.TabularInline):
    """Who was told, how, and how it went: on an alert's page and on a fault's."""

    model = Delivery
    extra = 0
    can_delete = False
    fields = [
        "event",
        "channel",
        "target",
        "attempts",
        "next_attempt_at",
        "sent_at",
        "gave_up_at",
        "last_error",
    ]
    readonly_fields = fields

    def has_add_permission(self, request, obj=None):
        return False


@admin.register(Alert)
class AlertAdmin(admin.ModelAdmin):
    list_per_page = 50
    show_full_result_count = False
    list_display = ["fired_at", "severity", "rule", "subject", "message", "acknowledged_at", "resolved_at"]
    list_filter = ["severity", "rule", ("resolved_at", admin.EmptyFieldListFilter)]
    list_select_related = ["rule"]
    search_fields = ["subject", "message"]
    date_hierarchy = "fired_at"
    inlines = [DeliveryInline]
    actions = ["acknowledge_selected"]

    def get_readonly_fields(self, request, obj=None):
        return [field.name for field in Alert._meta.fields]

    def has_add_permission(self, request):
        return False

    def has_delete_permission(self, request, obj=None):
        return False

    @admin.action(description=_("Acknowledge the selected alerts"), permissions=["change"])
    def acknowledge_selected(self, request, queryset):
        done, refused = 0, []
        for alert in queryset:
            try:
                alerts.acknowledge(alert=alert, user=request.user)
                done += 1
            except PortalError as error:
                refused.append(f"#{alert.pk}: {error.message}")
        if done:
            self.message_user(request, _("%(count)d acknowledged.") % {"count": done}, messages.SUCCESS)
        for line in refused:
            self.message_user(request, line, messages.WARNING)


# --- node agents' tokens -------------------------------------------------------------------------


class AgentTokenAddForm(forms.ModelForm):
    class Meta:
        model = AgentToken
        fields = ["cluster", "name"]


@admin.register(AgentToken)
class AgentTokenAdmin(admin.ModelAdmin):
    """Node agents' tokens: made here with the key shown once, in a message; revoked here (in bulk or on
    a token's page). The portal keeps only the key's digest, so nothing here can show the key again."""

    list_per_page = 50
    show_full_result_count = False
    list_display = ["cluster", "name", "prefix", "created_at", "last_used_at", "last_host", "revoked_at"]
    list_filter = ["cluster", ("revoked_at", admin.EmptyFieldListFilter)]
    list_select_related = ["cluster"]
    search_fields = ["name", "prefix", "last_host", "cluster__name"]
    readonly_fields = [
        "cluster",
        "name",
        "prefix",
        "created_by",
        "created_at",
        "last_used_at",
        "last_host",
        "revoked_at",
    ]
    actions = ["revoke_selected"]
    change_form_template = "admin/monitoring/agenttoken/change_form.html"

    def get_form(self, request, obj=None, change=False, **kwargs):
        if obj is None:
            kwargs["form"] = AgentTokenAddForm
        return super().get_form(request, obj, change=change, **kwargs)

    def get_fields(self, request, obj=None):
        return ["cluster", "name"] if obj is None else self.readonly_fields

    def get_readonly_fields(self, request, obj=None):
        return [] if obj is None else self.readonly_fields

    def has_delete_permission(self, request, obj=None):
        # A live token is revoked, not deleted, so that its use stays on record until then.
        if obj is not None and obj.revoked_at is None:
            return False
        return super().has_delete_permission(request, obj)

    def get_actions(self, request):
        actions = super().get_actions(request)
        actions.pop("delete_selected", None)
        return actions

    def render_change_form(self, request, context, add=False, change=False, form_url="", obj=None):
        if change:  # nothing on a token can be edited: its page offers only revoking it
            context.update(show_save=False, show_save_and_continue=False, show_save_and_add_another=False)
        return super().render_change_form(request, context, add, change, form_url, obj)

    def save_model(self, request, obj, form, change):
        if change:
            if "_revoke" in request.POST:
                tokens.revoke_agent_token(token=obj)
                self.message_user(request, _("The token is revoked."), messages.SUCCESS)
            return
        issued = tokens.issue_agent_token(
            cluster=form.cleaned_data["cluster"], name=form.cleaned_data["name"], created_by=request.user
        )
        obj.pk, obj.prefix, obj.created_at = issued.token.pk, issued.token.prefix, issued.token.created_at
        self.message_user(
            request,
            _(
                "The key of %(token)s, shown only this once: %(key)s — give it to the node agent "
                "(gpu_agent --token). The portal keeps no copy."
            )
            % {"token": issued.token, "key": issued.key},
            messages.WARNING,
        )

    def response_change(self, request, obj):
        if "_revoke" in request.POST:
            return HttpResponseRedirect(request.path)
        return super().response_change(request, obj)

    @admin.action(description=_("Revoke the selected tokens"), permissions=["change"])
    def revoke_selected(self, request, queryset):
        count = 0
        for token in queryset.filter(revoked_at__isnull=True):
            tokens.revoke_agent_token(token=token)
            count += 1
        self.message_user(
            request,
            ngettext("%(count)d token revoked.", "%(count)d tokens revoked.", count) % {"count": count},
            messages.SUCCESS,
        )


# --- what the GPUs said: read here, written only by ingest and faults ----------------------------


class ReadOnlyAdmin(admin.ModelAdmin):
    list_per_page = 50
    show_full_result_count = False

    def has_add_permission(self, request):
        return False

    def has_change_permission(self, request, obj=None):
        return False

    def has_delete_permission(self, request, obj=None):
        return False


@admin.register(Latest)
class LatestAdmin(ReadOnlyAdmin):
    list_display = [
        "gpu",
        "slot",
        "profile",
        "at",
        "power_w",
        "temperature_c",
        "sm_active_pct",
        "memory_used_bytes",
        "ecc_uncorrected",
        "source",
    ]
    list_filter = ["source", "gpu__node__cluster"]
    list_select_related = ["gpu__node__cluster"]
    search_fields = ["gpu__uuid", "instance_uuid", "host"]


@admin.register(GpuEvent)
class GpuEventAdmin(ReadOnlyAdmin):
    list_display = ["at", "kind", "code", "gpu", "detail"]
    list_filter = ["kind", "gpu__node__cluster"]
    list_select_related = ["gpu__node__cluster"]
    search_fields = ["gpu__uuid", "detail"]
    date_hierarchy = "at"


@admin.register(CollectorStatus)
class CollectorStatusAdmin(ReadOnlyAdmin):
    list_display = ["cluster", "source", "last_run_at", "last_success_at", "gpus", "last_error"]
    list_select_related = ["cluster"]


@admin.register(GpuFault)
class GpuFaultAdmin(ReadOnlyAdmin):
    """Faults are cleared on the faults page, which undrains the GPU through the service."""

    list_display = ["at", "kind", "code", "gpu", "drained_by_portal", "cleared_at", "cleared_by"]
    list_filter = ["kind", ("cleared_at", admin.EmptyFieldListFilter)]
    list_select_related = ["gpu__node__cluster", "cleared_by"]
    search_fields = ["gpu__uuid", "detail"]
    date_hierarchy = "at"
    inlines = [DeliveryInline]
