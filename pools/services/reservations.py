"""Reserved capacity: the allocations of a placed plan, the per-node counts recounted from them, and the one
lock every change of reserved capacity takes (admission, re-placing, release, failure).

The lock is a database advisory lock held until the transaction ends, so that counts are always recounted
from a settled picture; the allocation exclusion constraint (pools/models/pools.py) makes over-commit
impossible even if two portals disagreed about the lock.
"""

from __future__ import annotations

from collections import Counter
from datetime import datetime

from django.db import connection
from django.db.backends.postgresql.psycopg_any import NumericRange
from django.db.models import Count, F, QuerySet

from pools import capacity_version, kinds, placement
from pools.gpu_models import model_info
from pools.models import Allocation, GpuCapacity, Pool, PoolItem, PoolRequest, SpecAndCount

QUEUE_LOCK = 0x6770_7571  # pg advisory lock key of reserved capacity (the admission queue's)


def lock_capacity() -> None:
    """Serialise every change of reserved capacity (admissions, releases, failures) until the
    transaction ends, so that allocation counts are always recounted from a settled picture."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_advisory_xact_lock(%s)", [QUEUE_LOCK])
    capacity_version.changed()


def reserve_plan(
    pool: Pool, plan: placement.Placement, *, at: datetime, request: PoolRequest | None = None
) -> set[int]:
    """The allocations of a placed plan for `pool`, reserved (and billed from) `at` for `request` (the pool's
    own or a resize; None for a move), and the planned layouts of the GPUs it re-partitions (admission,
    growth and re-placing share this); returns the ids of the nodes whose counts changed."""
    gpus = {g.pk: g for g in GpuCapacity.objects.filter(pk__in=[int(a.gpu) for a in plan.assignments])}
    for change in plan.reconfigure:
        GpuCapacity.objects.filter(pk=int(change.gpu)).update(
            planned_layout={
                "mig": change.mig,
                "instances": [{"profile": p, "start": s} for p, s in change.instances],
                "sharing": change.sharing,
            }
        )
    Allocation.objects.bulk_create(
        Allocation(
            pool=pool,
            gpu_id=int(a.gpu),
            profile=a.profile,
            slices=NumericRange(*_slots(gpus[int(a.gpu)].model, a.profile, a.start)),
            resource_name=kinds.resource_name(a.profile),
            allocated_at=at,
            request=request,
        )
        for a in plan.assignments
    )
    return {g.node_id for g in gpus.values()}


def _slots(model: str, profile: str, start: int | None) -> tuple[int, int]:
    return kinds.kind_of(profile).slots(model_info(model), profile, start)


def add_items(pool: Pool, plan: placement.Placement) -> None:
    """What the pool holds by design grows by the plan's instances (its admission, or a resize's)."""
    models = dict(
        GpuCapacity.objects.filter(pk__in={int(a.gpu) for a in plan.assignments}).values_list("pk", "model")
    )
    counted = Counter((models[int(a.gpu)], a.profile) for a in plan.assignments)
    for (model, profile), count in sorted(counted.items()):
        updated = PoolItem.objects.filter(pool=pool, gpu_model=model, profile=profile).update(
            count=F("count") + count
        )
        if not updated:
            PoolItem.objects.create(pool=pool, gpu_model=model, profile=profile, count=count)


def take_items(pool: Pool, given_back: Counter) -> None:
    """What the pool holds by design shrinks by `given_back`, (GPU model, profile) → count."""
    for (model, profile), count in sorted(given_back.items()):
        item = (
            PoolItem.objects.select_for_update().filter(pool=pool, gpu_model=model, profile=profile).first()
        )
        if item is None:
            continue
        if item.count <= count:
            item.delete()
        else:
            item.count -= count
            item.save(update_fields=["count"])


def release_allocations(allocations: QuerySet[Allocation], at: datetime) -> set[int]:
    """Free these live allocations at `at` (billed until then); a planned layout nobody holds any more is
    dropped, so that the GPU is free to be planned again. Returns the ids of their nodes, whose counts the
    caller recounts (`recount_allocated`) once its other changes are made."""
    rows = list(allocations.filter(released_at__isnull=True).values_list("pk", "gpu_id", "gpu__node_id"))
    Allocation.objects.filter(pk__in=[pk for pk, _gpu, _node in rows]).update(released_at=at)
    GpuCapacity.objects.filter(
        pk__in={gpu for _pk, gpu, _node in rows}, planned_layout__isnull=False
    ).exclude(allocations__released_at__isnull=True).update(planned_layout=None)
    return {node for _pk, _gpu, node in rows}


def recount_allocated(node_ids: set[int]) -> None:
    """SpecAndCount.allocated of these nodes, from their live allocations."""
    counts = (
        Allocation.objects.filter(released_at__isnull=True, gpu__node_id__in=node_ids)
        .values("gpu__node_id", "resource_name")
        .annotate(n=Count("id"))
    )
    wanted = {(row["gpu__node_id"], row["resource_name"]): row["n"] for row in counts}
    # Key order, as the sync writes them: two writers of the same rows wait instead of deadlocking.
    for spec in SpecAndCount.objects.filter(node_id__in=node_ids).order_by("node_id", "resource_name"):
        n = wanted.pop((spec.node_id, spec.resource_name), 0)
        if spec.allocated != n:
            spec.allocated = n
            spec.save(update_fields=["allocated", "last_change_at"])
    # A profile the cluster does not advertise yet. A sync (it runs outside the capacity lock) may
    # insert the same row meanwhile: then only the count is ours to set, the rest is what it saw.
    SpecAndCount.objects.bulk_create(
        [
            SpecAndCount(
                node_id=node_id,
                resource_name=resource,
                profile=kinds.profile_of_resource(resource) or resource,
                allocated=n,
            )
            for (node_id, resource), n in sorted(wanted.items())
        ],
        update_conflicts=True,
        unique_fields=["node", "resource_name"],
        update_fields=["allocated", "last_change_at"],
    )
