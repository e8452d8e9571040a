"""Draining and undraining a GPU or a node from the capacity pages: a drain first names the pools
that keep running there (the same selector as the admin's warning), then goes through the service;
either way the operator goes back to the capacity page they came from (`next`, when it is of this site)."""

from __future__ import annotations

from collections.abc import Callable

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.http import HttpRequest, HttpResponse
from django.shortcuts import get_object_or_404, redirect, render
from django.urls import reverse
from django.utils.translation import gettext as _
from django.views.decorators.http import require_POST

from pools import selectors, services
from pools.apps import DRAIN_GPU, DRAIN_NODE
from pools.models import GpuCapacity, NodeCapacity
from portal import redirects
from portal.permissions import require_staff, staff_may


def may_drain(request: HttpRequest) -> dict[str, bool]:
    """Which drain buttons the dashboard shows this user."""
    return {
        "may_drain_gpus": staff_may(user=request.user, permission=DRAIN_GPU),
        "may_drain_nodes": staff_may(user=request.user, permission=DRAIN_NODE),
    }


def back_to(request: HttpRequest) -> str:
    """The capacity page the button was pressed on (`next`), else the capacity overview."""
    return redirects.back_to(request, reverse("capacity-dashboard"))


def _drain(
    request: HttpRequest, *, name: str, held: Callable[[], list], apply: Callable[[bool], object]
) -> HttpResponse:
    """Undrain at once; drain only once confirmed, after a page naming the pools that stay there."""
    if request.POST.get("action") == "undrain":
        apply(False)
        messages.success(request, _("%(name)s takes new work again.") % {"name": name})
        return redirect(back_to(request))
    pools = held()
    if request.POST.get("confirmed") != "yes":
        context = {"name": name, "pools": pools, "next": back_to(request)}
        return render(request, "pools/drain_confirm.html", context)
    apply(True)
    messages.success(request, _("%(name)s is drained: it gets no new work.") % {"name": name})
    if pools:
        messages.warning(
            request,
            _("These pools keep running on what was drained: %(pools)s.")
            % {"pools": ", ".join(p.name for p in pools)},
        )
    return redirect(back_to(request))


@login_required
@require_POST
def gpu_drain(request: HttpRequest, pk: int) -> HttpResponse:
    require_staff(user=request.user, permission=DRAIN_GPU)
    gpu = get_object_or_404(GpuCapacity.objects.select_related("node"), pk=pk)
    return _drain(
        request,
        name=_("GPU %(index)s of %(node)s") % {"index": gpu.index, "node": gpu.node.name},
        held=lambda: selectors.pools_holding(gpu_ids=[gpu.pk]),
        apply=lambda drained: services.set_gpu_drained(gpu=gpu, drained=drained, actor=request.user),
    )


@login_required
@require_POST
def node_drain(request: HttpRequest, pk: int) -> HttpResponse:
    require_staff(user=request.user, permission=DRAIN_NODE)
    node = get_object_or_404(NodeCapacity, pk=pk)
    return _drain(
        request,
        name=_("Node %(node)s") % {"node": node.name},
        held=lambda: selectors.pools_holding(node_ids=[node.pk]),
        apply=lambda drained: services.set_node_drained(node=node, drained=drained, actor=request.user),
    )
