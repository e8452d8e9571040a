"""The queue: admit approved requests when placement finds room, reserving capacity as it admits.

The policy is the admission policy's (pools/placement/admission.py), the one the what-if simulator runs
too: waiting requests (approved or queued) by priority, then fair share, then approval time, each placed
whole or not at all on one cluster by the placement engine, which sees the rest of the queue; backfill,
except where an older request starves (QUEUE_BACKFILL_GRACE_SECONDS); the tenants' quota limits. This
module reads the waiting requests and the ready clusters' fleets from the database, gives the policy the
clusters as its room, and writes what it decided.

Admission and reservation are one transaction, run one at a time under the capacity lock
(pools/services/reservations.py); the allocation exclusion constraint makes over-commit
impossible even if two portals disagreed about the lock. What the queue would do with a
request, without doing it, is its verdict (pools/services/verdicts.py).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from datetime import datetime

from django.db import transaction
from django.utils import timezone
from django.utils.translation import gettext_noop

from pools import placement, task_names
from pools.conf import settings
from pools.models import Cluster, GpuCapacity, Pool, PoolRequest, PoolState, RequestKind, RequestState
from pools.placement.admission import Claim, Holding, Reclaims, Waiting, Waits, run_queue
from pools.placement.backfill import out_of_the_way, room_out_of_the_way
from pools.placement.holds import Holds
from pools.placement.plan import QUEUE_WINDOW
from pools.placement.reasons import Reason
from pools.placement.simulation import release
from pools.selectors import fleet_snapshot, ready_clusters
from pools.selectors.demand import queue_demand
from pools.selectors.ends import request_end
from pools.selectors.fleet import engine_request, held_assignments
from pools.selectors.quotas import ledger, quota_owner, request_slices
from pools.services.ends import cancel_by_portal
from pools.services.reclaims import call_off, give_notice
from pools.services.reservations import add_items, lock_capacity, recount_allocated, reserve_plan
from pools.services.transitions import record_event, transition
from portal import dispatch

NO_CLUSTER = gettext_noop("no cluster is ready")
CLOSEST = gettext_noop("closest on cluster %(cluster)s: %(reason)s")
ADMITTED_OTHERWISE = gettext_noop("was admitted on other capacity")
END_PASSED = gettext_noop("its end date passed before it could be admitted")
POOL_GONE = gettext_noop("pool #%(pool)s is no longer active: there is nothing to grow")
GROWN = gettext_noop("grown by request #%(request)s: %(items)s")


def waiting_entry(
    request: PoolRequest,
    clusters: list[Cluster],
    grouped: dict[int, bool],
    now: datetime,
    reclaims: dict[int, list[tuple[int, str]]] | None = None,
) -> Waiting:
    """A waiting request as the admission policy sees it: its places are the clusters it may land on, each
    with its purpose as the group where the cluster places work by group (else any group there). `reclaims`
    are, per request, the pools reclaimed for it with their states: those under notice it waits for, and
    once one is released the capacity it freed is the request's."""
    items = engine_request(request, grouped=False).items
    places = [
        (c.name, (request.purpose or None) if grouped[c.pk] else None)
        for c in clusters
        if request.cluster_id in (None, c.pk)
    ]
    approved = request.approved_at
    reclaimed_for = (reclaims or {}).get(request.pk, ())
    return Waiting(
        id=request.pk,
        tenant=request.project.tenant_id,
        project=request.project_id,
        priority=request.priority,
        arrival=(approved or now, request.pk),
        waited=(now - approved).total_seconds() if approved else -1.0,
        items=items,
        claim=Claim.of(items, places, request.priority),
        asked=request_slices(request),
        reclaiming=tuple(pk for pk, state in reclaimed_for if state == PoolState.RECLAIMING),
        reclaimed=any(state in (PoolState.RELEASING, PoolState.RELEASED) for _pk, state in reclaimed_for),
    )


