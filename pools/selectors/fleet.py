"""The placement engine's view of the fleet: ready clusters and, per cluster, its GPUs with their
planned layouts and live allocations (ORM rows in, the engine's plain data out)."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Collection, Iterable
from datetime import datetime
from functools import lru_cache
from itertools import groupby

from django.utils import timezone

from pools import mig, placement
from pools.gpu_models import ModelInfo, model_info
from pools.kinds import DEFAULT_OFFERS, kind_of
from pools.models import (
    Allocation,
    Cluster,
    GpuCapacity,
    GpuGroup,
    Health,
    PoolRequest,
)
from pools.placement.plan import share_slots
from pools.selectors.ends import request_end


def engine_request(request: PoolRequest, grouped: bool, reclaimable: bool = False) -> placement.Request:
    """A pool request as the engine places it (its items prefetched); its purpose is its GPU group where
    the cluster places work by group; `reclaimable` where its pool would be borrowed; its end as
    `request_ends` tells it."""
    return placement.Request(
        id=str(request.pk),
        items=tuple(placement.Item(i.gpu_model, i.profile, i.count) for i in request.items.all()),
        group=(request.purpose or None) if grouped else None,
        reclaimable=reclaimable,
        ends=request_ends(request),
    )


def epoch(moment: datetime | None) -> int | None:
    """A moment as placement counts ends: whole seconds since the epoch; None stays None (no end)."""
    return None if moment is None else int(moment.timestamp())


def request_ends(request: PoolRequest) -> int | None:
    """When the pool of a request would end were it admitted now, in placement's clock (`request_end`)."""
    return epoch(request_end(request, timezone.now()))


def ready_clusters() -> tuple[list[Cluster], dict[int, bool]]:
    """Clusters placement may use, and whether each places work by GPU group."""
    clusters = list(Cluster.objects.filter(status=Cluster.Status.READY).order_by("name"))
    with_groups = set(GpuGroup.objects.values_list("cluster_id", flat=True))
    return clusters, {c.pk: c.pk in with_groups for c in clusters}


def _live_allocations() -> dict[int, list[tuple[str, int, int, int, int | None]]]:
    """Per GPU id, its live allocations as (profile, first memory slice, slice after the last, pool, when the
    pool ends)."""
    by_gpu: dict[int, list[tuple[str, int, int, int, int | None]]] = defaultdict(list)
    rows = Allocation.objects.filter(released_at__isnull=True).values_list(
        "gpu_id", "profile", "slices", "pool_id", "pool__end_at"
    )
    for gpu_id, profile, slices, pool, ends in rows:
        by_gpu[gpu_id].append((profile, slices.lower, slices.upper, pool, epoch(ends)))
    return by_gpu


def _latest(ends: list[int | None]) -> int | None:
    """When work of these ends is all over: the latest end, None (far away) where one has none."""
    return None if not ends or None in ends else max(ends)


class _Shared:
    """One object for each distinct value the snapshot makes many times (a free slot, a layout's slots, a
    node's name, a model's), so that a hundred thousand GPUs hold references to a few thousand values rather
    than copies of them: the picture each process keeps is bounded by its GPUs, not by their slots and
    strings too."""

    def __init__(self) -> None:
        self.values: dict = {}
        # (model, its layout's profiles and starts) -> the slots of such a GPU nobody holds any of
        self.free: dict[tuple, tuple[placement.Slot, ...]] = {}

    def __call__(self, value):
        return self.values.setdefault(value, value)


def _slots(
    model_name: str, layout, live, reclaimable: Collection[int], shared: _Shared
) -> tuple[placement.Slot, ...]:
    """The GPU's slots; those of a GPU nobody holds any of are the same for every GPU of its model and
    layout, made once."""
    if not live:
        key = (model_name, *((instance["profile"], instance["start"]) for instance in layout))
        found = shared.free.get(key)
        if found is None:
            found = shared.free[key] = _made_slots(model_name, layout, (), reclaimable, shared)
        return found
    return _made_slots(model_name, layout, live, reclaimable, shared)


def _made_slots(
    model_name: str, layout, live, reclaimable: Collection[int], shared: _Shared
) -> tuple[placement.Slot, ...]:
    model = model_info(model_name)
    return shared(tuple(shared(_slot(instance, model, live, reclaimable, shared)) for instance in layout))


def _slot(
    instance: dict, model: ModelInfo, live, reclaimable: Collection[int], shared: _Shared
) -> placement.Slot:
    """A provisioned instance or share, allocated where it shares a slot (a memory slice, a share) with a
    live allocation (slots, not starts, decide: a cluster may report an instance at another start than the
    one planned, never a shared slice), reclaimable where that allocation's pool is, ending when its pool
    ends."""
    start = instance["start"]
    end = kind_of(instance["profile"]).slots(model, instance["profile"], start)[1]
    holders = [(pool, ends) for _profile, lower, upper, pool, ends in live if lower < end and start < upper]
    return placement.Slot(
        shared(instance["profile"]),
        start,
        bool(holders),
        bool(holders) and all(pool in reclaimable for pool, _ends in holders),
        _latest([ends for _pool, ends in holders]) if holders else None,
    )


