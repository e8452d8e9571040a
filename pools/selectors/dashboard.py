"""The operators' capacity pages: the fleet per cluster and GPU group (figures summed in SQL), then the
nodes of one group or one node drawn GPU by GPU, each GPU as its memory slices with the projects holding
them, in a fixed number of queries whatever the size of the fleet; and the pools a drain would leave
running on drained GPUs.

Colours: each project holding an instance on the page gets a colour number by the order of its id
among those projects, so that up to PALETTE_SIZE projects never share a colour; beyond that they cycle.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field

from django.db.models import BooleanField, Count, Exists, ExpressionWrapper, OuterRef, Q, QuerySet
from django.utils.translation import gettext as _
from django.utils.translation import gettext_lazy

from pools import mig
from pools.gpu_models import UnknownGpuModel, model_info
from pools.kinds import WHOLE, profile_of_resource
from pools.models import (
    Allocation,
    Cluster,
    GpuCapacity,
    GpuGroup,
    Health,
    NodeCapacity,
    Pool,
    SpecAndCount,
    Trespass,
    WorkloadProfile,
)
from pools.selectors.capacity import ComputeFigures, compute_figures, fleet_figures

PALETTE_SIZE = 12  # colours holder-0 … holder-11 in portal.css


@dataclass
class Segment:
    """A run of memory slices on the drawing of a GPU: an instance, or free space."""

    start: int
    span: int
    profile: str = ""  # empty for free slices
    uuid: str = ""
    holder: str = ""  # "tenant/project" of the pool holding it; empty when free
    project_id: int | None = None  # the project holding it
    holder_index: int = 0  # the project's colour number on this page


@dataclass
class GpuView:
    gpu: GpuCapacity
    segments: list[Segment]
    compute_used: int
    compute_stranded: int
    drained_in_use: bool = False  # drained (itself or its node) while a pool still holds part of it

    @property
    def in_use(self) -> bool:
        return any(s.holder for s in self.segments)


@dataclass
class NodeView:
    node: NodeCapacity
    gpus: list[GpuView] = field(default_factory=list)
    specs: list[SpecAndCount] = field(default_factory=list)
    # GPU pods running on the node: (namespace, project or None, profile, count)
    workloads: list[tuple[str, object, str, int]] = field(default_factory=list)
    figures: ComputeFigures = field(default_factory=lambda: ComputeFigures())

    @property
    def whole_only(self) -> str:
        """Why the node's GPUs are given out whole only (no MIG instances); empty where they may be cut.
        The engine refuses MIG items for the same reason: the model lacks a geometry (pools/gpu_models.py)."""
        try:
            if not self.node.gpu_model or model_info(self.node.gpu_model).mig is not None:
                return ""
        except UnknownGpuModel:
            return ""
        if any(view.gpu.mig_capable for view in self.gpus):
            return _(
                "%(model)s can run MIG, but the catalogue has no MIG geometry for it yet: "
                "its GPUs are given out whole."
            ) % {"model": self.node.gpu_model}
        return _("%(model)s has no MIG: its GPUs are given out whole.") % {"model": self.node.gpu_model}


Holders = dict[tuple[int, int], tuple[int, str]]


def _segments(gpu: GpuCapacity, holders: Holders) -> list[Segment]:
    """The GPU's memory slices as instances (with the project holding each) and free runs."""
    if not gpu.mig_enabled:
        return [_held(Segment(0, mig.MEMORY_SLICES, WHOLE.profile, gpu.uuid), holders.get((gpu.pk, 0)))]
    try:
        model = mig.gpu_model(gpu.model)
    except ValueError:
        return []
    taken: list[Segment] = []
    for item in sorted(gpu.layout, key=lambda i: i["start"]):
        try:
            span = model.profile(item["profile"]).memory_slices
        except ValueError:
            span = 1
        segment = Segment(item["start"], span, item["profile"], item.get("uuid", ""))
        taken.append(_held(segment, holders.get((gpu.pk, item["start"]))))
    segments, cursor = [], 0
    for segment in taken:
        if segment.start > cursor:
            segments.append(Segment(cursor, segment.start - cursor))
        segments.append(segment)
        cursor = max(cursor, segment.start + segment.span)
    if cursor < mig.MEMORY_SLICES:
        segments.append(Segment(cursor, mig.MEMORY_SLICES - cursor))
    return segments


def _held(segment: Segment, holder: tuple[int, str] | None) -> Segment:
    if holder:
        segment.project_id, segment.holder = holder
    return segment


