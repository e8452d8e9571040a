"""GPUs one by one: the fleet's GPU table (filtered, sorted) and one GPU with its instances and holders."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime

from django.db.models import Avg, Exists, F, FilteredRelation, OuterRef, Q, QuerySet, Subquery
from django.db.models.functions import Coalesce
from django.shortcuts import get_object_or_404

from monitoring.conf import settings
from monitoring.models import Latest
from monitoring.models.samples import WHOLE_GPU, figures_slot
from monitoring.selectors.fleet import fresh_since
from monitoring.selectors.kept import kept
from pools.kinds import WHOLE, kind_of
from pools.models import Allocation, GpuCapacity, Health
from pools.selectors import fleet_figures

# --- the GPU table ---------------------------------------------------------------------------------

GPU_STATES = ("allocated", "free", "drained", "unhealthy", "silent")
GPU_SORTS = {
    "gpu": ("node__cluster__name", "node__name", "index"),
    "temperature": ("temperature",),
    "power": ("power",),
    "sm": ("sm",),
    "utilisation": ("utilisation",),
    "memory": ("memory_used",),
}


def _with_figures(rows: QuerySet[GpuCapacity], fresh: datetime) -> QuerySet[GpuCapacity]:
    """GPUs with their newest whole-GPU figures (SM activity: the instances' fresh average where the GPU gives
    none). The instances' average is read through the (GPU, slot) key, each GPU's own rows only, whatever
    the planner believes of how many figures are fresh."""
    instances_sm = (
        Latest.objects.filter(gpu=OuterRef("pk"), slot__gte=0)
        .values("gpu")
        .annotate(sm=Avg("sm_active_pct", filter=Q(at__gte=fresh)))
        .values("sm")
    )
    return rows.annotate(
        whole=FilteredRelation("latest_figures", condition=Q(latest_figures__slot=WHOLE_GPU))
    ).annotate(
        seen_at=F("whole__at"),
        temperature=F("whole__temperature_c"),
        power=F("whole__power_w"),
        utilisation=F("whole__utilisation_pct"),
        sm=Coalesce(F("whole__sm_active_pct"), Subquery(instances_sm)),
        memory_used=F("whole__memory_used_bytes"),
        memory_total=F("whole__memory_total_bytes"),
    )


def _held() -> Exists:
    return Exists(Allocation.objects.filter(gpu=OuterRef("pk"), released_at__isnull=True))


class GpuTable:
    """The GPU table's rows, read a page (a slice) at a time: a narrow query picks the GPUs in order, reading
    figures only where a filter or the order needs them; then only the page's GPUs are read with their node,
    figures and whether a pool holds them. Where the fleet's figures are kept (MONITORING_FIGURES_SECONDS),
    the order of the GPUs picked is kept with them (monitoring/selectors/kept.py), so that paging through
    the table, or opening it again, reads only the page's GPUs."""

    ordered = True  # for the paginator: in a stable order

    def __init__(
        self,
        picked: QuerySet[GpuCapacity],
        fresh: datetime,
        key: tuple[str, ...],
        counted: Callable[[], int] | None = None,
    ) -> None:
        self.picked, self.fresh, self.key, self.counted = picked, fresh, key, counted
        self._order: list[int] | None = None

    def _kept_order(self) -> list[int] | None:
        """The ids of the GPUs picked, in order, as kept for a while; None where nothing is kept."""
        if settings.MONITORING_FIGURES_SECONDS <= 0:
            return None
        if self._order is None:
            found = kept("gpu-table", self.key, lambda now: list(self.picked.values_list("pk", flat=True)))
            self._order = found.value
        return self._order

    def count(self) -> int:
        order = self._kept_order()
        if order is not None:
            return len(order)
        return self.counted() if self.counted is not None else self.picked.count()

    def __len__(self) -> int:
        return self.count()

    def __getitem__(self, index: slice) -> list[GpuCapacity]:
        order = self._kept_order()
        ids = order[index] if order is not None else list(self.picked.values_list("pk", flat=True)[index])
        rows = _with_figures(GpuCapacity.objects.select_related("node__cluster"), self.fresh)
        found = {gpu.pk: gpu for gpu in rows.annotate(held=_held()).filter(pk__in=ids)}
        return [found[pk] for pk in ids if pk in found]

    def __iter__(self):
        return iter(self[:])


