"""Operators' alert pages: the alerts (filtered, paged), one alert with its notifications, the rules."""

from __future__ import annotations

from django import forms
from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.core.paginator import Paginator
from django.db.models import Count
from django.http import HttpRequest, HttpResponse
from django.shortcuts import get_object_or_404, redirect, render
from django.urls import reverse
from django.utils.translation import gettext as _
from django.utils.translation import gettext_lazy
from django.views.decorators.http import require_POST

from monitoring.alerts import services as alerts
from monitoring.models import Alert, AlertRule
from monitoring.models.alerts import Severity
from monitoring.selectors.alerts import listed
from portal import redirects
from portal.permissions import require_staff, staff_may

ALERTS_PER_PAGE = 50


class AlertFilterForm(forms.Form):
    state = forms.ChoiceField(
        label=gettext_lazy("State"), required=False, choices=[("", gettext_lazy("any")), *Alert.State.choices]
    )
    severity = forms.ChoiceField(
        label=gettext_lazy("Severity"), required=False, choices=[("", gettext_lazy("any")), *Severity.choices]
    )


@login_required
def alert_list(request: HttpRequest) -> HttpResponse:
    """Newest first; an unknown filter value answers 400 with the form saying why, and no rows."""
    require_staff(user=request.user, permission="monitoring.view_alert")
    form = AlertFilterForm(request.GET)
    context = {"form": form, "page": None, "filtered": False}
    if not form.is_valid():
        return render(request, "monitoring/alerts.html", context, status=400)
    filters = form.cleaned_data
    found = listed(state=filters["state"], severity=filters["severity"])
    context["page"] = Paginator(found, ALERTS_PER_PAGE).get_page(request.GET.get("page"))
    context["filtered"] = any(filters.values())
    return render(request, "monitoring/alerts.html", context)


@login_required
def alert_detail(request: HttpRequest, pk: int) -> HttpResponse:
    require_staff(user=request.user, permission="monitoring.view_alert")
    alert = get_object_or_404(listed(), pk=pk)
    context = {
        "alert": alert,
        "deliveries": alert.deliveries.order_by("created_at", "pk"),
        "may_acknowledge": staff_may(user=request.user, permission="monitoring.change_alert"),
    }
    return render(request, "monitoring/alert.html", context)


@login_required
@require_POST
def alert_acknowledge(request: HttpRequest, pk: int) -> HttpResponse:
    """A resolved alert is refused (409, said in words by the refusal middleware). Back to the alert's page,
    or to the page the button was on (`next`, a capacity page) when it is of this site."""
    require_staff(user=request.user, permission="monitoring.change_alert")
    alert = alerts.acknowledge(alert=get_object_or_404(Alert, pk=pk), user=request.user)
    messages.success(request, _("Alert #%(pk)s acknowledged.") % {"pk": alert.pk})
    return redirect(redirects.back_to(request, reverse("monitoring-alert", kwargs={"pk": alert.pk})))


@login_required
def rule_list(request: HttpRequest) -> HttpResponse:
    """The rules and how many alerts each has open; they are changed in the admin."""
    require_staff(user=request.user, permission="monitoring.view_alert")
    rules = AlertRule.objects.order_by("name")
    open_counts = {
        row["rule_id"]: row["n"]
        for row in Alert.objects.open().order_by().values("rule_id").annotate(n=Count("pk"))
    }
    may_edit = staff_may(user=request.user, permission="monitoring.change_alertrule")
    context = {
        "rules": [(rule, open_counts.get(rule.pk, 0)) for rule in rules],
        "admin_url": reverse("admin:monitoring_alertrule_changelist") if may_edit else "",
    }
    return render(request, "monitoring/rules.html", context)
