"""The operators' dashboard: per cluster, group, node and GPU, each GPU as its memory slices
with the projects holding them, in a fixed number of queries."""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from pools import mig
from pools.mig import profile_from_resource
from pools.models import (
    Allocation,
    Cluster,
    GpuCapacity,
    GpuGroup,
    NodeCapacity,
    SpecAndCount,
    WorkloadProfile,
)

if TYPE_CHECKING:
    pass


@dataclass
class Segment:
    """A run of memory slices on the drawing of a GPU: an instance, or free space."""

    start: int
    span: int
    profile: str = ""  # empty for free slices
    uuid: str = ""
    holder: str = ""  # "tenant/project" of the pool holding it; empty when free
    holder_index: int = 0  # a stable colour number per holder


@dataclass
class GpuView:
    gpu: GpuCapacity
    segments: list[Segment]
    compute_used: int
    compute_stranded: int


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


def _segments(gpu: GpuCapacity, holders: dict[tuple[int, int], str]) -> list[Segment]:
    """The GPU's memory slices as instances (with the project holding each) and free runs."""
    if not gpu.mig_enabled:
        return [_held(Segment(0, mig.MEMORY_SLICES, mig.FULL_GPU, gpu.uuid), holders.get((gpu.pk, 0), ""))]
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
        taken.append(_held(segment, holders.get((gpu.pk, item["start"]), "")))
    segments, cursor = [], 0
    for segment in taken:
        if segment.start > cursor:
            segments.append(Segment(cursor, segment.start - cursor))
        segments.append(segment)
        cursor = max(cursor, segment.start + segment.span)
    if cursor < mig.MEMORY_SLICES:
        segments.append(Segment(cursor, mig.MEMORY_SLICES - cursor))
    return segments


def _held(segment: Segment, holder: str) -> Segment:
    segment.holder = holder
    segment.holder_index = sum(map(ord, holder)) % 8 if holder else 0
    return segment


def _holders() -> dict[tuple[int, int], str]:
    """(GPU id, first memory slice) → "tenant/project" of every live allocation."""
    live = Allocation.objects.filter(released_at__isnull=True).values_list(
        "gpu_id", "slices", "pool__project__tenant__slug", "pool__project__slug"
    )
    return {(gpu, slices.lower): f"{tenant}/{project}" for gpu, slices, tenant, project in live}


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
        view.nodes.append(NodeView(node, gpus_by_node[node.pk], specs_by_node[node.pk], workloads))
    result = []
    for cluster in Cluster.objects.order_by("name"):
        groups = [g for g in groups_by_cluster[cluster.pk].values() if g.nodes or g.group is not None]
        groups.sort(key=lambda g: (g.group is None, g.group.name if g.group else ""))
        result.append(ClusterView(cluster, groups))
    return result
