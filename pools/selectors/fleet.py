"""The placement engine's view of the fleet: ready clusters and, per cluster, its GPUs with their
planned layouts and live allocations (ORM rows in, the engine's plain data out)."""

from __future__ import annotations

from collections import defaultdict
from typing import TYPE_CHECKING

from pools import mig, placement
from pools.models import (
    Allocation,
    Cluster,
    GpuCapacity,
    GpuGroup,
)

if TYPE_CHECKING:
    pass


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
                reconfiguring=node.mig_state in mig.MIG_CHANGING or planned is not None,
            )
        )
    return {name: placement.Fleet(tuple(found)) for name, found in fleets.items()}
