"""The tenants' pages of requests and pools: the request form, a request and a pool with their buttons
(cancel, release), and a tenant's lists of each, filtered and paged."""

from __future__ import annotations

from collections.abc import Callable

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.core.paginator import Paginator
from django.db.models import QuerySet
from django.http import Http404, HttpRequest, HttpResponse
from django.shortcuts import redirect, render
from django.utils.translation import gettext as _
from django.views.decorators.http import require_http_methods, require_POST

from pools import selectors, services
from pools.budgets import most_passed
from pools.conf import settings
from pools.forms import (
    ExtendForm,
    GrowForm,
    ListFilterForm,
    PoolRequestForm,
    ShrinkForm,
    copied_request,
    rows_for,
)
from pools.kinds import KINDS
from pools.manifest import pods
from pools.models import Cluster, PoolState, RequestState
from pools.pricing import hourly_price
from pools.selectors.binding import manifest_units, open_trespasses, pool_pods
from pools.selectors.ends import longest_duration, upcoming_reminders
from pools.selectors.quotas import approves_within_guarantee, borrowed_pool_ids, tenant_quotas
from pools.services.budget_checks import request_budgets
from pools.services.requests import asked_or_administers, judge_against_quotas
from pools.specs import UnknownSpec, parse_spec
from pools.views.refresh import refresh_while
from portal import selectors as tenancy
from portal import shell
from portal.errors import PortalError
from portal.pagination import paged
from portal.permissions import can_request_pools, require_pool_requester

LIST_PAGE_SIZE = 50
POOL_LISTS_PER_PAGE = 20  # a pool page's GPU pods, and its trespasses


