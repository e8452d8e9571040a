"""Re-placing a pool: its instances on GPUs that take no new work move to healthy capacity, in one action.

Words used here:
- misplaced allocation: a live allocation on a GPU that takes no new work: drained (itself or its node),
  unhealthy, or gone from its cluster. Draining keeps it running; re-placing moves it.
- missing instance: one the pool holds by design (its items) that no live allocation holds, and so is not
  billed. Only a move whose MIG change failed leaves one behind (see `settle_move`); the next re-placing
  fills it.
- move: one re-placing. The placement engine the queue admits with is asked for room for exactly the
  misplaced and missing instances (same cluster, same GPU group, same GPU models and profiles), so every
  rule of admission holds: free provisioned instances first, only wholly free GPUs re-partitioned, no
  running tenant disturbed. The new allocations are reserved and the misplaced ones released in one
  transaction, under the capacity lock, and a PoolEvent says what moved where and who moved it.
- settling: what follows a move, as provisioning follows an admission (`settle_move`, a Celery task): the
  MIG layouts of re-partitioned GPUs through the driver, then the instances' UUIDs; the namespace's quota
  only when the resource names changed. The pool stays active throughout.

A move with no room changes nothing and says why in the engine's words. `replaceable` answers whether a
move fits now, for pages, with the same code that moves (`_assess`).

Billing is per allocation, from its reservation to its release (billing/services.py), and a move releases
the old allocations at the very moment it reserves the new ones, so it neither adds nor drops a second.
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from django.core.cache import cache
from django.db import transaction
from django.db.models import Max, Q
from django.utils import timezone
from django.utils.translation import gettext as _

from pools import placement, task_names
from pools.conf import settings
from pools.drivers.base import DriverError, driver_for
from pools.kinds import kind_of
from pools.models import IN_USE_STATES, Allocation, Cluster, GpuCapacity, Pool, PoolRequest, PoolState
from pools.placement.reasons import Reason
from pools.selectors import fleet_snapshot, ready_clusters, render_reason
from pools.selectors.fleet import engine_request, epoch
from pools.services.binding import bind_pool, record_uuids
from pools.services.inventory import sync_inventory
from pools.services.provisioning import (
    DONE,
    FAILED,
    TRANSIENT,
    WAITING,
    changes_to_apply,
    cluster_changes,
    devices_unpublished,
    error_text,
    settle_binding,
)
from pools.services.reservations import (
    lock_capacity,
    recount_allocated,
    release_allocations,
    reserve_plan,
    take_items,
)
from pools.services.transitions import record_event
from portal import dispatch
from portal.errors import Conflict

log = logging.getLogger(__name__)

__all__ = [
    "DONE",
    "FAILED",
    "TRANSIENT",
    "WAITING",
    "Replaceability",
    "replace",
    "replaceable",
    "settle_move",
]

# How many waiting requests the engine reads ahead to choose new layouts, as the queue does.
UPCOMING = 50


@dataclass(frozen=True)
class Replaceability:
    """Whether a pool needs re-placing and whether it fits now; `reason` says why not, `moves` what would
    move where (one line each)."""

    needed: bool
    fits: bool
    reason: str = ""
    moves: tuple[str, ...] = ()


@dataclass
class _Context:
    """What the engine sees, read once for any number of pools."""

    clusters: dict[int, Cluster]
    grouped: dict[int, bool]
    fleets: dict[str, placement.Fleet]
    waiting: list[PoolRequest]


@dataclass
class _Assessment:
    moving: list[Allocation] = field(default_factory=list)
    missing: Counter = field(default_factory=Counter)
    plan: placement.Placement | None = None
    reason: str = ""

    @property
    def needed(self) -> bool:
        return bool(self.moving or self.missing)


def _context(clusters: list[Cluster] | None = None) -> _Context:
    ready, grouped = ready_clusters()
    if clusters is not None:
        wanted = {c.pk for c in clusters}
        ready = [c for c in ready if c.pk in wanted]
    waiting = list(PoolRequest.objects.waiting().prefetch_related("items")[: UPCOMING * 4])
    return _Context({c.pk: c for c in ready}, grouped, fleet_snapshot(ready, grouped), waiting)


def _takes_no_work(gpu: GpuCapacity) -> bool:
    return not (gpu.schedulable and gpu.node.present)


def _where(gpu: GpuCapacity, profile: str, start: int | None) -> str:
    at = "" if kind_of(profile).takes_whole_gpu or start is None else f" @{start}"
    return f"{profile} {gpu.node.name} GPU {gpu.index}{at}"


def _assess(pool: Pool, live: list[Allocation], context: _Context) -> _Assessment:
    """What a move of `pool` would take and where it would go (its plan), or why it cannot."""
    found = _Assessment(moving=[a for a in live if _takes_no_work(a.gpu)])
    held = Counter((a.gpu.model, a.profile) for a in live)
    asked = Counter({(i.gpu_model, i.profile): i.count for i in pool.items.all()})
    found.missing = asked - held if pool.state in IN_USE_STATES else Counter()
    if not found.needed:
        found.reason = _("Every instance of pool #%(id)s is on a healthy GPU.") % {"id": pool.pk}
        return found
    if pool.state not in IN_USE_STATES:
        found.reason = _("Pool #%(id)s is %(state)s; only an active pool is re-placed.") % {
            "id": pool.pk,
            "state": PoolState(pool.state).label,
        }
        return found
    if any(a.gpu.planned_layout is not None for a in live):
        found.reason = _("The last re-placing of pool #%(id)s is still being set up.") % {"id": pool.pk}
        return found
    cluster = context.clusters.get(pool.cluster_id)
    fleet = context.fleets.get(pool.cluster.name) if cluster is not None else None
    if fleet is None:
        found.reason = _("Cluster %(cluster)s is not ready.") % {"cluster": pool.cluster.name}
        return found
    grouped = context.grouped[cluster.pk]
    wanted = Counter((a.gpu.model, a.profile) for a in found.moving) + found.missing
    request = placement.Request(
        id=f"pool-{pool.pk}",
        items=tuple(placement.Item(model, profile, n) for (model, profile), n in sorted(wanted.items())),
        group=(pool.request.purpose or None) if grouped else None,
        ends=epoch(pool.end_at),
    )
    upcoming = [engine_request(r, grouped) for r in context.waiting if r.cluster_id in (None, cluster.pk)][
        :UPCOMING
    ]
    plan = placement.place(fleet, request, upcoming=upcoming)
    if not plan.placed:
        why = render_reason(plan.reason.as_data()) if isinstance(plan.reason, Reason) else str(plan.reason)
        found.reason = _("No room to re-place pool #%(id)s now: %(reason)s") % {"id": pool.pk, "reason": why}
        return found
    found.plan = plan
    return found


def _live(pools: Iterable[Pool], *, lock: bool = False) -> dict[int, list[Allocation]]:
    rows = Allocation.objects.filter(pool__in=[p.pk for p in pools], released_at__isnull=True)
    if lock:
        rows = rows.select_for_update(of=("self",))
    by_pool: dict[int, list[Allocation]] = {p.pk: [] for p in pools}
    for allocation in rows.select_related("gpu__node").order_by("pk"):
        by_pool[allocation.pool_id].append(allocation)
    return by_pool


def _describe(found: _Assessment, gpus: dict[int, GpuCapacity]) -> tuple[str, ...]:
    """One line per instance that would move (or come back, when missing): from where to where."""
    targets: dict[tuple[str, str], list[str]] = {}
    for a in found.plan.assignments if found.plan is not None else ():
        gpu = gpus[int(a.gpu)]
        targets.setdefault((gpu.model, a.profile), []).append(_where(gpu, a.profile, a.start))
    sources = [(_where(a.gpu, a.profile, a.start), (a.gpu.model, a.profile)) for a in found.moving] + [
        (_("missing %(profile)s") % {"profile": key[1]}, key)
        for key, n in sorted(found.missing.items())
        for _n in range(n)
    ]
    return tuple(f"{source} → {(targets.get(key) or ['?']).pop(0)}" for source, key in sources)


def _target_gpus(assessments: Iterable[_Assessment]) -> dict[int, GpuCapacity]:
    ids = {int(a.gpu) for found in assessments if found.plan for a in found.plan.assignments}
    return {g.pk: g for g in GpuCapacity.objects.filter(pk__in=ids).select_related("node")}


def replaceable(pool: Pool) -> Replaceability:
    """Whether re-placing `pool` fits now, and why not; the same assessment `replace` acts on."""
    return replaceable_pools([pool])[pool.pk]


def replaceable_pools(pools: list[Pool]) -> dict[int, Replaceability]:
    """`replaceable` for many pools, reading the fleet and the queue once. Each pool is judged alone:
    two pools may each fit where only one of them would."""
    pools = list(
        Pool.objects.filter(pk__in=[p.pk for p in pools])
        .select_related("cluster", "request")
        .prefetch_related("items")
    )
    if not pools:
        return {}
    context = _context(list({p.cluster_id: p.cluster for p in pools}.values()))
    live = _live(pools)
    found = {pool.pk: _assess(pool, live[pool.pk], context) for pool in pools}
    gpus = _target_gpus(found.values())
    return {
        pk: Replaceability(
            needed=a.needed,
            fits=a.plan is not None,
            reason=a.reason,
            moves=_describe(a, gpus) if a.plan else (),
        )
        for pk, a in found.items()
    }


def replace(*, pool: Pool, actor) -> Pool:
    """Move the pool's misplaced instances (and any missing ones) to healthy capacity in one transaction,
    then settle the new GPUs in the background. Refuses with the reason (Conflict) and changes nothing
    when there is nothing to move or no room."""
    with transaction.atomic():
        lock_capacity()
        pool = (
            Pool.objects.select_for_update(of=("self",))
            .select_related("cluster", "request")
            .filter(pk=pool.pk)
            .first()
        )
        if pool is None:
            raise Conflict(_("The pool does not exist."))
        live = _live([pool], lock=True)[pool.pk]
        found = _assess(pool, live, _context([pool.cluster]))
        if found.plan is None:
            raise Conflict(found.reason)
        gpus = _target_gpus([found])
        moves = _describe(found, gpus)
        now = timezone.now()
        release_allocations(Allocation.objects.filter(pk__in=[a.pk for a in found.moving]), now)
        # Each new allocation begins the instant the one it replaces ends: billed time has no gap or overlap.
        nodes = reserve_plan(pool, found.plan, at=now)
        recount_allocated(nodes | {a.gpu.node_id for a in found.moving})
        # Nodes this move re-partitions are asked for their MIG change anew by `settle_move`.
        repartitioned = {gpus[int(c.gpu)].node.name for c in found.plan.reconfigure}
        pool.forget_configs(repartitioned)
        record_event(
            tenant_id=pool.project.tenant_id,
            action="pool.moved",
            request_id=pool.request_id,
            pool=pool,
            actor=actor,
            from_state=pool.state,
            to_state=pool.state,
            reason=(_("Re-placed off GPUs that take no new work: %(moves)s.") % {"moves": "; ".join(moves)})[
                :4000
            ],
        )
        dispatch.after_commit(task_names.SETTLE_MOVE, pool.pk)
    log.info("pool %s re-placed by %s: %s", pool.pk, actor, "; ".join(moves))
    return pool


def _moved_at(pool: Pool) -> datetime | None:
    """When the instances still waiting for their MIG layout were reserved: the move's moment."""
    return Allocation.objects.filter(
        pool=pool, released_at__isnull=True, gpu__planned_layout__isnull=False
    ).aggregate(at=Max("allocated_at"))["at"]


