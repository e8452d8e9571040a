"""Django admin of kept what-if runs: read only, as the worker and the sweeper alone move them; the report
itself is read on the run's page, which draws it."""

from __future__ import annotations

from django.contrib import admin
from django.urls import reverse
from django.utils.html import format_html
from django.utils.translation import gettext_lazy as _

from pools.models import WhatIfRun


@admin.register(WhatIfRun)
class WhatIfRunAdmin(admin.ModelAdmin):
    list_per_page = 50
    show_full_result_count = False
    list_display = ["id", "month", "cluster", "state", "progress", "requested_by", "created_at"]
    list_filter = ["state", "month"]
    list_select_related = ["requested_by"]
    search_fields = ["month", "cluster"]
    date_hierarchy = "created_at"
    fields = [
        "page",
        "month",
        "cluster",
        "changes",
        "state",
        "progress",
        "error",
        "requested_by",
        "created_at",
        "started_at",
        "finished_at",
        "deadline",
    ]
    readonly_fields = fields

    def get_queryset(self, request):
        return super().get_queryset(request).defer("report")  # large, and drawn on the run's page

    @admin.display(description=_("report"))
    def page(self, obj):
        return format_html('<a href="{}">{}</a>', reverse("whatif-run", args=[obj.pk]), _("the run's page"))

    def has_add_permission(self, request):
        return False

    def has_change_permission(self, request, obj=None):
        return False

    def has_delete_permission(self, request, obj=None):
        return False