def _holders(gpu_ids: list[int]) -> Holders:
    """(GPU id, first memory slice) → (project id, "tenant/project") of each live allocation on these GPUs
    (by their ids: a join through their nodes is planned as a scan of every live allocation of the fleet)."""
    live = Allocation.objects.filter(released_at__isnull=True, gpu_id__in=gpu_ids).values_list(
        "gpu_id", "slices", "pool__project_id", "pool__project__tenant__slug", "pool__project__slug"
    )
    return {
        (gpu, slices.lower): (project_id, f"{tenant}/{project}")
        for gpu, slices, project_id, tenant, project in live
    }


def _colour(segments: list[Segment]) -> None:
    """Give each project holding one of `segments` its colour number (see the module's docstring)."""
    projects = sorted({s.project_id for s in segments if s.project_id is not None})
    number = {project: i % PALETTE_SIZE for i, project in enumerate(projects)}
    for segment in segments:
        if segment.project_id is not None:
            segment.holder_index = number[segment.project_id]


@dataclass(frozen=True)
class LegendEntry:
    holder: str  # "tenant/project"
    holder_index: int


def legend(nodes: list[NodeView]) -> list[LegendEntry]:
    """Project → colour number of every project holding an instance drawn in `nodes`, by name."""
    found = {(s.holder, s.holder_index) for n in nodes for gpu in n.gpus for s in gpu.segments if s.holder}
    return [LegendEntry(holder, index) for holder, index in sorted(found)]


@dataclass(frozen=True)
class HeldPool:
    pool: Pool
    name: str  # "tenant / project / pool #id", as warnings name it


def pools_holding(*, gpu_ids: Iterable[int] = (), node_ids: Iterable[int] = ()) -> list[HeldPool]:
    """The pools with a live allocation on any of these GPUs or on any GPU of these nodes: what keeps
    running there after a drain. One query."""
    gpu_ids, node_ids = list(gpu_ids), list(node_ids)
    pools = (
        Pool.objects.filter(
            Q(allocations__gpu_id__in=gpu_ids) | Q(allocations__gpu__node_id__in=node_ids),
            allocations__released_at__isnull=True,
        )
        .select_related("project__tenant")
        .distinct()
        .order_by("project__tenant__slug", "project__slug", "pk")
    )
    return [
        HeldPool(
            pool, f"{pool.project.tenant.slug} / {pool.project.slug} / " + _("pool #%(id)s") % {"id": pool.pk}
        )
        for pool in pools
    ]


@dataclass
class GroupRow:
    """One GPU group of a cluster (or its nodes in no group): how many nodes, and their GPUs' figures."""

    cluster: Cluster
    group: GpuGroup | None
    nodes: int
    figures: ComputeFigures


DRA_CLAIMS = gettext_lazy("devices of its ResourceClaims")


@dataclass
class ClusterRow:
    cluster: Cluster
    groups: list[GroupRow] = field(default_factory=list)
    # The nodes with GPUs in use by the wrong namespace, and with pools' devices no longer published.
    trespassed_nodes: list[NodeCapacity] = field(default_factory=list)
    vanished_nodes: list[NodeCapacity] = field(default_factory=list)


def overview() -> list[ClusterRow]:
    """Every cluster with one row per GPU group and one for its nodes in no group (when it has any),
    present nodes and GPUs only (the fleet's figures, kept per capacity version), and the nodes with open
    trespasses or vanished devices: a fixed number of queries whatever the size of the fleet."""
    figures = fleet_figures(by=lambda where: (where.cluster_id, where.group_id))
    node_counts = {
        (row["cluster_id"], row["group_id"]): row["n"]
        for row in NodeCapacity.objects.filter(present=True)
        .values("cluster_id", "group_id")
        .annotate(n=Count("id"))
        .order_by()
    }
    groups: dict[int, list[GpuGroup]] = defaultdict(list)
    for group in GpuGroup.objects.order_by("name"):
        groups[group.cluster_id].append(group)
    trespassed: dict[int, list[NodeCapacity]] = defaultdict(list)
    open_trespasses = Trespass.objects.filter(ended_at__isnull=True).values("node_id")
    for node in NodeCapacity.objects.filter(pk__in=open_trespasses).order_by("name"):
        trespassed[node.cluster_id].append(node)
    vanished: dict[int, list[NodeCapacity]] = defaultdict(list)
    gone = Allocation.objects.filter(released_at__isnull=True, device_vanished_at__isnull=False).values(
        "gpu__node_id"
    )
    for node in NodeCapacity.objects.filter(pk__in=gone).order_by("name"):
        vanished[node.cluster_id].append(node)
    rows = []
    for cluster in Cluster.objects.order_by("name"):
        row = ClusterRow(
            cluster, trespassed_nodes=trespassed[cluster.pk], vanished_nodes=vanished[cluster.pk]
        )
        for group in [*groups[cluster.pk], None]:
            key = (cluster.pk, group.pk if group else None)
            if group is None and key not in node_counts:
                continue
            group_figures = figures.get(key, ComputeFigures())
            row.groups.append(GroupRow(cluster, group, node_counts.get(key, 0), group_figures))
        rows.append(row)
    return rows


