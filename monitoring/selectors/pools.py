"""One pool: where and when its figures are, its series, its newest figures; found for operators or for
the tenant that holds it."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from django.db.models import Q
from django.shortcuts import get_object_or_404

from monitoring.models import Latest
from monitoring.models.samples import figures_slot
from monitoring.selectors.fleet import fresh_since
from monitoring.storage import samples
from pools.kinds import kind_of
from pools.models import Allocation, Pool

# --- one pool --------------------------------------------------------------------------------------


def pool_windows(*, pool: Pool) -> list[samples.Window]:
    """Where and when the pool's figures are: each allocation's (GPU, slot) while it was held. Shares of one
    GPU all read the GPU's figures: their times are merged, so that the GPU counts once."""
    held: dict[tuple[int, int], list[tuple]] = {}
    for a in Allocation.objects.filter(pool=pool).order_by("allocated_at", "pk"):
        spans = held.setdefault((a.gpu_id, figures_slot(a.profile, a.slices.lower)), [])
        if spans and (spans[-1][1] is None or spans[-1][1] >= a.allocated_at):
            ends = None if spans[-1][1] is None or a.released_at is None else max(spans[-1][1], a.released_at)
            spans[-1] = (spans[-1][0], ends)
        else:
            spans.append((a.allocated_at, a.released_at))
    return [
        samples.Window(gpu, slot, since, until)
        for (gpu, slot), spans in held.items()
        for since, until in spans
    ]


def shares_gpus(*, pool: Pool) -> bool:
    """Whether the pool holds shares of GPUs, whose figures are their whole GPU's (others' work included)."""
    profiles = Allocation.objects.filter(pool=pool).values_list("profile", flat=True).distinct()
    return any(not kind_of(profile).measured_alone for profile in profiles)


@dataclass(frozen=True)
class PoolSeries:
    resolution: int
    points: list[samples.Point]
    instances: int  # how many GPUs and instances the pool held in all


def pool_series(
    *, pool: Pool, metric: str, start: datetime, end: datetime, now: datetime | None = None
) -> PoolSeries:
    """The pool's metric over [start, end): SM activity averaged over its GPUs and instances, memory
    added up; each allocation only while it was held."""
    windows = pool_windows(pool=pool)
    resolution, points = samples.series(metric=metric, start=start, end=end, windows=windows, now=now)
    return PoolSeries(resolution, points, len({(w.gpu_id, w.slot) for w in windows}))


@dataclass(frozen=True)
class AllocationFigures:
    allocation: Allocation
    latest: Latest | None
    fresh: bool


def pool_figures(*, pool: Pool, now: datetime | None = None) -> list[AllocationFigures]:
    """The pool's live allocations with the newest figures of each, in two queries."""
    live = list(
        Allocation.objects.filter(pool=pool, released_at__isnull=True)
        .select_related("gpu__node__cluster")
        .order_by("gpu_id", "slices")
    )
    slot_of = {a.pk: figures_slot(a.profile, a.slices.lower) for a in live}
    wanted = Q(pk__in=[])
    for a in live:
        wanted |= Q(gpu_id=a.gpu_id, slot=slot_of[a.pk])
    latest = {(row.gpu_id, row.slot): row for row in Latest.objects.filter(wanted)} if live else {}
    fresh = fresh_since(now)
    result = []
    for a in live:
        row = latest.get((a.gpu_id, slot_of[a.pk]))
        result.append(AllocationFigures(a, row, row is not None and row.at >= fresh))
    return result


def operator_pool(*, pool_id: int) -> Pool:
    """Any pool, for operators (404 when unknown)."""
    return get_object_or_404(Pool.objects.select_related("project__tenant", "cluster"), pk=pool_id)


def visible_pool(*, user, tenant_slug: str, pool_id: int) -> Pool:
    """A pool of the tenant the user may see; 404 otherwise (the tenancy helper every pool page uses)."""
    return get_object_or_404(
        Pool.objects.visible_to(user).select_related("project__tenant"),
        project__tenant__slug=tenant_slug,
        pk=pool_id,
    )