class _Clusters:
    """The room a queue run places in: the ready clusters' fleets, taken from as the run admits, less what is
    held for requests whose reclaimed pools free it (pools/placement/holds.py)."""

    def __init__(self, requests, clusters, grouped, fleets, demand) -> None:
        self.requests: dict[int, PoolRequest] = requests
        self.clusters, self.grouped, self.fleets, self.demand = clusters, grouped, fleets, demand
        self.where: dict[int, Cluster] = {}
        self.held: dict[int, tuple[int, tuple]] = {}  # pool -> (cluster, assignments): victims looked at
        self.holds = Holds()
        self._behind: dict[tuple[int, bool], placement.Request] = {}

    def _as_upcoming(self, request: PoolRequest, grouped: bool) -> placement.Request:
        """A waiting request as the engine reads it behind the one it places, made once a run: there only
        its items and group count, so it serves every request it waits behind."""
        key = (request.pk, grouped)
        if key not in self._behind:
            self._behind[key] = engine_request(request, grouped)
        return self._behind[key]

    def _views(self, request_id: int) -> dict[str, placement.Fleet]:
        return {name: self.holds.view(fleet, request_id) for name, fleet in self.fleets.items()}

    def place(
        self, request: Waiting, upcoming: Sequence[Waiting], *, reclaimable: bool
    ) -> placement.Placement:
        behind = [self.requests[w.id] for w in upcoming]
        plan, cluster = place_request(
            self.requests[request.id],
            behind,
            self.clusters,
            self.grouped,
            self._views(request.id),
            self.demand,
            reclaimable=reclaimable,
            upcoming_as=self._as_upcoming,
        )
        if plan is None:
            return placement.Placement(str(request.id), False, reason=Reason(NO_CLUSTER))
        self.where[request.id] = cluster
        return plan if plan.placed else replace(plan, reason=as_reason(plan.reason))

    def room_out_of_the_way(self, request: Waiting) -> bool:
        """Only where a candidate cluster has the free instances for it (pools/placement/backfill.py)."""
        cluster_id = self.requests[request.id].cluster_id
        views = self._views(request.id)
        candidates = [views.get(c.name) for c in self.clusters if cluster_id in (None, c.pk)]
        return any(fleet is not None and room_out_of_the_way(fleet, request.items) for fleet in candidates)

    def out_of_the_way(self, plan: placement.Placement, wanted: frozenset[tuple[str, str]]) -> bool:
        return out_of_the_way(self.fleets[self.where[int(plan.request)].name], plan, wanted)

    def admit(self, request: Waiting, plan: placement.Placement) -> None:
        name = self.where[request.id].name
        self.fleets[name] = placement.apply(self.fleets[name], plan)
        self.holds.lift(request.id)

    def fits_without(self, request: Waiting, victims: Sequence[Holding]) -> bool:
        return self._without(request.id, [victim.pool for victim in victims]).placed

    def hold(self, request: Waiting, pools: Sequence[int]) -> None:
        self.holds.hold(request.id, self._without(request.id, pools))

    def _without(self, request_id: int, pools: Sequence[int]) -> placement.Placement:
        """Where the request would go, in the first candidate cluster that places it, were these pools'
        allocations there free; out of what is held for others."""
        missing = [pool for pool in pools if pool not in self.held]
        if missing:
            for (pool, cluster), assignments in held_assignments(missing).items():
                self.held[pool] = (cluster, assignments)
        asked = self.requests[request_id]
        views = self._views(request_id)
        plan = placement.Placement(str(request_id), False)
        for cluster in self.clusters:
            fleet = views.get(cluster.name)
            if fleet is None or asked.cluster_id not in (None, cluster.pk):
                continue
            for pool in pools:
                where, assignments = self.held.get(pool, (None, ()))
                if where == cluster.pk:
                    fleet = release(fleet, placement.Placement(str(pool), True, assignments=assignments))
            plan = placement.place(fleet, engine_request(asked, self.grouped[cluster.pk]))
            if plan.placed:
                return plan
        return plan


@dataclass
class Admission:
    request_id: int
    admitted: bool
    pool_id: int | None = None
    reason: str = ""


def _reserve(request: PoolRequest, cluster: Cluster, plan: placement.Placement, now: datetime) -> Pool:
    """The new pool of an admitted request, billed from `now`, ending where the request says; provisioning
    is sent for after commit."""
    pool = Pool.objects.create(
        request=request,
        project=request.project,
        cluster=cluster,
        state=PoolState.PROVISIONING,
        reserved_at=now,
        end_at=request_end(request, now),
    )
    recount_allocated(reserve_plan(pool, plan, at=now, request=request))
    add_items(pool, plan)
    record_event(
        tenant_id=request.project.tenant_id, request=request, pool=pool, to_state=PoolState.PROVISIONING
    )
    dispatch.after_commit(task_names.PROVISION, pool.pk)
    return pool


def _grow(request: PoolRequest, plan: placement.Placement, now: datetime) -> Pool:
    """An admitted resize: its instances join the pool it grows, billed from `now`; the MIG changes and the
    namespace's larger quota are settled after commit as a move's are (pools/services/replacement.py)."""
    pool = Pool.objects.select_for_update().select_related("project").get(pk=request.target_pool_id)
    recount_allocated(reserve_plan(pool, plan, at=now, request=request))
    add_items(pool, plan)
    # Nodes the growth re-partitions are asked for their MIG change anew, not taken as done before.
    repartitioned = set(
        GpuCapacity.objects.filter(pk__in=[int(c.gpu) for c in plan.reconfigure]).values_list(
            "node__name", flat=True
        )
    )
    pool.forget_configs(repartitioned)
    reason = Reason(GROWN, request=request.pk, items=", ".join(str(item) for item in request.items.all()))
    record_event(
        tenant_id=pool.project.tenant_id,
        action="pool.grown",
        request=request,
        pool=pool,
        from_state=pool.state,
        to_state=pool.state,
        reason=str(reason),
        reason_data=reason.as_data(),
    )
    dispatch.after_commit(task_names.SETTLE_MOVE, pool.pk)
    return pool


