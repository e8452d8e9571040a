"""GPU faults as the pages read them: the open faults with the pools each still leaves to re-place, and the
open faults under one pool."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from monitoring.models import FaultNotice, GpuFault
from pools.models import Pool
from pools.selectors.monitoring import live_pools_on
from pools.services.replacement import Replaceability, replaceable_pools


@dataclass(frozen=True)
class AffectedPool:
    pool: Pool
    on_gpu: bool  # still holds capacity on the faulty GPU (else: flagged, and still short of instances)
    verdict: Replaceability


@dataclass(frozen=True)
class OpenFault:
    fault: GpuFault
    pools: list[AffectedPool]


def open_faults(found: Sequence[GpuFault] | None = None) -> list[OpenFault]:
    """Open faults (`found`, a page of them, or all), newest first, each with the pools that still need
    re-placing because of it and whether that fits now (the same assessment re-placing acts on); a constant
    number of queries."""
    if found is None:
        found = list(GpuFault.objects.open().select_related("gpu__node__cluster", "cleared_by"))
    on_gpu = live_pools_on(f.gpu_id for f in found)
    flagged: dict[int, set[int]] = {}
    for fault_id, pool_id in FaultNotice.objects.filter(fault__in=found).values_list("fault_id", "pool_id"):
        flagged.setdefault(fault_id, set()).add(pool_id)
    ids = set().union(*on_gpu.values(), *flagged.values())
    pools = {p.pk: p for p in Pool.objects.filter(pk__in=ids).select_related("project__tenant", "cluster")}
    verdicts = replaceable_pools(list(pools.values()))
    listed = []
    for fault in found:
        here = on_gpu.get(fault.gpu_id, set())
        affected = [
            AffectedPool(pools[pk], pk in here, verdicts[pk])
            for pk in sorted(here | flagged.get(fault.pk, set()))
            if pk in pools and (pk in here or verdicts[pk].needed)
        ]
        listed.append(OpenFault(fault, affected))
    return listed


def pool_faults(pool: Pool) -> list[GpuFault]:
    """Open faults of the GPUs that hold the pool's live capacity."""
    return list(
        GpuFault.objects.open()
        .filter(gpu__allocations__pool=pool, gpu__allocations__released_at__isnull=True)
        .select_related("gpu__node")
        .distinct()
    )
