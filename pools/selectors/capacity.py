"""Reads of capacity: clusters, nodes and GPUs for the API, the fleet's figures (per cluster, group and
model), and what can be requested (availability per cluster, group and spec, from a picture of the fleet);
the fleet's figures and its picture are kept while the capacity version holds (pools/selectors/kept.py).

Compute-slice arithmetic (allocated, free, stranded) comes from the MIG catalogue; a full GPU
counts as all seven compute slices.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Hashable, Iterable
from dataclasses import dataclass, fields
from fractions import Fraction
from functools import cached_property, lru_cache

from django.db.models import Count, Exists, JSONField, OuterRef, Prefetch, Q, QuerySet, Sum
from django.db.models.expressions import RawSQL

from pools import kinds, mig, placement
from pools.models import (
    Allocation,
    Cluster,
    GpuCapacity,
    GpuGroup,
    Health,
    NodeCapacity,
    SpecAndCount,
)
from pools.placement import availability
from pools.selectors.fleet import fleet_snapshot
from pools.selectors.kept import Kept
from pools.specs import Spec, specs_of


def clusters() -> QuerySet[Cluster]:
    """Every cluster by name, with its GPU groups (the purposes a request may name there)."""
    return Cluster.objects.prefetch_related(
        Prefetch("groups", queryset=GpuGroup.objects.order_by("name"))
    ).order_by("name")


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


@dataclass
class ComputeFigures:
    """GPUs and compute slices of a set of GPUs (a cluster's model, a GPU group, a node): what the
    capacity summary and the capacity pages show, all from `compute_figures`."""

    gpus: int = 0
    mig_gpus: int = 0
    full_gpus: int = 0
    unschedulable_gpus: int = 0
    drained_gpus: int = 0  # drained itself or on a drained node
    unhealthy_gpus: int = 0
    drained_in_use_gpus: int = 0  # drained while a pool still holds part of it
    in_use_gpus: int = 0  # a pool holds part of it (drained, unhealthy or not)
    free_gpus: int = 0  # healthy, not drained and nobody holds any of it
    compute_total: int = 0
    compute_allocated: int = 0
    compute_stranded: int = 0

    @property
    def compute_free(self) -> int:
        return self.compute_total - self.compute_allocated - self.compute_stranded

    # A bar of BAR_STEPS steps: how many are allocated, then stranded (classes, as the CSP refuses styles).
    BAR_STEPS = 20

    @property
    def allocated_steps(self) -> int:
        return self._steps(self.compute_allocated)

    @property
    def stranded_steps(self) -> int:
        return min(self._steps(self.compute_stranded), self.BAR_STEPS - self.allocated_steps)

    def _steps(self, part: int) -> int:
        return round(self.BAR_STEPS * part / self.compute_total) if self.compute_total else 0

    def add(self, other: ComputeFigures) -> None:
        """Count `other`'s GPUs and slices in too."""
        for name in _FIGURES:
            setattr(self, name, getattr(self, name) + getattr(other, name))


_FIGURES = tuple(f.name for f in fields(ComputeFigures))


@dataclass
class ModelSummary(ComputeFigures):
    cluster: str = ""
    model: str = ""


# A MIG GPU's layout as its instances' profiles and starts, without their UUIDs: GPUs cut alike share it, so
# stranded slices are worked out once per distinct layout rather than once per GPU. Two plain functions of
# the row (no subquery per GPU), so that the figures of the whole fleet are one pass over its GPUs.
_LAYOUT_PART = (
    "CASE WHEN pools_gpucapacity.mig_enabled "
    "THEN jsonb_path_query_array(pools_gpucapacity.layout, '$[*].{part}') END"
)
_LAYOUT_PROFILES = RawSQL(_LAYOUT_PART.format(part="profile"), [], output_field=JSONField())
_LAYOUT_STARTS = RawSQL(_LAYOUT_PART.format(part="start"), [], output_field=JSONField())


@lru_cache(maxsize=4096)
def _layout_compute(model: str, shape: tuple[tuple[str, int], ...]) -> tuple[int, int]:
    """(compute slices provisioned, compute slices stranded) of a MIG layout, as GpuCapacity.compute says."""
    gpu = GpuCapacity(
        model=model,
        mig_enabled=True,
        layout=[{"profile": profile, "start": start} for profile, start in shape],
    )
    return gpu.compute


def _shape(profiles: list | None, starts: list | None) -> tuple[tuple[str, int], ...]:
    return tuple(sorted(zip(profiles or (), starts or (), strict=True), key=lambda entry: entry[1]))


def _spec_path(gpu_path: str) -> str:
    """The path from a SpecAndCount to what `gpu_path` names from a GpuCapacity (both hang off a node;
    a GPU's model is its node's)."""
    return "node__gpu_model" if gpu_path == "model" else gpu_path


def _gpu_figures(*, by: tuple[str, ...], where: Q | None = None) -> dict[tuple, ComputeFigures]:
    """`compute_figures` but for allocated slices: the GPUs of each group, counted in SQL."""
    drained = Q(drained=True) | Q(node__drained=True)
    takes_work = Q(health=Health.OK) & ~drained
    live = Allocation.objects.filter(gpu=OuterRef("pk"), released_at__isnull=True)
    rows = (
        GpuCapacity.objects.filter(Q(node__present=True) & (where or Q()), present=True)
        .annotate(profiles=_LAYOUT_PROFILES, starts=_LAYOUT_STARTS, in_use=Exists(live))
        .values(*by, "model", "mig_enabled", "profiles", "starts")
        .annotate(
            gpus=Count("id"),
            n_unschedulable=Count("id", filter=~takes_work),
            n_drained=Count("id", filter=drained),
            n_unhealthy=Count("id", filter=~Q(health=Health.OK)),
            n_drained_in_use=Count("id", filter=drained & Q(in_use=True)),
            n_in_use=Count("id", filter=Q(in_use=True)),
            n_free=Count("id", filter=takes_work & Q(in_use=False)),
        )
        .order_by()
    )
    figures: dict[tuple, ComputeFigures] = {}
    for row in rows:
        found = figures.setdefault(tuple(row[key] for key in by), ComputeFigures())
        count = row["gpus"]
        found.gpus += count
        found.mig_gpus += count if row["mig_enabled"] else 0
        found.full_gpus += 0 if row["mig_enabled"] else count
        found.unschedulable_gpus += row["n_unschedulable"]
        found.drained_gpus += row["n_drained"]
        found.unhealthy_gpus += row["n_unhealthy"]
        found.drained_in_use_gpus += row["n_drained_in_use"]
        found.in_use_gpus += row["n_in_use"]
        found.free_gpus += row["n_free"]
        found.compute_total += mig.COMPUTE_SLICES * count
        if row["mig_enabled"]:
            shape = _shape(row["profiles"], row["starts"])
            found.compute_stranded += _layout_compute(row["model"], shape)[1] * count
    return figures


def _allocated_slices(*, by: tuple[str, ...], where: Q | None = None) -> dict[tuple, Fraction]:
    """The compute slices allocated on the present nodes of each group: their allocated resources
    (SpecAndCount) summed per profile, each at its profile's compute slices (a share counts a fraction)."""
    spec_by = [_spec_path(key) for key in by]
    rows = (
        SpecAndCount.objects.filter(Q(node__present=True) & (where or Q()), allocated__gt=0)
        .values(*spec_by, "node__gpu_model", "profile")
        .annotate(held=Sum("allocated"))
        .order_by()
    )
    found: dict[tuple, Fraction] = defaultdict(Fraction)
    for row in rows:
        found[tuple(row[path] for path in spec_by)] += row["held"] * kinds.counted_slices(
            row["node__gpu_model"], row["profile"]
        )
    return found


def _with_allocated(figures: dict, allocated: Iterable[tuple[Hashable, Fraction]]) -> dict:
    """The figures with their allocated slices, rounded as people read them; slices of a group without
    GPUs count nowhere."""
    for key, slices in allocated:
        if key in figures:
            figures[key].compute_allocated += slices
    for found in figures.values():
        found.compute_allocated = kinds.shown_slices(found.compute_allocated)
    return figures


def compute_figures(*, by: tuple[str, ...], where: Q | None = None) -> dict[tuple, ComputeFigures]:
    """The present GPUs of present nodes (those `where` picks: a condition on their node, in `node__`
    paths, that the nodes' SpecAndCount rows answer alike), grouped by the GPU paths `by` (such as
    "node__cluster__name", "model", "node__group_id", "node_id"; none: all of them as one): the figures
    of each group, keyed by its values of `by`, in two queries whatever the number of GPUs.

    GPUs are counted in SQL, grouped also by MIG mode and layout; the stranded slices of each distinct
    layout come from the MIG catalogue once (a fleet has few distinct layouts, however many GPUs), the
    same figure as `GpuCapacity.compute` of each GPU. Allocated slices are the nodes' allocated resources
    (SpecAndCount) summed per profile, each at its profile's compute slices."""
    figures = _gpu_figures(by=by, where=where)
    return _with_allocated(figures, _allocated_slices(by=by, where=where).items())


@dataclass(frozen=True)
class Where:
    """Where a set of the fleet's GPUs is: cluster, GPU group (None: the cluster's nodes in no group) and
    model; what `fleet_figures` adds the figures up by."""

    cluster_id: int
    cluster: str
    group_id: int | None
    model: str


_WHERE = ("node__cluster_id", "node__cluster__name", "node__group_id", "model")
_FLEET_FIGURES: Kept[tuple[dict[tuple, ComputeFigures], dict[tuple, Fraction]]] = Kept(
    "capacity-figures", lambda: (_gpu_figures(by=_WHERE), _allocated_slices(by=_WHERE))
)


def fleet_figures(*, by: Callable[[Where], Hashable]) -> dict[Hashable, ComputeFigures]:
    """`compute_figures` of the whole fleet, grouped by `by(where)` (such as per cluster and model, or per
    cluster and GPU group): added up from its GPUs and allocated slices per cluster, group and model,
    worked out once per capacity version (pools/selectors/kept.py), so that a page does not read every
    GPU again. The same figures as `compute_figures` grouped alike."""
    gpus, allocated = _FLEET_FIGURES.get()
    figures: dict[Hashable, ComputeFigures] = {}
    for key, found in gpus.items():
        figures.setdefault(by(Where(*key)), ComputeFigures()).add(found)
    return _with_allocated(figures, ((by(Where(*key)), slices) for key, slices in allocated.items()))


def capacity_summary() -> list[ModelSummary]:
    """Per cluster and GPU model: GPUs, and compute slices total / allocated / free / stranded."""
    figures = fleet_figures(by=lambda where: (where.cluster, where.model))
    return [ModelSummary(**vars(figures[key]), cluster=key[0], model=key[1]) for key in sorted(figures)]


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

    @cached_property
    def emptied_fleets(self) -> dict[str, placement.Fleet]:
        """Each cluster's fleet as if it held nothing, what could ever be had of it: made once per
        picture, so that every submit checked against it reuses the fleets and their indexes."""
        return {name: availability.emptied(fleet) for name, fleet in self.fleets.items()}

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


def capacity_picture() -> CapacityPicture:
    """The fleet as placement sees it, with availability per cluster, group and spec; kept while the
    capacity version holds, for at most CAPACITY_PICTURE_SECONDS, and shared between processes
    (pools/selectors/kept.py)."""
    return PICTURE.get()


def _build_picture() -> CapacityPicture:
    clusters = list(Cluster.objects.order_by("name"))
    group_names: dict[int, set[str]] = {c.pk: set() for c in clusters}
    for cluster_id, name in GpuGroup.objects.values_list("cluster_id", "name"):
        group_names[cluster_id].add(name)
    fleets = fleet_snapshot(clusters, {pk: bool(names) for pk, names in group_names.items()})
    found = availability.availability(gpu for fleet in fleets.values() for gpu in fleet.gpus)
    ready = {c.pk for c in clusters if c.status == Cluster.Status.READY}
    return CapacityPicture(clusters, ready, group_names, fleets, found)


PICTURE: Kept[CapacityPicture] = Kept("capacity-picture", _build_picture)


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