def _unadmittable(request: PoolRequest, now: datetime) -> Reason | None:
    """Why a waiting request can no longer be admitted: its end date passed while it waited, or the pool it
    would grow is no longer in use."""
    if request.kind == RequestKind.NEW and request.end_at is not None and request.end_at <= now:
        return Reason(END_PASSED)
    if request.kind == RequestKind.RESIZE:
        pool = request.target_pool
        if pool.state != PoolState.ACTIVE or (pool.end_at is not None and pool.end_at <= now):
            return Reason(POOL_GONE, pool=pool.pk)
    return None


def admit_waiting() -> list[Admission]:
    """Run the queue once under the admission policy (pools/placement/admission.py); returns what happened
    to each waiting request."""
    with transaction.atomic():
        lock_capacity()
        waiting = list(
            PoolRequest.objects.waiting()
            .select_for_update(of=("self",))
            .select_related("cluster", "project__tenant", "target_pool")
            .prefetch_related("items")
        )
        now = timezone.now()
        waiting = [request for request in waiting if not _cancel_unadmittable(request, now)]
        if not waiting:
            return []
        clusters, grouped = ready_clusters()
        requests = {request.pk: request for request in waiting}
        books, holdings = ledger()
        # Borrowed pools are marked in the fleet, so that placement keeps work within guarantees apart from
        # them and a reclaim frees GPUs whole (pools/placement/plan.py).
        borrowed = books.borrowed_pools(holdings) if books.guarantees else set()
        room = _Clusters(
            requests, clusters, grouped, fleet_snapshot(clusters, grouped, borrowed), queue_demand(now=now)
        )
        reclaims = defaultdict(list)
        for request_id, pool_id, state in Pool.objects.filter(reclaimed_for__in=list(requests)).values_list(
            "reclaimed_for_id", "pk", "state"
        ):
            reclaims[request_id].append((pool_id, state))
        decisions = run_queue(
            [waiting_entry(request, clusters, grouped, now, reclaims) for request in waiting],
            books,
            room,
            holdings=holdings,
            grace_seconds=settings.QUEUE_BACKFILL_GRACE_SECONDS,
            window=QUEUE_WINDOW,
            owner=lambda entry, of_project: quota_owner(requests[entry.id].project, of_project),
        )
        results = []
        for decision in decisions:
            request = requests[decision.request.id]
            if isinstance(decision, Reclaims):
                give_notice([victim.pool for victim in decision.victims], request, now=now)
            if isinstance(decision, Waits):
                results.append(_wait(request, as_reason(decision.reason)))
                continue
            if decision.request.reclaiming:
                call_off(request, ADMITTED_OTHERWISE)
            transition(request, RequestState.FULFILLED)
            request.waiting_reason, request.waiting_reason_data = "", None  # nothing waits any more
            request.quota_verdict = decision.verdict.kind if books.in_force else ""  # as it was admitted
            request.save(update_fields=["state", "waiting_reason", "waiting_reason_data", "quota_verdict"])
            if request.kind == RequestKind.RESIZE:
                pool = _grow(request, decision.placement, now)
            else:
                pool = _reserve(request, room.where[request.pk], decision.placement, now)
            results.append(Admission(request.pk, True, pool.pk))
        return results


def place_request(
    request: PoolRequest,
    upcoming: Sequence[PoolRequest],
    clusters: list[Cluster],
    grouped: dict[int, bool],
    fleets: dict[str, placement.Fleet],
    demand: dict[tuple[str, str], float],
    *,
    reclaimable: bool = False,
    upcoming_as: Callable[[PoolRequest, bool], placement.Request] = engine_request,
) -> tuple[placement.Placement | None, Cluster | None]:
    """The first candidate cluster's plan that places the request; else the failed plan of the cluster
    that comes closest (fewest compute slices missing), its reason naming that cluster when there
    were several. `demand` (selectors.demand.queue_demand) guides the layouts of re-partitioned GPUs;
    `reclaimable`: the pool would be borrowed; `upcoming_as` makes the requests behind it what the engine
    reads (`engine_request`, or the same kept for a run)."""
    candidates = [c for c in clusters if request.cluster_id in (None, c.pk)]
    failures = []
    for cluster in candidates:
        fleet = fleets.get(cluster.name)
        if fleet is None:
            continue
        wanted = engine_request(request, grouped[cluster.pk], reclaimable)
        later = [upcoming_as(r, grouped[cluster.pk]) for r in upcoming[:QUEUE_WINDOW]]
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


def _cancel_unadmittable(request: PoolRequest, now: datetime) -> bool:
    """Cancel a waiting request that can no longer be admitted, saying why; whether it was."""
    reason = _unadmittable(request, now)
    if reason is not None:
        cancel_by_portal(request, reason)
    return reason is not None


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
