"""Reads of capacity for the dashboard and the API, in a fixed number of queries.

Compute-slice arithmetic (allocated, free, stranded) comes from the MIG catalogue;
a full GPU counts as all seven compute slices.
"""

from __future__ import annotations

import time
from collections import defaultdict
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from django.conf import settings
from django.db.models import Case, Prefetch, QuerySet, Value, When
from django.shortcuts import get_object_or_404

from pools import capacity_version, mig, placement
from pools import placement_availability as availability
from pools.mig import profile_from_resource
from pools.models import (
    Allocation,
    Cluster,
    GpuCapacity,
    GpuGroup,
    NodeCapacity,
    Pool,
    PoolRequest,
    PoolState,
    SpecAndCount,
    WorkloadProfile,
)
from pools.specs import Spec, specs_of

if TYPE_CHECKING:
    from portal.models import Project, Tenant


def clusters() -> QuerySet[Cluster]:
    return Cluster.objects.order_by("name")


def nodes(*, cluster: str = "", group: str = "", model: str = "") -> QuerySet[NodeCapacity]:
    queryset = (
        NodeCapacity.objects.select_related("cluster", "group")
        .prefetch_related(Prefetch("specs", queryset=SpecAndCount.objects.order_by("resource_name")))
        .order_by("cluster__name", "name")
    )
    if cluster:
        queryset = queryset.filter(cluster__name=cluster)
    if group:
        queryset = queryset.filter(group__name=group)
    if model:
        queryset = queryset.filter(gpu_model=model)
    return queryset


def gpus(*, cluster: str = "", node: str = "", model: str = "") -> QuerySet[GpuCapacity]:
    queryset = GpuCapacity.objects.select_related("node__cluster", "node__group").order_by(
        "node__cluster__name", "node__name", "index"
    )
    if cluster:
        queryset = queryset.filter(node__cluster__name=cluster)
    if node:
        queryset = queryset.filter(node__name=node)
    if model:
        queryset = queryset.filter(model=model)
    return queryset


def _compute_of(model: str, profile: str) -> int:
    if profile == "full":
        return mig.COMPUTE_SLICES
    try:
        return mig.gpu_model(model).profile(profile).compute_slices
    except ValueError:
        return 0


@dataclass
class ModelSummary:
    cluster: str
    model: str
    gpus: int = 0
    mig_gpus: int = 0
    full_gpus: int = 0
    unschedulable_gpus: int = 0
    compute_total: int = 0
    compute_allocated: int = 0
    compute_stranded: int = 0

    @property
    def compute_free(self) -> int:
        return self.compute_total - self.compute_allocated - self.compute_stranded


def capacity_summary() -> list[ModelSummary]:
    """Per cluster and GPU model: GPUs, and compute slices total / allocated / free / stranded."""
    summaries: dict[tuple[str, str], ModelSummary] = {}
    present = GpuCapacity.objects.filter(present=True, node__present=True).select_related(
        "node__cluster", "node"
    )
    for gpu in present:
        key = (gpu.node.cluster.name, gpu.model)
        summary = summaries.setdefault(key, ModelSummary(*key))
        summary.gpus += 1
        summary.mig_gpus += gpu.mig_enabled
        summary.full_gpus += not gpu.mig_enabled
        summary.unschedulable_gpus += not gpu.schedulable
        summary.compute_total += mig.COMPUTE_SLICES
        summary.compute_stranded += gpu.compute[1]
    allocated = SpecAndCount.objects.filter(node__present=True, allocated__gt=0).select_related(
        "node__cluster"
    )
    for spec in allocated:
        key = (spec.node.cluster.name, spec.node.gpu_model)
        if key in summaries:
            summaries[key].compute_allocated += spec.allocated * _compute_of(
                spec.node.gpu_model, spec.profile
            )
    return [summaries[key] for key in sorted(summaries)]


# --- the operator dashboard ------------------------------------------------------------------


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
        return [_held(Segment(0, mig.MEMORY_SLICES, "full", gpu.uuid), holders.get((gpu.pk, 0), ""))]
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


# --- what can be requested ----------------------------------------------------------------------


@dataclass(frozen=True)
class ClusterOffer:
    cluster: str
    available: int  # how many one request could get there now
    total: int  # the most one request could ever get there


@dataclass(frozen=True)
class SpecOffer:
    spec: Spec
    available: int
    total: int
    by_cluster: tuple[ClusterOffer, ...]


