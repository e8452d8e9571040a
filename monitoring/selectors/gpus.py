"""GPUs one by one: the fleet's GPU table (filtered, sorted) and one GPU with its instances and holders."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime

from django.db.models import Avg, Exists, F, FilteredRelation, OuterRef, Q, QuerySet, Subquery
from django.db.models.functions import Coalesce
from django.shortcuts import get_object_or_404

from monitoring.models import Latest
from monitoring.models.samples import WHOLE_GPU, figures_slot
from monitoring.selectors.fleet import fresh_since
from pools.kinds import WHOLE, kind_of
from pools.models import Allocation, GpuCapacity, Health

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


def gpu_table(
    *,
    cluster: str = "",
    model: str = "",
    state: str = "",
    sort: str = "gpu",
    now: datetime | None = None,
) -> QuerySet[GpuCapacity]:
    """Present GPUs with their newest whole-GPU figures (SM activity: the instances' average where the GPU
    gives none), filtered by cluster name, model and state (GPU_STATES), sorted by a GPU_SORTS key, "-"
    first for the highest first; figures that are missing sort last."""
    fresh = fresh_since(now)
    instances_sm = (
        Latest.objects.filter(gpu=OuterRef("pk"), slot__gte=0, at__gte=fresh)
        .values("gpu")
        .annotate(sm=Avg("sm_active_pct"))
        .values("sm")
    )
    rows = (
        GpuCapacity.objects.filter(present=True, node__present=True)
        .select_related("node__cluster")
        .annotate(whole=FilteredRelation("latest_figures", condition=Q(latest_figures__slot=WHOLE_GPU)))
        .annotate(
            seen_at=F("whole__at"),
            temperature=F("whole__temperature_c"),
            power=F("whole__power_w"),
            utilisation=F("whole__utilisation_pct"),
            sm=Coalesce(F("whole__sm_active_pct"), Subquery(instances_sm)),
            memory_used=F("whole__memory_used_bytes"),
            memory_total=F("whole__memory_total_bytes"),
            held=Exists(Allocation.objects.filter(gpu=OuterRef("pk"), released_at__isnull=True)),
        )
    )
    if cluster:
        rows = rows.filter(node__cluster__name=cluster)
    if model:
        rows = rows.filter(model=model)
    drained = Q(drained=True) | Q(node__drained=True)
    unhealthy = Q(health__in=[Health.DEGRADED, Health.FAILED])
    if state == "allocated":
        rows = rows.filter(held=True)
    elif state == "free":
        rows = rows.filter(held=False, health=Health.OK).exclude(drained)
    elif state == "drained":
        rows = rows.filter(drained)
    elif state == "unhealthy":
        rows = rows.filter(unhealthy)
    elif state == "silent":
        rows = rows.filter(Q(seen_at__isnull=True) | Q(seen_at__lt=fresh))
    descending = sort.startswith("-")
    fields = GPU_SORTS.get(sort.lstrip("-"), GPU_SORTS["gpu"])
    order = [F(f).desc(nulls_last=True) if descending else F(f).asc(nulls_last=True) for f in fields]
    return rows.order_by(*order, "pk")


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
