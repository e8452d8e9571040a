"""Operators' monitoring pages: the fleet, one GPU, one pool, and their charts (SVG). They exist only for
staff holding `monitoring.view_latest`; anyone else gets 404, as for billing's pages."""

from __future__ import annotations

from csp.decorators import csp_replace
from django import forms
from django.contrib.auth.decorators import login_required
from django.http import Http404, HttpRequest, HttpResponse
from django.shortcuts import render
from django.utils import timezone
from django.utils.translation import gettext as _
from django.utils.translation import gettext_lazy
from django.views.decorators.http import require_GET

from monitoring import selectors
from monitoring.pages import charts
from monitoring.selectors import kept
from pools.models import Cluster
from pools.selectors import fleet_figures
from portal.charts import CHART_POLICY
from portal.errors import InvalidInput, bad_input
from portal.pagination import paged
from portal.permissions import require_staff

PERMISSION = "monitoring.view_latest"
GPUS_PER_PAGE = 50
EVENTS_PER_PAGE = 20
TENANTS_PER_PAGE = 25
# The fleet page pages three lists at once: each has its own parameter.
EVENTS_PAGE = "events_page"
TENANTS_PAGE = "tenants_page"


def _sort_choices() -> list[tuple[str, str]]:
    labels = {
        "gpu": gettext_lazy("GPU"),
        "temperature": gettext_lazy("temperature"),
        "power": gettext_lazy("power"),
        "sm": gettext_lazy("SM activity"),
        "utilisation": gettext_lazy("utilisation"),
        "memory": gettext_lazy("memory used"),
    }
    return [
        choice for key in selectors.GPU_SORTS for choice in ((key, labels[key]), (f"-{key}", labels[key]))
    ]


class FleetForm(forms.Form):
    """The fleet page's filters, order and range, all in the address."""

    cluster = forms.ChoiceField(label=gettext_lazy("Cluster"), required=False)
    model = forms.ChoiceField(label=gettext_lazy("Model"), required=False)
    state = forms.ChoiceField(label=gettext_lazy("State"), required=False)
    sort = forms.ChoiceField(label=gettext_lazy("Order"), required=False)
    # Chosen on the efficiency table; kept when the GPU table's filters are sent.
    range = forms.ChoiceField(required=False, widget=forms.HiddenInput)

    def __init__(self, data, **kwargs):
        super().__init__(data, **kwargs)
        clusters = Cluster.objects.order_by("name").values_list("name", flat=True)
        # The models of the GPUs the table lists (present, on present nodes): the fleet's figures have them.
        models = sorted(fleet_figures(by=lambda where: where.model))
        everything = ("", _("all"))
        self.fields["cluster"].choices = [everything, *((name, name) for name in clusters)]
        self.fields["model"].choices = [everything, *((name, name) for name in models)]
        states = {
            "allocated": _("allocated"),
            "free": _("free"),
            "drained": _("drained"),
            "unhealthy": _("unhealthy"),
            "silent": _("silent (no fresh figures)"),
        }
        self.fields["state"].choices = [everything, *((s, states[s]) for s in selectors.GPU_STATES)]
        self.fields["sort"].choices = [
            (value, f"{label} {'↓' if value.startswith('-') else '↑'}") for value, label in _sort_choices()
        ]
        self.fields["range"].choices = [(name, name) for name in charts.RANGES]

    def clean_range(self) -> str:
        return self.cleaned_data["range"] or charts.DEFAULT_RANGE

    def clean_sort(self) -> str:
        return self.cleaned_data["sort"] or "gpu"


