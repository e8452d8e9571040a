"""Django admin of pool requests (the approvers' queue, decisions in bulk) and of pools, with timelines."""

from __future__ import annotations

from django import forms
from django.contrib import admin, messages
from django.template.response import TemplateResponse
from django.utils.html import format_html
from django.utils.translation import gettext_lazy as _
from django.utils.translation import ngettext

from pools import selectors, services
from pools.apps import APPROVE
from pools.models import Allocation, Pool, PoolEvent, PoolRequest, RequestItem, RequestState
from pools.services.verdicts import preview
from portal.errors import PortalError
from portal.permissions import staff_may


class RequestItemInline(admin.TabularInline):
    """Items stay editable while the request waits for a decision, and only then."""

    model = RequestItem
    extra = 0
    fields = ["gpu_model", "profile", "count"]

    def _undecided(self, obj) -> bool:
        return obj is not None and obj.state == RequestState.SUBMITTED

    def has_add_permission(self, request, obj=None):
        return self._undecided(obj) and super().has_add_permission(request, obj)

    def has_change_permission(self, request, obj=None):
        return self._undecided(obj) and super().has_change_permission(request, obj)

    def has_delete_permission(self, request, obj=None):
        return self._undecided(obj) and super().has_delete_permission(request, obj)


class PoolEventInline(admin.TabularInline):
    model = PoolEvent
    extra = 0
    can_delete = False
    fields = ["at", "actor", "from_label", "to_label", "why"]
    readonly_fields = fields
    verbose_name_plural = _("timeline")

    def has_add_permission(self, request, obj=None):
        return False

    @admin.display(description=_("from"))
    def from_label(self, obj):
        return obj.get_from_state_display()

    @admin.display(description=_("to"))
    def to_label(self, obj):
        return obj.get_to_state_display()

    @admin.display(description=_("why"))
    def why(self, obj):
        return selectors.event_reason(obj, obj.request)


class RejectForm(forms.Form):
    reason = forms.CharField(
        label=_("Reason"),
        max_length=2000,
        widget=forms.Textarea(attrs={"rows": 3}),
        help_text=_("The tenant reads it."),
    )