def settle_move(*, pool_id: int, last_try: bool = False) -> str:
    """One step of settling a move; returns done, waiting or failed. Safe to repeat: the MIG change and the
    share mode are asked once per node (remembered on the pool), UUIDs and the quota are set to absolute
    values.

    A transient error is raised for the task to retry, unless this is its last try; then, as on a driver
    error, the instances that never got their layout are given back (`_give_up`).
    """
    pool = Pool.objects.select_related("cluster", "project").filter(pk=pool_id).first()
    if pool is None or pool.state not in IN_USE_STATES:
        return DONE  # released meanwhile: nothing of the move is left to drive
    driver = None
    try:
        driver = driver_for(pool.cluster)
        changing = changes_to_apply(pool)
        if changing and cluster_changes(pool, driver, since=_moved_at(pool)):
            return WAITING
        if changing:
            sync_inventory(cluster=pool.cluster, even_if_running=True)  # learn the new instances
        record_uuids(pool)
        live = Allocation.objects.filter(pool=pool, released_at__isnull=True)
        if devices_unpublished(pool, since=live.aggregate(at=Max("allocated_at"))["at"]):
            return WAITING
        bind_pool(pool, driver)  # the moved instances' nodes and claims, and the quota
        return DONE
    except TRANSIENT as error:
        if not last_try:
            raise
        log.warning("pool %s: giving up settling its move after retries: %r", pool.pk, error)
        reason = error_text(error)
    except DriverError as error:
        reason = str(error)
    except Exception as error:
        log.exception("pool %s: settling its move stopped on an unexpected error", pool.pk)
        reason = error_text(error)
    if _give_up(pool_id=pool.pk, reason=reason) and driver is not None:
        settle_binding(pool, driver)  # the namespace may not take what went back to the fleet
    return FAILED


