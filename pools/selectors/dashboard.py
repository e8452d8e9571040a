"""The operators' dashboard: per cluster, group, node and GPU, each GPU as its memory slices
with the projects holding them, in a fixed number of queries; and the pools a drain would leave
running on drained GPUs.

Colours: each project holding an instance on the page gets a colour number by the order of its id
among those projects, so that up to PALETTE_SIZE projects never share a colour; beyond that they cycle.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from django.db.models import Q
from django.utils.translation import gettext as _

from pools import mig
from pools.mig import profile_from_resource
from pools.models import (
    Allocation,
    Cluster,
    GpuCapacity,
    GpuGroup,
    NodeCapacity,
    Pool,
    SpecAndCount,
    WorkloadProfile,
)

if TYPE_CHECKING:
    pass

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


@dataclass
class GroupView:
    group: GpuGroup | None
    nodes: list[NodeView] = field(default_factory=list)


@dataclass
class ClusterView:
    cluster: Cluster
    groups: list[GroupView] = field(default_factory=list)


Holders = dict[tuple[int, int], tuple[int, str]]


def _segments(gpu: GpuCapacity, holders: Holders) -> list[Segment]:
    """The GPU's memory slices as instances (with the project holding each) and free runs."""
    if not gpu.mig_enabled:
        return [_held(Segment(0, mig.MEMORY_SLICES, mig.FULL_GPU, gpu.uuid), holders.get((gpu.pk, 0)))]
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


def _holders() -> Holders:
    """(GPU id, first memory slice) → (project id, "tenant/project") of every live allocation."""
    live = Allocation.objects.filter(released_at__isnull=True).values_list(
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


def legend(clusters: list[ClusterView]) -> list[LegendEntry]:
    """Project → colour number of every project holding an instance drawn in `clusters`, by name."""
    found = {
        (s.holder, s.holder_index)
        for c in clusters
        for g in c.groups
        for n in g.nodes
        for gpu in n.gpus
        for s in gpu.segments
        if s.holder
    }
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


def dashboard(*, include_absent: bool = False) -> list[ClusterView]:
    """Clusters → groups → nodes → GPUs with their MIG drawing, holders and GPU pods, in seven queries."""
    node_rows = NodeCapacity.objects.select_related("group").order_by("name")
    gpu_rows = GpuCapacity.objects.order_by("index")
    spec_rows = SpecAndCount.objects.filter(capacity__gt=0).order_by("resource_name")
    if not include_absent:
        node_rows, gpu_rows = (
            node_rows.filter(present=True),
            gpu_rows.filter(present=True, node__present=True),
        )
    holders = _holders()
    gpus_by_node: dict[int, list[GpuView]] = defaultdict(list)
    for gpu in gpu_rows:
        used, stranded = gpu.compute
        gpus_by_node[gpu.node_id].append(GpuView(gpu, _segments(gpu, holders), used, stranded))
    _colour([s for views in gpus_by_node.values() for view in views for s in view.segments])
    specs_by_node: dict[int, list[SpecAndCount]] = defaultdict(list)
    for spec in spec_rows:
        specs_by_node[spec.node_id].append(spec)
    pods_by_node: dict[tuple[int, str], dict] = defaultdict(dict)
    running = WorkloadProfile.objects.filter(present=True, phase="Running").select_related("project__tenant")
    for pod in running.order_by("namespace", "resource_name"):
        key = (pod.namespace, pod.project, profile_from_resource(pod.resource_name) or pod.resource_name)
        counts = pods_by_node[(pod.cluster_id, pod.node_name)]
        counts[key] = counts.get(key, 0) + pod.count
    groups_by_cluster: dict[int, dict[int | None, GroupView]] = defaultdict(dict)
    for group in GpuGroup.objects.order_by("name"):
        groups_by_cluster[group.cluster_id][group.pk] = GroupView(group)
    for node in node_rows:
        views = groups_by_cluster[node.cluster_id]
        view = views.get(node.group_id) or views.setdefault(None, GroupView(None))
        pods = pods_by_node.get((node.cluster_id, node.name), {})
        workloads = [(ns, project, profile, count) for (ns, project, profile), count in pods.items()]
        for gpu_view in gpus_by_node[node.pk]:
            gpu_view.drained_in_use = (gpu_view.gpu.drained or node.drained) and gpu_view.in_use
        view.nodes.append(NodeView(node, gpus_by_node[node.pk], specs_by_node[node.pk], workloads))
    result = []
    for cluster in Cluster.objects.order_by("name"):
        groups = [g for g in groups_by_cluster[cluster.pk].values() if g.nodes or g.group is not None]
        groups.sort(key=lambda g: (g.group is None, g.group.name if g.group else ""))
        result.append(ClusterView(cluster, groups))
    return result
