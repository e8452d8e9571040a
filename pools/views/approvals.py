"""The approvers' workspace: the requests awaiting a decision with the queue's verdict on each, the approved
ones still waiting, and one request's page where it is approved, rejected or prioritised.

Approvers only (`pools.approve_poolrequest`): anyone else gets 404, so tenants do not learn the pages exist.
Each verdict is the queue's own (`services.verdicts.verdicts`), each decision a service call.
"""

from __future__ import annotations

from django import forms
from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.core.paginator import Paginator
from django.http import HttpRequest, HttpResponse
from django.shortcuts import redirect, render
from django.utils.translation import gettext as _
from django.utils.translation import gettext_lazy
from django.views.decorators.http import require_POST

from pools import selectors, services
from pools.apps import APPROVE
from pools.budgets import most_passed
from pools.models import RequestState
from pools.selectors import approvals
from pools.selectors.quotas import tenant_quotas
from pools.services.budget_checks import request_budgets
from pools.services.verdicts import verdicts
from portal import shell
from portal.errors import PortalError, bad_input
from portal.permissions import require_staff, staff_may

PER_PAGE = 25
HOLDINGS_PER_PAGE = 20
HOLDINGS_PAGE = "pools_page"  # the request page's own pager, beside those of its sections
TABS = {"decide": gettext_lazy("To decide"), "queue": gettext_lazy("Approved, waiting")}


class ApproveForm(forms.Form):
    priority = forms.IntegerField(label=gettext_lazy("Priority"), required=False)
    end_at = forms.DateTimeField(
        label=gettext_lazy("End"),
        required=False,
        widget=forms.DateTimeInput(attrs={"type": "datetime-local"}, format="%Y-%m-%dT%H:%M"),
        help_text=gettext_lazy("Empty: as asked. An approver may shorten the end, not move it later."),
    )
    override_budget = forms.BooleanField(label=gettext_lazy("Approve past the hard budget"), required=False)


class RejectForm(forms.Form):
    # Whether a reason was given is the service's to say (one message, wherever a rejection comes from).
    reason = forms.CharField(label=gettext_lazy("Reason"), required=False, widget=forms.Textarea)


class PriorityForm(forms.Form):
    priority = forms.IntegerField(label=gettext_lazy("Priority"))


def awaiting_count(user) -> int:
    """The top bar's badge beside "Approvals": requests waiting for a decision."""
    if not staff_may(user=user, permission=APPROVE):
        return 0
    return approvals.awaiting_decision_count()


@login_required
def approvals_list(request: HttpRequest) -> HttpResponse:
    require_staff(user=request.user, permission=APPROVE)
    tab = request.GET.get("tab") or "decide"
    if tab not in TABS:
        return bad_input(request, _("Unknown tab %(tab)r; use decide or queue.") % {"tab": tab[:40]})
    rows = approvals.awaiting_decision() if tab == "decide" else approvals.approved_waiting()
    page = Paginator(rows, PER_PAGE).get_page(request.GET.get("page"))
    context = {
        "tab": tab,
        "tabs": TABS.items(),
        "page": page,
        "pending": approvals.awaiting_decision_count(),
        "verdicts": verdicts(list(page.object_list)) if tab == "decide" else {},
        "positions": selectors.queue_positions() if tab == "queue" else {},
    }
    return render(request, "pools/approvals.html", context)


def _detail(request: HttpRequest, pk: int, *, status: int = 200, **forms_shown) -> HttpResponse:
    found = approvals.request_to_decide(pk=pk)
    tenant = found.project.tenant
    undecided = found.state == RequestState.SUBMITTED
    waiting = found.state in (RequestState.APPROVED, RequestState.QUEUED)
    holdings = Paginator(approvals.tenant_holdings(tenant=tenant), HOLDINGS_PER_PAGE)
    context = {
        "req": found,
        "tenant": tenant,
        "undecided": undecided,
        "waiting": waiting,
        "verdict": verdicts([found])[found.pk] if undecided or waiting else None,
        "position": selectors.queue_positions().get(found.pk) if waiting else None,
        "holdings": holdings.get_page(request.GET.get(HOLDINGS_PAGE)),
        "holdings_parameter": HOLDINGS_PAGE,
        "sections": shell.approval_sections(request, tenant),
        "quotas": tenant_quotas(tenant.pk),
        **_budgets(found, undecided),
        "approve_form": forms_shown.get("approve_form") or ApproveForm(),
        "reject_form": forms_shown.get("reject_form") or RejectForm(),
        "priority_form": forms_shown.get("priority_form")
        or PriorityForm(initial={"priority": found.priority}),
    }
    return render(request, "pools/approval_detail.html", context, status=status)


def _budgets(found, undecided: bool) -> dict:
    """The budgets beside a request to decide: each with what the request adds, and the hard one it passes
    (which the approve form's override checkbox is shown for)."""
    standings = request_budgets(found) if undecided else []
    return {"budgets": standings, "budget_passed": most_passed(standings)}


@login_required
def approval_detail(request: HttpRequest, pk: int) -> HttpResponse:
    require_staff(user=request.user, permission=APPROVE)
    return _detail(request, pk)


def _decide(
    request: HttpRequest, pk: int, form: forms.Form, name: str, call, done: str, back
) -> HttpResponse:
    """Run one decision posted from the request's page. A form that does not parse, or the service's
    refusal, shows the page again with the reason and the matching 4xx; nothing changes."""
    require_staff(user=request.user, permission=APPROVE)
    approvals.request_to_decide(pk=pk)  # 404 before anything else for a request that does not exist
    if not form.is_valid():
        return _detail(request, pk, status=400, **{name: form})
    try:
        call(form.cleaned_data)
    except PortalError as error:
        form.add_error(None, error.message)
        return _detail(request, pk, status=error.status_code, **{name: form})
    messages.success(request, done)
    return back


@login_required
@require_POST
def approval_approve(request: HttpRequest, pk: int) -> HttpResponse:
    return _decide(
        request,
        pk,
        ApproveForm(request.POST),
        "approve_form",
        lambda data: services.approve_request(
            request_id=pk,
            approver=request.user,
            priority=data["priority"],
            end_at=data["end_at"],
            override_budget=data["override_budget"],
        ),
        _("Request #%(id)s approved; the queue admits it when it fits.") % {"id": pk},
        redirect("approvals"),
    )


@login_required
@require_POST
def approval_reject(request: HttpRequest, pk: int) -> HttpResponse:
    return _decide(
        request,
        pk,
        RejectForm(request.POST),
        "reject_form",
        lambda data: services.reject_request(request_id=pk, approver=request.user, reason=data["reason"]),
        _("Request #%(id)s rejected.") % {"id": pk},
        redirect("approvals"),
    )


@login_required
@require_POST
def approval_priority(request: HttpRequest, pk: int) -> HttpResponse:
    return _decide(
        request,
        pk,
        PriorityForm(request.POST),
        "priority_form",
        lambda data: services.set_priority(request_id=pk, approver=request.user, priority=data["priority"]),
        _("Priority of request #%(id)s set.") % {"id": pk},
        redirect("approval", pk=pk),
    )
