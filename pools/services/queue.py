"""The queue: admit approved requests when placement finds room, reserving capacity as it admits.

Policy. Waiting requests (approved or queued) are taken by priority, then approval
time. Each is placed whole or not at all, on one cluster, by the placement engine,
which sees the rest of the queue. A request that fits is admitted at once, even
behind one that does not (backfill), with one exception that keeps a large request
from starving: once a blocked request has waited QUEUE_BACKFILL_GRACE_SECONDS, no
request of the same or lower priority behind it that competes for what it waits for
is admitted until it is, so freed capacity collects for it. Two requests compete
when they could land on the same GPUs: they ask for a common GPU model, on a
common cluster, in the same GPU group there (a request without a purpose, or a
cluster without groups, reaches every group). A request that competes for nothing
the blocked one needs is still admitted: holding it back would free nothing for it.
Nor is one held back whose placement keeps out of the blocked one's way: only free
instances of GPUs that already hold work, of profiles the blocked one does not ask
for (pools/placement/backfill.py): instances that could never serve it.

Admission and reservation are one transaction, run one at a time under the capacity lock
(pools/services/reservations.py); the allocation exclusion constraint makes over-commit
impossible even if two portals disagreed about the lock. What the queue would do with a
request, without doing it, is its verdict (pools/services/verdicts.py).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from datetime import datetime, timedelta

from django.db import transaction
from django.utils import timezone
from django.utils.translation import gettext_noop

from pools import placement, task_names
from pools.conf import settings
from pools.models import Cluster, Pool, PoolRequest, PoolState, RequestState
from pools.placement.backfill import (
    may_keep_out_of_the_way,
    out_of_the_way,
    room_out_of_the_way,
    wanted_pairs,
)
from pools.placement.plan import QUEUE_WINDOW
from pools.placement.reasons import Reason
from pools.selectors import fleet_snapshot, ready_clusters
from pools.selectors.demand import queue_demand
from pools.selectors.fleet import engine_request
from pools.services.reservations import lock_capacity, recount_allocated, reserve_plan
from pools.services.transitions import record_event, transition
from portal import dispatch

BEHIND_OLDER = gettext_noop("waiting behind an older request that needs the capacity first")
NO_CLUSTER = gettext_noop("no cluster is ready")
CLOSEST = gettext_noop("closest on cluster %(cluster)s: %(reason)s")


@dataclass(frozen=True)
class Claim:
    """What a starving request waits for: GPU models, on some clusters, in a group there."""

    priority: int
    cluster_ids: frozenset[int]
    models: frozenset[str]
    purpose: str
    wanted: frozenset[tuple[str, str]]  # (GPU model, profile) of its items

    @classmethod
    def of(cls, request: PoolRequest, clusters: list[Cluster]) -> Claim:
        items = request.items.all()
        return cls(
            priority=request.priority,
            cluster_ids=frozenset(_candidate_ids(request, clusters)),
            models=frozenset(item.gpu_model for item in items),
            purpose=request.purpose,
            wanted=wanted_pairs(engine_request(request, grouped=False).items),
        )

    def held_back(self, request: PoolRequest, clusters: list[Cluster], grouped: dict[int, bool]) -> bool:
        """Whether admitting `request` could take capacity this claim waits for."""
        if request.priority > self.priority:
            return False
        if not self.models & {item.gpu_model for item in request.items.all()}:
            return False
        shared = self.cluster_ids & _candidate_ids(request, clusters)
        if not request.purpose or not self.purpose or request.purpose == self.purpose:
            return bool(shared)
        return any(not grouped[cluster_id] for cluster_id in shared)  # groups only part them where they exist


def _candidate_ids(request: PoolRequest, clusters: list[Cluster]) -> set[int]:
    return {c.pk for c in clusters if request.cluster_id in (None, c.pk)}


@dataclass
class Admission:
    request_id: int
    admitted: bool
    pool_id: int | None = None
    reason: str = ""


def _reserve(request: PoolRequest, cluster: Cluster, plan: placement.Placement, now: datetime) -> Pool:
    pool = Pool.objects.create(
        request=request,
        project=request.project,
        cluster=cluster,
        state=PoolState.PROVISIONING,
        reserved_at=now,
    )
    recount_allocated(reserve_plan(pool, plan))
    record_event(
        tenant_id=request.project.tenant_id, request=request, pool=pool, to_state=PoolState.PROVISIONING
    )
    return pool


def admit_waiting() -> list[Admission]:
    """Run the queue once; returns what happened to each waiting request."""
    with transaction.atomic():
        lock_capacity()
        waiting = list(
            PoolRequest.objects.waiting()
            .select_for_update(of=("self",))
            .select_related("cluster", "project")
            .prefetch_related("items")
        )
        if not waiting:
            return []
        clusters, grouped = ready_clusters()
        fleets = fleet_snapshot(clusters, grouped)
        now = timezone.now()
        demand = queue_demand(now=now)
        grace = timedelta(seconds=settings.QUEUE_BACKFILL_GRACE_SECONDS)
        starving: list[Claim] = []
        results = []
        for position, request in enumerate(waiting):
            blockers = [claim for claim in starving if claim.held_back(request, clusters, grouped)]
            wanted = frozenset().union(*(claim.wanted for claim in blockers))
            if blockers and not _may_keep_out_of_their_way(request, wanted, clusters, fleets):
                results.append(_wait(request, Reason(BEHIND_OLDER)))  # held back: not starving itself
                continue
            plan, cluster = place_request(request, waiting[position + 1 :], clusters, grouped, fleets, demand)
            placed = plan is not None and plan.placed
            if blockers and not (placed and out_of_the_way(fleets[cluster.name], plan, wanted)):
                results.append(_wait(request, Reason(BEHIND_OLDER)))
                continue
            if placed:
                fleets[cluster.name] = placement.apply(fleets[cluster.name], plan)
                transition(request, RequestState.FULFILLED)
                request.waiting_reason, request.waiting_reason_data = "", None  # nothing waits any more
                request.save(update_fields=["state", "waiting_reason", "waiting_reason_data"])
                pool = _reserve(request, cluster, plan, now)
                dispatch.after_commit(task_names.PROVISION, pool.pk)
                results.append(Admission(request.pk, True, pool.pk))
                continue
            reason = as_reason(plan.reason) if plan is not None else Reason(NO_CLUSTER)
            results.append(_wait(request, reason))
            if request.approved_at and now - request.approved_at >= grace:
                starving.append(Claim.of(request, clusters))
        return results


def _may_keep_out_of_their_way(
    request: PoolRequest,
    wanted: frozenset[tuple[str, str]],
    clusters: list[Cluster],
    fleets: dict[str, placement.Fleet],
) -> bool:
    """Whether a held-back request is worth placing: only one that may keep out of the starving requests'
    way, where a candidate cluster has the free instances for it (pools/placement/backfill.py)."""
    items = engine_request(request, grouped=False).items
    if not may_keep_out_of_the_way(wanted_pairs(items), wanted):
        return False
    candidates = [fleets.get(c.name) for c in clusters if request.cluster_id in (None, c.pk)]
    return any(fleet is not None and room_out_of_the_way(fleet, items) for fleet in candidates)


def place_request(
    request: PoolRequest,
    upcoming: Sequence[PoolRequest],
    clusters: list[Cluster],
    grouped: dict[int, bool],
    fleets: dict[str, placement.Fleet],
    demand: dict[tuple[str, str], float],
) -> tuple[placement.Placement | None, Cluster | None]:
    """The first candidate cluster's plan that places the request; else the failed plan of the cluster
    that comes closest (fewest compute slices missing), its reason naming that cluster when there
    were several. `demand` (selectors.demand.queue_demand) guides the layouts of re-partitioned GPUs."""
    candidates = [c for c in clusters if request.cluster_id in (None, c.pk)]
    failures = []
    for cluster in candidates:
        fleet = fleets.get(cluster.name)
        if fleet is None:
            continue
        wanted = engine_request(request, grouped[cluster.pk])
        later = [engine_request(r, grouped[cluster.pk]) for r in upcoming[:QUEUE_WINDOW]]
        plan = placement.place(fleet, wanted, upcoming=later, demand=demand or None)
        if plan.placed:
            return plan, cluster
        failures.append((placement.shortfall(fleet, wanted), plan, cluster))
    if not failures:
        return None, None
    _missing, plan, cluster = min(failures, key=lambda failure: failure[0])  # the first of equals
    if len(failures) > 1:
        plan = replace(plan, reason=Reason(CLOSEST, cluster=cluster.name, reason=as_reason(plan.reason)))
    return plan, cluster


def as_reason(reason: str) -> Reason:
    """The engine's reasons keep their templates; a plain message (a malformed request) is wrapped."""
    return reason if isinstance(reason, Reason) else Reason("%(text)s", text=str(reason))


def _wait(request: PoolRequest, reason: Reason) -> Admission:
    text, data = str(reason)[:500], reason.as_data()
    if request.state == RequestState.APPROVED:
        transition(request, RequestState.QUEUED, reason=text, reason_data=data)
        request.waiting_reason, request.waiting_reason_data = text, data
        request.save(update_fields=["state", "waiting_reason", "waiting_reason_data"])
    elif request.waiting_reason != text:
        request.waiting_reason, request.waiting_reason_data = text, data
        request.save(update_fields=["waiting_reason", "waiting_reason_data"])
    return Admission(request.pk, False, reason=text)
