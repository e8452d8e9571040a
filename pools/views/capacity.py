"""The operators' capacity pages: the fleet per cluster and GPU group, one group's nodes (paged) and one
node, each drawing only what it shows; other apps add their part of each page through
`AppPlugin.capacity_sections`. They exist only for staff who may view capacity; anyone else gets 404."""

from __future__ import annotations

from django.contrib.auth.decorators import login_required
from django.core.paginator import Paginator
from django.http import Http404, HttpRequest, HttpResponse
from django.shortcuts import get_object_or_404, render
from django.views.decorators.http import require_GET

from pools import mig, selectors
from pools.apps import VIEW_CAPACITY
from pools.models import Cluster, GpuGroup, NodeCapacity
from pools.selectors.binding import open_trespasses, vanished_devices
from pools.views.drains import may_drain
from portal import shell
from portal.pagination import paged
from portal.permissions import require_staff

NODES_PER_PAGE = 10  # a group's nodes, each drawn GPU by GPU (80 GPUs of 8-GPU nodes)
NODES_LISTED_PER_PAGE = 25  # the overview's list of nodes, those to look at first
TRESPASSES_PER_PAGE = 20  # a node's GPUs in use by namespaces that hold none there
NODE_NAME_LENGTH = 253  # the longest node name Kubernetes allows: a longer search finds nothing anyway
UNGROUPED = "none"  # the group part of the address of a cluster's nodes in no GPU group


def _drawing(request: HttpRequest, nodes: list) -> dict:
    """What a page drawing these nodes' GPUs needs: the views, their legend and the buttons allowed."""
    views = selectors.node_views(nodes)
    return {
        "nodes": views,
        "legend": selectors.legend(views),
        "memory_slices": range(mig.MEMORY_SLICES),
        **may_drain(request),
    }


@login_required
@require_GET
def dashboard(request: HttpRequest) -> HttpResponse:
    """The whole fleet: totals, per cluster and model, per cluster and GPU group; and its nodes, those to look
    at first (`?node=` finds them by name)."""
    require_staff(user=request.user, permission=VIEW_CAPACITY)
    name = request.GET.get("node", "").strip()[:NODE_NAME_LENGTH]
    summary = selectors.capacity_summary()
    totals = {
        "gpus": sum(s.gpus for s in summary),
        "compute_total": sum(s.compute_total for s in summary),
        "compute_allocated": sum(s.compute_allocated for s in summary),
        "compute_free": sum(s.compute_free for s in summary),
        "compute_stranded": sum(s.compute_stranded for s in summary),
    }
    context = {
        "clusters": selectors.overview(),
        "summary": summary,
        "totals": totals,
        "node_name": name,
        "listed": Paginator(selectors.listed_nodes(name=name), NODES_LISTED_PER_PAGE).get_page(
            request.GET.get("page")
        ),
        "sections": shell.capacity_sections(request, shell.CapacityScope()),
    }
    return render(request, "pools/dashboard.html", context)


def _group_of(cluster: Cluster, group: str) -> GpuGroup | None:
    """The cluster's GPU group named in the address by its id, or None for "none" (its nodes in no
    group); anything else is not found."""
    if group == UNGROUPED:
        return None
    if not (group.isascii() and group.isdigit() and len(group) < 19):
        raise Http404
    return get_object_or_404(GpuGroup, pk=int(group), cluster=cluster)


@login_required
@require_GET
def group(request: HttpRequest, pk: int, group: str) -> HttpResponse:
    """One GPU group of a cluster (or its nodes in no group): its figures, then its nodes a page at a time,
    each with its GPUs drawn."""
    require_staff(user=request.user, permission=VIEW_CAPACITY)
    cluster = get_object_or_404(Cluster, pk=pk)
    found = _group_of(cluster, group)
    page = Paginator(selectors.group_nodes(cluster=cluster, group=found), NODES_PER_PAGE).get_page(
        request.GET.get("page")
    )
    figures = selectors.fleet_figures(by=lambda where: (where.cluster_id, where.group_id))
    scope = shell.CapacityScope(
        cluster_id=cluster.pk, group_id=found.pk if found else None, ungrouped=found is None
    )
    context = {
        "cluster": cluster,
        "group": found,
        "figures": figures.get((cluster.pk, found.pk if found else None), selectors.ComputeFigures()),
        "offers": found.offer_labels() if found else [],
        "page": page,
        "sections": shell.capacity_sections(request, scope),
        **_drawing(request, list(page.object_list)),
    }
    return render(request, "pools/capacity_group.html", context)


@login_required
@require_GET
def node(request: HttpRequest, pk: int) -> HttpResponse:
    """One node: its GPUs drawn large, with their drain buttons, its resources, GPU pods and MIG state."""
    require_staff(user=request.user, permission=VIEW_CAPACITY)
    found = get_object_or_404(NodeCapacity.objects.select_related("cluster", "group"), pk=pk)
    drawing = _drawing(request, [found])
    view = drawing["nodes"][0]
    scope = shell.CapacityScope(
        cluster_id=found.cluster_id,
        group_id=found.group_id,
        node_id=found.pk,
        gpu_ids=tuple(g.gpu.pk for g in view.gpus),
    )
    context = {
        "node": found,
        "view": view,
        "trespasses": paged(request, open_trespasses(node=found), TRESPASSES_PER_PAGE, "trespasses_page"),
        "vanished": vanished_devices(node=found),
        "group_key": found.group_id or UNGROUPED,
        "sections": shell.capacity_sections(request, scope),
        **drawing,
    }
    return render(request, "pools/capacity_node.html", context)