def gpu_table(
    *,
    cluster: str = "",
    model: str = "",
    state: str = "",
    sort: str = "gpu",
    now: datetime | None = None,
) -> GpuTable:
    """Present GPUs with their newest whole-GPU figures (SM activity: the instances' average where the GPU
    gives none) and whether a pool holds them (`held`), filtered by cluster name, model and state
    (GPU_STATES), sorted by a GPU_SORTS key, "-" first for the highest first; figures that are missing sort
    last."""
    fresh = fresh_since(now)
    descending = sort.startswith("-")
    fields = GPU_SORTS.get(sort.lstrip("-"), GPU_SORTS["gpu"])
    picked = GpuCapacity.objects.filter(present=True, node__present=True)
    if state == "silent" or fields != GPU_SORTS["gpu"]:
        picked = _with_figures(picked, fresh)
    if cluster:
        picked = picked.filter(node__cluster__name=cluster)
    if model:
        picked = picked.filter(model=model)
    drained = Q(drained=True) | Q(node__drained=True)
    unhealthy = Q(health__in=[Health.DEGRADED, Health.FAILED])
    if state == "allocated":
        picked = picked.filter(_held())
    elif state == "free":
        picked = picked.filter(~_held(), health=Health.OK).exclude(drained)
    elif state == "drained":
        picked = picked.filter(drained)
    elif state == "unhealthy":
        picked = picked.filter(unhealthy)
    elif state == "silent":
        picked = picked.filter(Q(seen_at__isnull=True) | Q(seen_at__lt=fresh))
    order = [F(f).desc(nulls_last=True) if descending else F(f).asc(nulls_last=True) for f in fields]
    counted = _COUNTED.get(state)
    return GpuTable(
        picked.order_by(*order, "pk"),
        fresh,
        (cluster, model, state, sort),
        counted and (lambda: _count(counted, cluster, model)),
    )


# The states whose GPUs the fleet's figures count (pools' ComputeFigures, present GPUs of present nodes), by
# the same conditions as the filters above: those need no count of their own.
_COUNTED = {
    "": lambda found: found.gpus,
    "allocated": lambda found: found.in_use_gpus,
    "free": lambda found: found.free_gpus,
    "drained": lambda found: found.drained_gpus,
}


def _count(counted: Callable, cluster: str, model: str) -> int:
    """How many GPUs of a state there are (of the cluster and model when given), from the fleet's figures
    (kept per capacity version), without counting the GPUs again."""
    figures = fleet_figures(by=lambda where: (where.cluster, where.model))
    return sum(
        counted(found)
        for (its_cluster, its_model), found in figures.items()
        if cluster in ("", its_cluster) and model in ("", its_model)
    )


@dataclass(frozen=True)
class Holder:
    slot: int
    profile: str
    tenant: str
    project: str
    pool_id: int

    @property
    def label(self) -> str:
        return f"{self.tenant}/{self.project}"

    @property
    def part(self) -> str:
        """The part of the GPU it holds, as people read it (its MIG profile or share); "" for all of it."""
        return "" if kind_of(self.profile).takes_whole_gpu else self.profile


def holders(*, gpu_ids: list[int]) -> dict[int, list[Holder]]:
    """The live allocations of these GPUs, per GPU, in one query."""
    found: dict[int, list[Holder]] = {gpu_id: [] for gpu_id in gpu_ids}
    live = (
        Allocation.objects.filter(gpu_id__in=gpu_ids, released_at__isnull=True)
        .values_list(
            "gpu_id", "profile", "slices", "pool__project__tenant__slug", "pool__project__slug", "pool_id"
        )
        .order_by("gpu_id", "slices")
    )
    for gpu_id, profile, slices, tenant, project, pool_id in live:
        slot = figures_slot(profile, slices.lower)
        found[gpu_id].append(Holder(slot, profile, tenant, project, pool_id))
    return found


# --- one GPU ---------------------------------------------------------------------------------------


@dataclass
class SlotFigures:
    """The whole GPU or one of its MIG instances: its newest figures and the pools holding it (the GPU's
    shares' pools all hold its whole-GPU figures)."""

    slot: int
    profile: str
    uuid: str
    latest: Latest | None
    holders: list[Holder]
    fresh: bool

    @property
    def holder(self) -> Holder | None:
        return self.holders[0] if self.holders else None

    @property
    def whole(self) -> bool:
        return self.slot == WHOLE_GPU


@dataclass
class GpuDetail:
    gpu: GpuCapacity
    slots: list[SlotFigures] = field(default_factory=list)

    @property
    def instance_slots(self) -> list[int]:
        return [s.slot for s in self.slots if not s.whole]


def gpu_detail(*, gpu_id: int, now: datetime | None = None) -> GpuDetail:
    """A GPU (404 when unknown), its newest figures and those of its instances (its layout, and any
    instance that still has figures), and which pool holds which, in three queries."""
    gpu = get_object_or_404(GpuCapacity.objects.select_related("node__cluster"), pk=gpu_id)
    latest = {row.slot: row for row in Latest.objects.filter(gpu=gpu)}
    held: dict[int, list[Holder]] = {}
    for holder in holders(gpu_ids=[gpu.pk])[gpu.pk]:
        held.setdefault(holder.slot, []).append(holder)
    fresh = fresh_since(now)
    profiles = {WHOLE_GPU: WHOLE.profile} | {e["start"]: e["profile"] for e in gpu.layout or []}
    uuids = {WHOLE_GPU: gpu.uuid} | {e["start"]: e.get("uuid", "") for e in gpu.layout or []}
    detail = GpuDetail(gpu)
    for slot in sorted(set(profiles) | set(latest)):
        row = latest.get(slot)
        detail.slots.append(
            SlotFigures(
                slot=slot,
                profile=profiles.get(slot) or (row.profile if row else ""),
                uuid=uuids.get(slot) or (row.instance_uuid if row else ""),
                latest=row,
                holders=held.get(slot, []),
                fresh=row is not None and row.at >= fresh,
            )
        )
    return detail