def _give_up(*, pool_id: int, reason: str) -> bool:
    """The MIG change of a move failed: its instances that never came are given back to the fleet and the
    pool, still active, lacks them until it is re-placed again (`missing`)."""
    with transaction.atomic():
        lock_capacity()
        pool = Pool.objects.select_for_update().get(pk=pool_id)
        stuck = Allocation.objects.filter(
            pool=pool, released_at__isnull=True, gpu__planned_layout__isnull=False
        )
        rows = list(stuck.select_related("gpu"))
        if pool.state not in IN_USE_STATES or not rows:
            return False
        recount_allocated(release_allocations(stuck, timezone.now()))
        # Instances a resize added never came: the pool does not grow by them (a move's are missing instead).
        grown = [a for a in rows if a.request_id not in (None, pool.request_id)]
        take_items(pool, Counter((a.gpu.model, a.profile) for a in grown))
        if grown:
            text = _(
                "Growing the pool did not finish (%(reason)s); its %(count)s new instance(s) went back to "
                "the fleet and the pool holds what it held before."
            ) % {"reason": reason, "count": len(grown)}
        else:
            text = _(
                "Re-placing did not finish (%(reason)s); %(count)s instance(s) are missing until the "
                "pool is re-placed again."
            ) % {"reason": reason, "count": len(rows)}
        record_event(
            tenant_id=pool.project.tenant_id,
            action="pool.grow_failed" if grown else "pool.move_failed",
            request_id=pool.request_id,
            pool=pool,
            from_state=pool.state,
            to_state=pool.state,
            reason=text[:4000],
        )
        dispatch.after_commit(task_names.ADMIT)
    log.warning("pool %s: its move failed: %s", pool_id, reason)
    return True


def moves_in_flight() -> list[Pool]:
    """Active pools with instances still waiting for the MIG layout of a move."""
    return list(
        Pool.objects.filter(
            Q(allocations__released_at__isnull=True, allocations__gpu__planned_layout__isnull=False),
            state__in=IN_USE_STATES,
        ).distinct()
    )


def redrive_moves(*, now: datetime | None = None) -> list[int]:
    """For the sweeper: settle again each move in flight longer than POOL_REDRIVE_SECONDS, at most once per
    that period (its task may have been lost); `settle_move` itself gives up a MIG change that is stuck."""
    now = now or timezone.now()
    due = now - timedelta(seconds=settings.POOL_REDRIVE_SECONDS)
    redriven = []
    for pool in moves_in_flight():
        moved = _moved_at(pool)
        key = f"pools:redrive-move:{pool.pk}"
        if moved is not None and moved <= due and cache.add(key, "1", timeout=settings.POOL_REDRIVE_SECONDS):
            dispatch.after_commit(task_names.SETTLE_MOVE, pool.pk)
            redriven.append(pool.pk)
    return redriven