@dataclass(frozen=True)
class CapacityPicture:
    """Every cluster with GPUs, which are ready and which place work by group, and what each offers."""

    clusters: list[Cluster]
    ready: set[int]
    group_names: dict[int, set[str]]  # per cluster id, its GPU groups (empty: it places by no group)
    fleets: dict[str, placement.Fleet]
    found: dict[availability.Key, availability.Availability]

    def group_for(self, cluster: Cluster, purpose: str) -> str | None:
        """The GPU group a request of this purpose lands in on that cluster (None: any of its GPUs),
        as the queue places it."""
        return (purpose or None) if self.group_names[cluster.pk] else None

    def groups(self, clusters: list[Cluster]) -> set[str]:
        return {name for c in clusters for name in self.group_names[c.pk]}

    def offer(self, cluster: Cluster, purpose: str, spec: Spec) -> availability.Availability | None:
        """What one request of the spec could get on the cluster now and ever; None where it cannot
        land at all (no such GPU in the purpose's group). A cluster that is not ready offers nothing now."""
        found = self.found.get((cluster.name, self.group_for(cluster, purpose), spec.gpu_model, spec.profile))
        if found is None or cluster.pk in self.ready:
            return found
        return availability.Availability(now=0, ever=found.ever)


_held_picture: tuple[int, float, CapacityPicture] | None = None  # this process's: version, built at, picture


def capacity_picture() -> CapacityPicture:
    """The fleet as placement sees it, with availability per cluster, group and spec; kept while the
    capacity version holds, for at most CAPACITY_PICTURE_SECONDS."""
    global _held_picture
    version = capacity_version.current()  # read before the data: a later change bumps it again
    held = _held_picture
    if held and held[0] == version and time.monotonic() - held[1] < settings.CAPACITY_PICTURE_SECONDS:
        return held[2]
    picture = _build_picture()
    _held_picture = (version, time.monotonic(), picture)
    return picture


def _build_picture() -> CapacityPicture:
    clusters = list(Cluster.objects.order_by("name"))
    group_names: dict[int, set[str]] = {c.pk: set() for c in clusters}
    for cluster_id, name in GpuGroup.objects.values_list("cluster_id", "name"):
        group_names[cluster_id].add(name)
    fleets = fleet_snapshot(clusters, {pk: bool(names) for pk, names in group_names.items()})
    found = availability.availability(gpu for fleet in fleets.values() for gpu in fleet.gpus)
    ready = {c.pk for c in clusters if c.status == Cluster.Status.READY}
    return CapacityPicture(clusters, ready, group_names, fleets, found)


def spec_offers(
    *, purpose: str = "", cluster: Cluster | None = None, picture: CapacityPicture | None = None
) -> list[SpecOffer]:
    """Every spec one request could ever get, within the purpose's GPU group and the cluster when
    given: how many now, the most ever, on the best cluster and on each."""
    picture = picture or capacity_picture()
    candidates = [c for c in picture.clusters if cluster is None or c.pk == cluster.pk]
    models = {model for (name, _g, model, _p) in picture.found if name in {c.name for c in candidates}}
    offers = []
    for spec in specs_of(sorted(models)):
        by_cluster = tuple(
            ClusterOffer(c.name, found.now, found.ever)
            for c in candidates
            if (found := picture.offer(c, purpose, spec)) is not None and found.ever > 0
        )
        if by_cluster:
            available = max(o.available for o in by_cluster)
            offers.append(SpecOffer(spec, available, max(o.total for o in by_cluster), by_cluster))
    return offers


# --- a project's requests and pools -------------------------------------------------------------


# Pools that still hold (or are about to hold, or give back) capacity: the project page lists them first.
LIVE_POOL_STATES = (PoolState.PROVISIONING, PoolState.ACTIVE, PoolState.RELEASING)


def _request_rows(queryset: QuerySet[PoolRequest]) -> QuerySet[PoolRequest]:
    """Requests as lists show them, newest first: a fixed number of queries however many rows."""
    return (
        queryset.select_related("project", "submitted_by")
        .prefetch_related("items")
        .order_by("-submitted_at", "-pk")
    )


def _pool_rows(queryset: QuerySet[Pool]) -> QuerySet[Pool]:
    """Pools as lists show them, newest first: a fixed number of queries however many rows."""
    return (
        queryset.select_related("project", "cluster", "request")
        .prefetch_related("request__items")
        .order_by("-reserved_at", "-pk")
    )


def project_requests(*, project: Project) -> QuerySet[PoolRequest]:
    return _request_rows(project.pool_requests.all())


def project_pools(*, project: Project) -> QuerySet[Pool]:
    """The project's pools, live ones first: those are what its people come to the page for."""
    live_first = Case(When(state__in=LIVE_POOL_STATES, then=Value(0)), default=Value(1))
    return _pool_rows(project.pools.all()).alias(gone=live_first).order_by("gone", "-reserved_at", "-pk")


def tenant_requests(
    *, user, tenant: Tenant, state: str = "", project: Project | None = None
) -> QuerySet[PoolRequest]:
    """The tenant's pool requests that the user may see, newest first; of one state or project if given."""
    queryset = PoolRequest.objects.visible_to(user).filter(project__tenant=tenant)
    if state:
        queryset = queryset.filter(state=state)
    if project is not None:
        queryset = queryset.filter(project=project)
    return _request_rows(queryset)