@admin.register(PoolRequest)
class PoolRequestAdmin(admin.ModelAdmin):
    # Long tables stay quick: 50 rows a page, and one COUNT (the filtered one), not a second of them all.
    list_per_page = 50
    show_full_result_count = False
    # "#12 acme/vision" names the tenant and the project; the purpose is on the request's page.
    list_display = [
        "__str__",
        "state",
        "priority",
        "items_summary",
        "cluster",
        "submitted_by",
        "submitted_at",
        "why_it_waits",
    ]
    list_filter = ["state", "kind", "project__tenant", "cluster", "items__gpu_model", "submitted_at"]
    list_select_related = ["project__tenant", "cluster", "submitted_by"]
    search_fields = [
        "project__name",
        "project__slug",
        "project__tenant__name",
        "justification",
        "submitted_by__username",
    ]
    date_hierarchy = "submitted_at"
    fields = [
        "project",
        "kind",
        "target_pool",
        "cluster",
        "purpose",
        "justification",
        "end_at",
        "hold_seconds",
        "state",
        "priority",
        "submitted_by",
        "submitted_at",
        "decided_by",
        "decided_at",
        "decision_reason",
        "why_it_waits",
        "placement_preview",
    ]
    readonly_fields = [f for f in fields if f != "priority"]
    inlines = [RequestItemInline, PoolEventInline]
    actions = ["approve", "reject"]

    def get_queryset(self, request):
        return super().get_queryset(request).prefetch_related("items")

    def has_add_permission(self, request):
        return False  # tenants ask through the portal

    def has_delete_permission(self, request, obj=None):
        return False  # requests are history

    @admin.display(description=_("would it fit now?"))
    def placement_preview(self, obj):
        if obj.state not in (RequestState.SUBMITTED, RequestState.APPROVED, RequestState.QUEUED):
            return "—"
        return format_html("<pre>{}</pre>", preview(obj))

    @admin.display(description=_("why it waits"))
    def why_it_waits(self, obj):
        return selectors.waiting_reason(obj)

    @admin.display(description=_("items"))
    def items_summary(self, obj):
        return ", ".join(str(item) for item in obj.items.all())

    def save_model(self, request, obj, form, change):
        if "priority" in form.changed_data:
            try:
                services.set_priority(request_id=obj.pk, approver=request.user, priority=obj.priority)
            except PortalError as error:
                self.message_user(request, error.message, messages.ERROR)

    def _each(self, request, queryset, call) -> None:
        done = 0
        for obj in queryset:
            try:
                call(obj)
                done += 1
            except PortalError as error:
                self.message_user(request, f"#{obj.pk}: {error.message}", messages.ERROR)
        if done:
            self.message_user(
                request, ngettext("%(n)d request done.", "%(n)d requests done.", done) % {"n": done}
            )

    @admin.action(description=_("Approve the selected requests"), permissions=["approve"])
    def approve(self, request, queryset):
        self._each(
            request, queryset, lambda obj: services.approve_request(request_id=obj.pk, approver=request.user)
        )

    @admin.action(description=_("Reject the selected requests…"), permissions=["approve"])
    def reject(self, request, queryset):
        form = RejectForm(request.POST if "reason" in request.POST else None)
        if form.is_valid():
            reason = form.cleaned_data["reason"]
            self._each(
                request,
                queryset,
                lambda obj: services.reject_request(request_id=obj.pk, approver=request.user, reason=reason),
            )
            return None
        context = {
            **self.admin_site.each_context(request),
            "title": _("Reject pool requests"),
            "queryset": queryset,
            "form": form,
            "opts": self.model._meta,
            "action_checkbox_name": admin.helpers.ACTION_CHECKBOX_NAME,
        }
        return TemplateResponse(request, "admin/pools/poolrequest/reject.html", context)

    def has_approve_permission(self, request):
        return staff_may(user=request.user, permission=APPROVE)

    def render_change_form(self, request, context, *args, **kwargs):
        context["may_decide"] = self.has_approve_permission(request)  # the link to the approvals page
        return super().render_change_form(request, context, *args, **kwargs)


class AllocationInline(admin.TabularInline):
    model = Allocation
    extra = 0
    can_delete = False
    fields = ["gpu", "profile", "slices", "resource_name", "instance_uuid", "allocated_at", "released_at"]
    readonly_fields = fields

    def has_add_permission(self, request, obj=None):
        return False


@admin.register(Pool)
class PoolAdmin(admin.ModelAdmin):
    """Pools are read here: their state moves only through provisioning and release."""

    list_per_page = 50
    show_full_result_count = False
    list_display = [
        "__str__",
        "tenant",
        "cluster",
        "state",
        "reserved_at",
        "active_at",
        "released_at",
        "failure_reason",
    ]
    list_filter = ["state", "cluster", "project__tenant", "reserved_at"]
    list_select_related = ["project__tenant", "cluster"]
    search_fields = ["project__name", "project__slug", "project__tenant__name", "failure_reason"]
    date_hierarchy = "reserved_at"
    fields = [
        "request",
        "project",
        "cluster",
        "state",
        "reserved_at",
        "active_at",
        "released_at",
        "end_at",
        "failure_reason",
        "mig_configs",
    ]
    readonly_fields = fields
    inlines = [AllocationInline, PoolEventInline]

    @admin.display(description=_("tenant"), ordering="project__tenant__name")
    def tenant(self, obj):
        return obj.project.tenant

    def has_add_permission(self, request):
        return False

    def has_change_permission(self, request, obj=None):
        return False

    def has_delete_permission(self, request, obj=None):
        return False