# What the engine needs of a GPU and its node, read as plain values: at thousands of GPUs, making a
# model instance of each GPU, node, cluster and group cost most of the snapshot (bench/load.py), and
# the snapshot is taken after every capacity change.
GPU_FIELDS = (
    "pk",
    "model",
    "mig_enabled",
    "layout",
    "planned_layout",
    "present",
    "health",
    "drained",
    "node__name",
    "node__cluster_id",
    "node__cluster__name",
    "node__group__name",
    "node__drained",
    "node__ready",
    "node__mig_state",
    "node__sharing",
    "node__group__offers",
)
_ROWS_AT_ONCE = 2000  # rows read from the database at a time: the snapshot never holds every row at once


def fleet_snapshot(
    clusters: list[Cluster], use_groups: dict[int, bool], reclaimable: Collection[int] = ()
) -> dict[str, placement.Fleet]:
    """Per cluster name, the placement engine's view of its GPUs: planned layouts and live allocations,
    those of the `reclaimable` pools (borrowed, for the queue) marked so. The GPUs are read a node at a
    time, in order, and the values many GPUs share are made once (`_Shared`)."""
    allocations = _live_allocations()
    rows = (
        GpuCapacity.objects.filter(present=True, node__present=True, node__cluster__in=clusters)
        .order_by("node__cluster__name", "node__name", "index")
        .values(*GPU_FIELDS)
        .iterator(chunk_size=_ROWS_AT_ONCE)
    )
    fleets: dict[str, list[placement.Gpu]] = defaultdict(list)
    shared = _Shared()
    for _node, gpus in groupby(rows, key=lambda gpu: (gpu["node__cluster_id"], gpu["node__name"])):
        gpus = list(gpus)
        shared_mode = _node_sharing(gpus)
        for gpu in gpus:
            fleets[shared(gpu["node__cluster__name"])].append(
                _gpu(gpu, shared_mode, allocations, use_groups, reclaimable, shared)
            )
    return {name: placement.Fleet(tuple(found)) for name, found in fleets.items()}


def _gpu(gpu: dict, sharing: str, allocations, use_groups, reclaimable, shared: _Shared) -> placement.Gpu:
    cluster = shared(gpu["node__cluster__name"])
    planned = gpu["planned_layout"]
    mig_on = planned["mig"] if planned else gpu["mig_enabled"]
    layout = planned["instances"] if planned else gpu["layout"] if mig_on else _share_layout(sharing)
    live = allocations.get(gpu["pk"], ())
    whole = [ends for profile, *_rest, ends in live if kind_of(profile).takes_whole_gpu]
    group = shared(gpu["node__group__name"]) if use_groups[gpu["node__cluster_id"]] else None
    # as GpuCapacity.schedulable says it (the GPU is present: only present ones are read)
    schedulable = gpu["health"] == Health.OK and not gpu["drained"] and not gpu["node__drained"]
    model = shared(gpu["model"])
    return placement.Gpu(
        id=str(gpu["pk"]),
        node=shared(f"{cluster}/{gpu['node__name']}"),
        model=model,
        mig=mig_on,
        allocated=bool(whole),
        ends=_latest(whole) if whole else None,
        instances=_slots(model, layout, live, reclaimable, shared),
        group=group,
        cluster=cluster,
        schedulable=schedulable and gpu["node__ready"],
        reconfiguring=gpu["node__mig_state"] in mig.MIG_CHANGING or planned is not None,
        sharing=shared(sharing),
        offers=_offers(gpu["node__group__offers"]) if group else DEFAULT_OFFERS,
    )


def _node_sharing(gpus: list[dict]) -> str:
    """A node's share mode as placement sees it: the one planned for its MIG-off GPUs (a change the queue
    decided and provisioning brings about), else the one the cluster reports."""
    found = None
    for gpu in gpus:
        planned = gpu["planned_layout"]
        if planned and not planned["mig"]:
            found = planned.get("sharing", "")
    return gpus[0]["node__sharing"] if found is None else found


def _share_layout(sharing: str) -> list[dict]:
    return [{"profile": profile, "start": start} for profile, start in share_slots(sharing)]


@lru_cache(maxsize=256)
def _offers_of(values: tuple[str, ...]) -> tuple[str, ...]:
    return values


def _offers(values) -> tuple[str, ...]:
    """A group's offers as placement reads them (one tuple per distinct list, shared by its GPUs)."""
    return _offers_of(tuple(values or DEFAULT_OFFERS))


def held_assignments(pool_ids: Iterable[int]) -> dict[tuple[int, int], tuple[placement.Assignment, ...]]:
    """Per (pool, cluster), what the pool's live allocations hold, as the engine's assignments: what a
    release of the pool would give back to that cluster's fleet."""
    found: dict[tuple[int, int], list[placement.Assignment]] = defaultdict(list)
    rows = Allocation.objects.filter(pool_id__in=list(pool_ids), released_at__isnull=True).values_list(
        "pool_id", "pool__cluster_id", "gpu_id", "profile", "slices"
    )
    for pool, cluster, gpu, profile, slices in rows.order_by("pk"):
        start = None if kind_of(profile).takes_whole_gpu else slices.lower
        found[(pool, cluster)].append(placement.Assignment(str(gpu), profile, start))
    return {key: tuple(assignments) for key, assignments in found.items()}