def group_nodes(*, cluster: Cluster, group: GpuGroup | None) -> QuerySet[NodeCapacity]:
    """The present nodes of one GPU group of the cluster (None: those in no group), by name: to be paged,
    then drawn with `node_views`."""
    return NodeCapacity.objects.filter(cluster=cluster, group=group, present=True).order_by("name", "pk")


def listed_nodes(*, name: str = "") -> QuerySet[NodeCapacity]:
    """Present nodes, those an operator should look at first (`to_look_at`: not ready, drained, in error,
    or with a GPU unhealthy or drained), then by cluster and name; with `name`, only the nodes whose name
    holds it. To be paged."""
    troubled = GpuCapacity.objects.filter(node=OuterRef("pk"), present=True).filter(
        ~Q(health=Health.OK) | Q(drained=True)
    )
    look = Q(ready=False) | Q(drained=True) | ~Q(error="") | Q(gpu_trouble=True)
    found = (
        NodeCapacity.objects.filter(present=True)
        .annotate(gpu_trouble=Exists(troubled))
        .annotate(to_look_at=ExpressionWrapper(look, output_field=BooleanField()))
    )
    if name:
        found = found.filter(name__icontains=name)
    return found.select_related("cluster", "group").order_by("-to_look_at", "cluster__name", "name", "pk")


def node_views(nodes: list[NodeCapacity]) -> list[NodeView]:
    """These nodes (of one page) with their present GPUs drawn, their resources, GPU pods and figures, the
    projects on them coloured: seven queries however many nodes and GPUs."""
    node_ids = [node.pk for node in nodes]
    drawn = list(GpuCapacity.objects.filter(node_id__in=node_ids, present=True).order_by("index"))
    holders = _holders([gpu.pk for gpu in drawn])
    gpus_by_node: dict[int, list[GpuView]] = defaultdict(list)
    for gpu in drawn:
        used, stranded = gpu.compute
        gpus_by_node[gpu.node_id].append(GpuView(gpu, _segments(gpu, holders), used, stranded))
    _colour([s for views in gpus_by_node.values() for view in views for s in view.segments])
    specs_by_node: dict[int, list[SpecAndCount]] = defaultdict(list)
    for spec in SpecAndCount.objects.filter(node_id__in=node_ids, capacity__gt=0).order_by("resource_name"):
        specs_by_node[spec.node_id].append(spec)
    pods_by_node: dict[tuple[int, str], dict] = defaultdict(dict)
    running = WorkloadProfile.objects.filter(
        present=True,
        phase="Running",
        cluster_id__in={node.cluster_id for node in nodes},
        node_name__in={node.name for node in nodes},
    ).select_related("project__tenant")
    for pod in running.order_by("namespace", "resource_name"):
        key = (
            pod.namespace,
            pod.project,
            profile_of_resource(pod.resource_name) or pod.resource_name or DRA_CLAIMS,
        )
        counts = pods_by_node[(pod.cluster_id, pod.node_name)]
        counts[key] = counts.get(key, 0) + pod.count
    figures = compute_figures(by=("node_id",), where=Q(node_id__in=node_ids))
    views = []
    for node in nodes:
        pods = pods_by_node.get((node.cluster_id, node.name), {})
        workloads = [(ns, project, profile, count) for (ns, project, profile), count in pods.items()]
        for gpu_view in gpus_by_node[node.pk]:
            gpu_view.drained_in_use = (gpu_view.gpu.drained or node.drained) and gpu_view.in_use
        views.append(
            NodeView(
                node,
                gpus_by_node[node.pk],
                specs_by_node[node.pk],
                workloads,
                figures.get((node.pk,), ComputeFigures()),
            )
        )
    return views
