"""The operators' what-if pages: kept runs of a month of history on today's fleet and on a changed one, the
form that asks for a new run, one run's report with its charts, and two done runs compared.

For staff who may view capacity (`pools.view_gpucapacity`), as the capacity pages are; anyone else gets 404.
Only operators (`pools.add_whatifrun`) see the form and may ask for a run; an approver's ask is refused (403).
Runs are kept and run by pools/whatif/runs.py; the pages only read them (pools/whatif/selectors.py).
"""

from __future__ import annotations

from csp.decorators import csp_replace
from django.contrib.auth.decorators import login_required
from django.core.paginator import Paginator
from django.http import Http404, HttpRequest, HttpResponse
from django.shortcuts import redirect, render
from django.utils.translation import gettext as _
from django.views.decorators.http import require_GET, require_http_methods

from pools import pricing
from pools.apps import VIEW_CAPACITY
from pools.conf import settings
from pools.models import WhatIfRun, WhatIfState
from pools.views.refresh import refresh_while
from pools.whatif import charts, selectors
from pools.whatif.forms import WhatIfForm, last_month
from pools.whatif.report import BAD_INPUT
from pools.whatif.runs import MAX_CHANGES, may_start_runs, require_run_starter, start_whatif_run
from portal.charts import CHART_POLICY
from portal.errors import PortalError, bad_input
from portal.permissions import require_staff

PER_PAGE = 20


@login_required
@require_http_methods(["GET", "POST"])
def whatif_list(request: HttpRequest) -> HttpResponse:
    """GET: the kept runs, newest first, and, for operators, the form of a new one. POST (operators only):
    keep and start a run, then show it; bad input, or a run of theirs or too many runs going, shows the form
    again with what is wrong, and keeps nothing."""
    require_staff(user=request.user, permission=VIEW_CAPACITY)
    status, form = 200, None
    if request.method == "POST":
        require_run_starter(request.user)  # an approver's ask is refused before its input is read
        form = WhatIfForm(request.POST)
        status = 400
        if form.is_valid():
            try:
                run = start_whatif_run(
                    user=request.user,
                    month=form.cleaned_data["month"],
                    cluster=form.cleaned_data["cluster"] or None,
                    changes=form.changes(),
                )
            except BAD_INPUT as error:
                form.refused(error)
            except PortalError as error:
                form.add_error(error.field, error.message)
                status = error.status_code
            else:
                return redirect("whatif-run", pk=run.pk)
    elif may_start_runs(request.user):
        form = WhatIfForm(initial={"month": last_month()})
    page = Paginator(selectors.whatif_runs(), PER_PAGE).get_page(request.GET.get("page"))
    context = {
        "form": form,
        "page": page,
        "max_changes": MAX_CHANGES,
        "max_gpus": settings.WHATIF_MAX_GPUS,
        "max_runs": settings.WHATIF_MAX_RUNNING,
    }
    return render(request, "pools/whatif_list.html", context, status=status)


@login_required
@require_GET
def whatif_run(request: HttpRequest, pk: int) -> HttpResponse:
    """One run: what was asked; while it is queued or running, how far it is (the page refreshes itself);
    once done, the real and the changed fleet side by side and their charts; failed, why."""
    require_staff(user=request.user, permission=VIEW_CAPACITY)
    run = selectors.whatif_run(pk=pk)
    context = {
        "run": run,
        "refresh": refresh_while(run.in_between),
        "measures": list(charts.MEASURES.items()),
    }
    if run.state == WhatIfState.DONE:
        columns = selectors.fleet_columns(run)
        context["columns"] = columns
        context["rows"] = selectors.figure_rows(columns)
        context["step_hours"] = selectors.step_seconds(run) // 3600
    return render(request, "pools/whatif_run.html", context)


@login_required
@require_GET
@csp_replace(CHART_POLICY)
def whatif_chart(request: HttpRequest, pk: int, metric: str) -> HttpResponse:
    """A done run's chart of one measure: its real and changed fleet over the month."""
    require_staff(user=request.user, permission=VIEW_CAPACITY)
    if metric not in charts.MEASURES:
        raise Http404
    run = selectors.whatif_run(pk=pk)
    if run.state != WhatIfState.DONE:
        return _chart_refusal(_("What-if run #%(id)s is not done: it has no figures yet.") % {"id": run.pk})
    lines = [_lines(run)]
    return charts.svg_response(_svg(lines, metric, run))


@login_required
@require_GET
def whatif_compare(request: HttpRequest) -> HttpResponse:
    """Two done runs (`?a=&b=`): their fleets' figures side by side, and their charts overlaid."""
    require_staff(user=request.user, permission=VIEW_CAPACITY)
    chosen = _two_runs(request)
    if isinstance(chosen, str):
        return bad_input(request, chosen)
    first, second = chosen
    columns = [
        *selectors.fleet_columns(first, prefix=f"#{first.pk} "),
        *selectors.fleet_columns(second, prefix=f"#{second.pk} "),
    ]
    context = {
        "runs": chosen,
        "columns": columns,
        "rows": selectors.figure_rows(columns),
        "measures": list(charts.MEASURES.items()),
    }
    return render(request, "pools/whatif_compare.html", context)


@login_required
@require_GET
@csp_replace(CHART_POLICY)
def whatif_compare_chart(request: HttpRequest, metric: str) -> HttpResponse:
    """Two done runs' chart of one measure, each of their fleets a line."""
    require_staff(user=request.user, permission=VIEW_CAPACITY)
    if metric not in charts.MEASURES:
        raise Http404
    chosen = _two_runs(request)
    if isinstance(chosen, str):
        return _chart_refusal(chosen)
    first, second = chosen
    lines = [_lines(first, prefix=f"#{first.pk} "), _lines(second, prefix=f"#{second.pk} ")]
    return charts.svg_response(_svg(lines, metric, first))


def _two_runs(request: HttpRequest) -> tuple[WhatIfRun, WhatIfRun] | str:
    """The runs `?a=` and `?b=` name, both done and not the same; else what to choose instead."""
    values = [request.GET.get(key, "").strip() for key in ("a", "b")]
    if not all(values):
        return _("Choose two done runs to compare, as ?a=ID&b=ID.")
    wrong = [value for value in values if not (value.isascii() and value.isdigit() and len(value) < 19)]
    if wrong:
        shown = ", ".join(repr(value[:20]) for value in wrong)
        return _("A run is named by its number, not %(values)s.") % {"values": shown}
    ids = [int(value) for value in values]
    if ids[0] == ids[1]:
        return _("Choose two different runs to compare.")
    found = selectors.done_runs(ids=ids)
    missing = [f"#{pk}" for pk in ids if pk not in found]
    if missing:
        return _("Only done runs can be compared; not %(runs)s.") % {"runs": ", ".join(missing)}
    return found[ids[0]], found[ids[1]]


def _chart_refusal(reason: str) -> HttpResponse:
    """A chart's 400: plain text (an image tag shows no page)."""
    return HttpResponse(reason, status=400, content_type="text/plain; charset=utf-8")


def _lines(run: WhatIfRun, *, prefix: str = "") -> list[charts.Line]:
    return [
        charts.Line(f"{prefix}{selectors.FLEET_NAMES.get(name, name)}", summary.get("series") or {})
        for name, summary in (run.report or {}).get("fleets", {}).items()
    ]


def _svg(groups: list[list[charts.Line]], metric: str, run: WhatIfRun) -> bytes:
    zone = (run.report or {}).get("time_zone") or pricing.month_time_zone()
    return charts.lines_svg([line for group in groups for line in group], metric=metric, time_zone=zone)