@login_required
@require_http_methods(["GET", "POST"])
def request_new(request: HttpRequest, tenant_slug: str, slug: str) -> HttpResponse:
    project = tenancy.visible_project(user=request.user, tenant_slug=tenant_slug, slug=slug)
    try:
        require_pool_requester(user=request.user, tenant_id=project.tenant_id)
    except PortalError as error:
        context = {"project": project, "tenant": project.tenant, "reason": error.message}
        return render(request, "pools/request_forbidden.html", context, status=error.status_code)
    offered = selectors.spec_offers()
    specs = [o.spec for o in offered]
    if request.method == "GET":
        initial = _copy_of(request, tenant_slug)
        form = PoolRequestForm(specs=specs, initial=initial, rows=rows_for(initial))
    elif "add_row" in request.POST:  # "Add a line": the same form again, one empty line longer, unsent
        kept = request.POST.dict()
        form = PoolRequestForm(specs=specs, initial=kept, rows=rows_for(kept, more=1))
    else:
        form = PoolRequestForm(request.POST, specs=specs, rows=rows_for(request.POST))
    status = 200
    quotas = tenant_quotas(project.tenant_id)
    judged = None
    if request.method == "POST" and "check_quota" in request.POST:  # told before it is sent, nothing saved
        if form.is_valid():
            try:
                judged = judge_against_quotas(
                    project,
                    [(parse_spec(spec), count) for spec, count in form.items()],
                    form.cleaned_data["purpose"],
                )
            except UnknownSpec as error:
                form.add_error(None, str(error))
        else:
            status = 400
    elif request.method == "POST" and "add_row" not in request.POST:
        status = 400
        if form.is_valid():
            try:
                created = services.submit_request(
                    project=project,
                    user=request.user,
                    items=form.items(),
                    cluster=form.cleaned_data["cluster"],
                    purpose=form.cleaned_data["purpose"],
                    justification=form.cleaned_data["justification"],
                    **form.end(),
                )
            except PortalError as error:
                form.add_error(None, error.message)
                status = error.status_code
            else:
                messages.success(
                    request, _("Request #%(id)s submitted; an approver decides next.") % {"id": created.pk}
                )
                return redirect("pool-request", tenant_slug=tenant_slug, pk=created.pk)
    rows = [(offer, hourly_price(offer.spec)) for offer in offered]
    longest = longest_duration(project.tenant_id)
    context = {
        "project": project,
        "tenant": project.tenant,
        "form": form,
        "specs": rows,
        # What each kind on offer isolates, said before the member chooses (pools/kinds/).
        "isolation": [
            (_(kind.label), _(kind.isolation))
            for kind in KINDS
            if any(offer.spec.kind is kind for offer in offered)
        ],
        "quotas": quotas,
        "longest_hours": None if longest is None else int(longest.total_seconds() // 3600),
    }
    if judged is not None and judged.in_force:
        context["judged"] = judged
        refusal = judged.refusal(project)
        context["judged_reason"] = selectors.render_reason(refusal.as_data()) if refusal else ""
        context["auto_approved"] = judged.kind == "within" and approves_within_guarantee(project.tenant_id)
        context["notice_minutes"] = settings.RECLAIM_NOTICE_SECONDS // 60
    return render(request, "pools/request_new.html", context, status=status)


def _copy_of(request: HttpRequest, tenant_slug: str) -> dict | None:
    """`?copy=<id>`: a request of this tenant that the user sees, to ask for the same again; any
    other id (another tenant's, a made-up one, not a number) is not found."""
    copy = request.GET.get("copy")
    if copy is None:
        return None
    if not (copy.isascii() and copy.isdigit()):
        raise Http404
    found = selectors.visible_request(user=request.user, tenant_slug=tenant_slug, pk=int(copy))
    return copied_request(found)


@login_required
def request_detail(request: HttpRequest, tenant_slug: str, pk: int) -> HttpResponse:
    found = selectors.visible_request(user=request.user, tenant_slug=tenant_slug, pk=pk)
    context = {
        "req": found,
        "project": found.project,
        "tenant": found.project.tenant,
        "position": selectors.queue_positions().get(found.pk),
        "pool": getattr(found, "pool", None),
        "can_request": can_request_pools(user=request.user, tenant_id=found.project.tenant_id),
        "refresh": refresh_while(found.state in selectors.WAITING_REQUEST_STATES),
        **_budgets(found),
    }
    return render(request, "pools/request_detail.html", context)


def _budgets(found) -> dict:
    """The budgets a request still to decide counts against, with what it adds, and the hard one it passes
    (for which it waits for an approver's override)."""
    standings = request_budgets(found) if found.state == RequestState.SUBMITTED else []
    return {"budgets": standings, "budget_passed": most_passed(standings)}


def _act(request: HttpRequest, change, done: str, back: HttpResponse) -> HttpResponse:
    """Run one service call from a button; its refusal, or `done`, is shown on the page it goes back to."""
    try:
        change()
    except PortalError as error:
        messages.error(request, error.message)
    else:
        messages.success(request, done)
    return back


@login_required
@require_POST
def request_cancel(request: HttpRequest, tenant_slug: str, pk: int) -> HttpResponse:
    found = selectors.visible_request(user=request.user, tenant_slug=tenant_slug, pk=pk)
    return _act(
        request,
        lambda: services.cancel_request(request_id=found.pk, user=request.user),
        _("Request #%(id)s cancelled.") % {"id": found.pk},
        redirect("pool-request", tenant_slug=tenant_slug, pk=found.pk),
    )


@login_required
def pool_detail(request: HttpRequest, tenant_slug: str, pk: int) -> HttpResponse:
    pool = selectors.visible_pool(user=request.user, tenant_slug=tenant_slug, pk=pk)
    return _pool_page(request, pool)


def _pool_page(request: HttpRequest, pool, *, status: int = 200, **forms) -> HttpResponse:
    """The pool's page; `forms` a refused form of its changes (extend_form, grow_form, shrink_form), shown
    with its errors."""
    live = [a for a in pool.allocations.all() if a.released_at is None]
    context = {
        "pool": pool,
        "project": pool.project,
        "tenant": pool.project.tenant,
        "allocations": pool.allocations.all(),
        "pods": pods(manifest_units(pool, live)),
        "dra": pool.cluster.binding == Cluster.Binding.DRA,
        "gpu_pods": paged(request, pool_pods(pool, live), POOL_LISTS_PER_PAGE, "pods_page"),
        "trespasses": paged(request, open_trespasses(pool=pool), POOL_LISTS_PER_PAGE, "trespasses_page"),
        "sections": shell.pool_sections(request, pool),
        "refresh": refresh_while(pool.state in selectors.MOVING_POOL_STATES),
        "borrowed": pool.pk in borrowed_pool_ids([pool.pk]),
        "notice_minutes": settings.RECLAIM_NOTICE_SECONDS // 60,
        "requeue": settings.RECLAIM_REQUEUE,
        "asked_again": pool.asked_again.order_by("pk").last(),
        **_changes_context(request, pool, live, **forms),
    }
    return render(request, "pools/pool_detail.html", context, status=status)


def _changes_context(
    request: HttpRequest, pool, live, *, extend_form=None, grow_form=None, shrink_form=None
) -> dict:
    """What the pool page shows of the pool's end and size: reminders, its extensions and resizes, and the
    forms to ask for more, for who may change the pool."""
    may_change = asked_or_administers(request.user, pool.request)
    in_use = pool.state in (PoolState.ACTIVE, PoolState.RECLAIMING)
    may_resize = may_change and pool.state == PoolState.ACTIVE
    if may_resize and grow_form is None:  # the offers are read only where the form is shown
        grow_form = GrowForm(specs=[offer.spec for offer in selectors.spec_offers()])
    return {
        "reminders": upcoming_reminders(pool),
        "changes": pool.changes.select_related("submitted_by").prefetch_related("items").order_by("-pk"),
        "billing_ended_at": pool.billing_ended_at,
        "may_extend": may_change and in_use and pool.end_at is not None,
        "may_resize": may_resize,
        "extend_form": extend_form or ExtendForm(),
        "grow_form": grow_form,
        "shrink_form": shrink_form,
        "live_allocations": live,
    }


def _change_pool(request: HttpRequest, tenant_slug: str, pk: int, form_class, call, done, **kwargs):
    """One change of a pool asked from its page (extend, grow, shrink), `done` what it says when made (or a
    function of what `call` returned that says it): a form that does not parse, or the service's refusal,
    shows the page again with the reason and nothing changed."""
    pool = selectors.visible_pool(user=request.user, tenant_slug=tenant_slug, pk=pk)
    form = form_class(request.POST, **kwargs)
    if form.is_valid():
        try:
            result = call(pool, form.cleaned_data)
        except PortalError as error:
            form.add_error(None, error.message)
        else:
            told = done(result) if callable(done) else done
            messages.success(request, told % {"id": getattr(result, "pk", pool.pk)})
            return redirect("pool", tenant_slug=tenant_slug, pk=pool.pk)
    return pool, form


@login_required
@require_POST
def pool_extend(request: HttpRequest, tenant_slug: str, pk: int) -> HttpResponse:
    outcome = _change_pool(
        request,
        tenant_slug,
        pk,
        ExtendForm,
        lambda pool, data: services.request_extension(
            pool_id=pool.pk, user=request.user, end_at=data["end_at"], justification=data["justification"]
        ),
        lambda asked: (
            _("Extension #%(id)s approved by the policy: the pool's end has moved.")
            if asked.state == RequestState.FULFILLED
            else _("Extension #%(id)s asked for; the end moves once an approver approves it.")
        ),
    )
    return outcome if isinstance(outcome, HttpResponse) else _pool_again(request, *outcome, "extend_form")


@login_required
@require_POST
def pool_grow(request: HttpRequest, tenant_slug: str, pk: int) -> HttpResponse:
    outcome = _change_pool(
        request,
        tenant_slug,
        pk,
        GrowForm,
        lambda pool, data: services.request_growth(
            pool_id=pool.pk,
            user=request.user,
            items=[(data["spec"], data["count"])],
            justification=data["justification"],
        ),
        _("Resize #%(id)s asked for; once approved, the queue places it in this pool."),
        specs=[offer.spec for offer in selectors.spec_offers()],
    )
    return outcome if isinstance(outcome, HttpResponse) else _pool_again(request, *outcome, "grow_form")


@login_required
@require_POST
def pool_shrink(request: HttpRequest, tenant_slug: str, pk: int) -> HttpResponse:
    pool = selectors.visible_pool(user=request.user, tenant_slug=tenant_slug, pk=pk)
    live = [a.pk for a in pool.allocations.all() if a.released_at is None]
    outcome = _change_pool(
        request,
        tenant_slug,
        pk,
        ShrinkForm,
        lambda pool, data: services.shrink_pool(
            pool_id=pool.pk, user=request.user, allocation_ids=data["allocation"]
        ),
        _("Pool #%(id)s gave those instances back; billing for them stopped now."),
        allocation_ids=live,
    )
    return outcome if isinstance(outcome, HttpResponse) else _pool_again(request, *outcome, "shrink_form")


def _pool_again(request: HttpRequest, pool, form, name: str) -> HttpResponse:
    """The pool page again, with the refused form and its errors (400)."""
    return _pool_page(request, pool, status=400, **{name: form})


@login_required
@require_POST
def pool_release(request: HttpRequest, tenant_slug: str, pk: int) -> HttpResponse:
    pool = selectors.visible_pool(user=request.user, tenant_slug=tenant_slug, pk=pk)
    return _act(
        request,
        lambda: services.release_pool(pool_id=pool.pk, user=request.user),
        _("Pool #%(id)s is being released.") % {"id": pool.pk},
        redirect("pool", tenant_slug=tenant_slug, pk=pool.pk),
    )


def _tenant_list(
    request: HttpRequest, tenant_slug: str, *, rows: Callable[..., QuerySet], states: list[tuple[str, str]]
) -> tuple[dict, int]:
    """The context of a tenant's list of requests or pools, filtered by the address and paged, and
    its status: filters that do not hold (an unknown state, a project that is not the tenant's)
    answer 400, the form saying why, and no rows."""
    tenant = tenancy.visible_tenant(user=request.user, slug=tenant_slug)
    form = ListFilterForm(request.GET, projects=tenancy.tenant_projects(tenant=tenant), states=states)
    context = {"tenant": tenant, "form": form, "page": None, "filtered": False}
    if not form.is_valid():
        return context, 400
    filters = form.filters()
    found = rows(user=request.user, tenant=tenant, **filters)
    context["page"] = Paginator(found, LIST_PAGE_SIZE).get_page(request.GET.get("page"))
    context["filtered"] = any(filters.values())
    return context, 200


@login_required
def tenant_requests(request: HttpRequest, tenant_slug: str) -> HttpResponse:
    context, status = _tenant_list(
        request, tenant_slug, rows=selectors.tenant_requests, states=RequestState.choices
    )
    page = context["page"]
    context["positions"] = selectors.queue_positions() if page is not None else {}
    context["refresh"] = refresh_while(
        page is not None and any(r.state in selectors.WAITING_REQUEST_STATES for r in page)
    )
    return render(request, "pools/tenant_requests.html", context, status=status)


@login_required
def tenant_pools(request: HttpRequest, tenant_slug: str) -> HttpResponse:
    context, status = _tenant_list(
        request, tenant_slug, rows=selectors.tenant_pools, states=PoolState.choices
    )
    page = context["page"]
    context["refresh"] = refresh_while(
        page is not None and any(p.state in selectors.MOVING_POOL_STATES for p in page)
    )
    return render(request, "pools/tenant_pools.html", context, status=status)