@login_required
@require_GET
def fleet(request: HttpRequest) -> HttpResponse:
    """Allocated against used per cluster, the hottest and idlest, recent errors, each tenant's
    efficiency (the fleet's figures, kept a few seconds: monitoring/selectors/kept.py), and every GPU
    (filtered, sorted, paged). Filters that do not hold answer 400 with the form saying why, and no GPU
    table."""
    require_staff(user=request.user, permission=PERMISSION)
    now = timezone.now()
    form = FleetForm(request.GET)
    valid = form.is_valid()
    chosen = form.cleaned_data if valid else {"range": charts.DEFAULT_RANGE}
    usage = kept.kept_cluster_usage()
    tenants = kept.kept_tenant_efficiency(
        range_name=chosen["range"], span=lambda at: charts.span(chosen["range"], now=at)
    )
    context = {
        "form": form,
        "clusters": usage.value,
        "figures_at": usage.at,
        "collection": selectors.collection_status(),
        "totals": selectors.fleet_totals(usage.value),
        "hottest": kept.kept_hottest().value,
        "idlest": kept.kept_idlest().value,
        "events": paged(request, selectors.recent_events(), EVENTS_PER_PAGE, EVENTS_PAGE),
        "tenants": paged(request, tenants.value, TENANTS_PER_PAGE, TENANTS_PAGE),
        "range": chosen["range"],
        "fresh_minutes": int(selectors.FRESH.total_seconds() // 60),
        "gpus": None,
        "rows": [],
    }
    if not valid:
        return render(request, "monitoring/fleet.html", context, status=400)
    gpus = selectors.gpu_table(
        cluster=chosen["cluster"], model=chosen["model"], state=chosen["state"], sort=chosen["sort"], now=now
    )
    listed = paged(request, gpus, GPUS_PER_PAGE, "page")
    page = listed["page"]
    held = selectors.holders(gpu_ids=[gpu.pk for gpu in page.object_list])
    fresh = selectors.fresh_since(now)
    context["gpus"] = listed
    context["rows"] = [
        (gpu, held[gpu.pk], gpu.seen_at is not None and gpu.seen_at >= fresh) for gpu in page.object_list
    ]
    return render(request, "monitoring/fleet.html", context)


def _range_or_400(request: HttpRequest) -> str | HttpResponse:
    try:
        return charts.parse_range(request.GET.get("range"))
    except InvalidInput as error:
        return bad_input(request, error.message)


@login_required
@require_GET
def gpu(request: HttpRequest, pk: int) -> HttpResponse:
    """One GPU: its figures and its instances', who holds each, its events, and its charts."""
    require_staff(user=request.user, permission=PERMISSION)
    chosen = _range_or_400(request)
    if isinstance(chosen, HttpResponse):
        return chosen
    detail = selectors.gpu_detail(gpu_id=pk)
    events = detail.gpu.events.order_by("-at", "-pk")
    context = {
        "detail": detail,
        "gpu": detail.gpu,
        "range": chosen,
        "ranges": list(charts.RANGES),
        "measures": list(charts.MEASURES.items()),
        "events": paged(request, events, EVENTS_PER_PAGE, EVENTS_PAGE),
    }
    return render(request, "monitoring/gpu.html", context)


def _chart_range(request: HttpRequest, metric: str, measures) -> str | HttpResponse:
    if metric not in measures:
        raise Http404
    try:
        return charts.parse_range(request.GET.get("range"))
    except InvalidInput as error:
        return charts.refusal(error)


@login_required
@require_GET
@csp_replace(CHART_POLICY)
def gpu_chart(request: HttpRequest, pk: int, metric: str) -> HttpResponse:
    """A GPU's metric over the range: the whole GPU, and each MIG instance for SM activity and memory."""
    require_staff(user=request.user, permission=PERMISSION)
    chosen = _chart_range(request, metric, charts.MEASURES)
    if isinstance(chosen, HttpResponse):
        return chosen
    return charts.svg_response(charts.gpu_svg(selectors.gpu_detail(gpu_id=pk), metric, chosen))


@login_required
@require_GET
def pool(request: HttpRequest, pk: int) -> HttpResponse:
    """Any tenant's pool, for operators: its allocations with their newest figures, and its charts."""
    require_staff(user=request.user, permission=PERMISSION)
    chosen = _range_or_400(request)
    if isinstance(chosen, HttpResponse):
        return chosen
    found = selectors.operator_pool(pool_id=pk)
    context = {
        "pool": found,
        "figures": selectors.pool_figures(pool=found),
        "range": chosen,
        "ranges": list(charts.RANGES),
        "measures": [(m, charts.MEASURES[m]) for m in charts.TENANT_MEASURES],
    }
    return render(request, "monitoring/pool.html", context)


@login_required
@require_GET
@csp_replace(CHART_POLICY)
def pool_chart(request: HttpRequest, pk: int, metric: str) -> HttpResponse:
    require_staff(user=request.user, permission=PERMISSION)
    chosen = _chart_range(request, metric, charts.TENANT_MEASURES)
    if isinstance(chosen, HttpResponse):
        return chosen
    return charts.svg_response(charts.pool_svg(selectors.operator_pool(pool_id=pk), metric, chosen))