def tenant_pools(*, user, tenant: Tenant, state: str = "", project: Project | None = None) -> QuerySet[Pool]:
    """The tenant's pools that the user may see, newest first; of one state or project if given."""
    queryset = Pool.objects.visible_to(user).filter(project__tenant=tenant)
    if state:
        queryset = queryset.filter(state=state)
    if project is not None:
        queryset = queryset.filter(project=project)
    return _pool_rows(queryset)


def queue_positions() -> dict[int, int]:
    """Position (1-based) of every waiting request, in admission order."""
    ids = PoolRequest.objects.waiting().values_list("pk", flat=True)
    return {pk: n for n, pk in enumerate(ids, start=1)}


def visible_request(*, user, tenant_slug: str, pk: int) -> PoolRequest:
    return get_object_or_404(
        PoolRequest.objects.visible_to(user)
        .select_related("project__tenant", "cluster", "submitted_by", "decided_by")
        .prefetch_related("items", "events__actor"),
        project__tenant__slug=tenant_slug,
        pk=pk,
    )


def visible_pool(*, user, tenant_slug: str, pk: int) -> Pool:
    return get_object_or_404(
        Pool.objects.visible_to(user)
        .select_related("project__tenant", "cluster", "request")
        .prefetch_related(
            "request__items",
            "events__actor",
            Prefetch("allocations", queryset=Allocation.objects.select_related("gpu__node").order_by("pk")),
        ),
        project__tenant__slug=tenant_slug,
        pk=pk,
    )


def render_reason(data) -> str:
    """A stored reason (its template and values) in the language of the current request."""
    from django.utils.translation import gettext

    if isinstance(data, dict):
        values = {key: render_reason(value) for key, value in data["params"].items()}
        template = data["template"]
        return (template if template == "%(text)s" else gettext(template)) % values
    if isinstance(data, list):
        return "; ".join(render_reason(item) for item in data)
    return data


def waiting_reason(request: PoolRequest) -> str:
    return (
        render_reason(request.waiting_reason_data) if request.waiting_reason_data else request.waiting_reason
    )


# --- the placement engine's view of the fleet ----------------------------------------------------


def ready_clusters() -> tuple[list[Cluster], dict[int, bool]]:
    """Clusters placement may use, and whether each places work by GPU group."""
    clusters = list(Cluster.objects.filter(status=Cluster.Status.READY).order_by("name"))
    with_groups = set(GpuGroup.objects.values_list("cluster_id", flat=True))
    return clusters, {c.pk: c.pk in with_groups for c in clusters}


def _live_allocations() -> dict[int, list[Allocation]]:
    by_gpu: dict[int, list[Allocation]] = defaultdict(list)
    for allocation in Allocation.objects.filter(released_at__isnull=True):
        by_gpu[allocation.gpu_id].append(allocation)
    return by_gpu


def _overlaps(instance: dict, model: mig.GpuModel, held: list[tuple[int, int]]) -> bool:
    """Whether an instance shares a memory slice with a live allocation. Slices, not starts, decide:
    a cluster may report an instance at another start than the one planned, never a shared slice."""
    start = instance["start"]
    end = start + model.profile(instance["profile"]).memory_slices
    return any(lower < end and start < upper for lower, upper in held)


def fleet_snapshot(clusters: list[Cluster], use_groups: dict[int, bool]) -> dict[str, placement.Fleet]:
    """Per cluster name, the placement engine's view of its GPUs: planned layouts and live allocations."""
    allocations = _live_allocations()
    gpus = (
        GpuCapacity.objects.filter(present=True, node__present=True, node__cluster__in=clusters)
        .select_related("node__cluster", "node__group")
        .order_by("node__cluster__name", "node__name", "index")
    )
    fleets: dict[str, list[placement.Gpu]] = defaultdict(list)
    for gpu in gpus:
        node = gpu.node
        planned = gpu.planned_layout
        mig_on = planned["mig"] if planned else gpu.mig_enabled
        layout = planned["instances"] if planned else gpu.layout
        held = [(a.slices.lower, a.slices.upper) for a in allocations.get(gpu.pk, ())]
        whole_taken = any(a.profile == mig.FULL_GPU for a in allocations.get(gpu.pk, ()))
        model = mig.gpu_model(gpu.model)
        fleets[node.cluster.name].append(
            placement.Gpu(
                id=str(gpu.pk),
                node=f"{node.cluster.name}/{node.name}",
                model=gpu.model,
                mig=mig_on,
                allocated=whole_taken,
                instances=tuple(
                    placement.Slot(i["profile"], i["start"], _overlaps(i, model, held)) for i in layout
                )
                if mig_on
                else (),
                group=node.group.name if node.group and use_groups[node.cluster_id] else None,
                cluster=node.cluster.name,
                schedulable=gpu.schedulable and node.ready,
                reconfiguring=node.mig_state in ("pending", "rebooting") or planned is not None,
            )
        )
    return {name: placement.Fleet(tuple(found)) for name, found in fleets.items()}
