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

Admission and reservation are one transaction, run one at a time under a database
advisory lock; the allocation exclusion constraint makes over-commit impossible even
if two portals disagreed about the lock.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from datetime import timedelta

from django.conf import settings
from django.db import connection, transaction
from django.db.backends.postgresql.psycopg_any import NumericRange
from django.db.models import Count
from django.utils import timezone
from django.utils.translation import gettext as _
from django.utils.translation import gettext_noop

from pools import capacity_version, mig, placement
from pools.models import (
    Allocation,
    Cluster,
    GpuCapacity,
    Pool,
    PoolRequest,
    PoolState,
    RequestState,
    SpecAndCount,
)
from pools.placement.backfill import (
    may_keep_out_of_the_way,
    out_of_the_way,
    room_out_of_the_way,
    wanted_pairs,
)
from pools.placement.plan import QUEUE_WINDOW
from pools.placement.reasons import Reason
from pools.selectors import capacity_picture, fleet_snapshot, ready_clusters, render_reason
from pools.selectors.demand import queue_demand
from pools.selectors.fleet import engine_request
from pools.services import dispatch
from pools.services.transitions import record_event, transition

QUEUE_LOCK = 0x6770_7571  # pg advisory lock key of the admission queue
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


def _reserve(request: PoolRequest, cluster: Cluster, plan: placement.Placement, now) -> Pool:
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


def reserve_plan(pool: Pool, plan: placement.Placement) -> set[int]:
    """The allocations of a placed plan for `pool`, and the planned layouts of the GPUs it re-partitions
    (admission and re-placing share this); returns the ids of the nodes whose counts changed."""
    gpus = {g.pk: g for g in GpuCapacity.objects.filter(pk__in=[int(a.gpu) for a in plan.assignments])}
    for change in plan.reconfigure:
        GpuCapacity.objects.filter(pk=int(change.gpu)).update(
            planned_layout={
                "mig": change.mig,
                "instances": [{"profile": p, "start": s} for p, s in change.instances],
            }
        )
    Allocation.objects.bulk_create(
        Allocation(
            pool=pool,
            gpu_id=int(a.gpu),
            profile=a.profile,
            slices=NumericRange(0, mig.MEMORY_SLICES)
            if a.profile == mig.FULL_GPU
            else NumericRange(
                a.start, a.start + mig.gpu_model(gpus[int(a.gpu)].model).profile(a.profile).memory_slices
            ),
            resource_name=mig.resource_name(a.profile),
        )
        for a in plan.assignments
    )
    return {g.node_id for g in gpus.values()}


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
                profile=mig.profile_from_resource(resource) or resource,
                allocated=n,
            )
            for (node_id, resource), n in sorted(wanted.items())
        ],
        update_conflicts=True,
        unique_fields=["node", "resource_name"],
        update_fields=["allocated", "last_change_at"],
    )


def lock_capacity() -> None:
    """Serialise every change of reserved capacity (admissions, releases, failures) until the
    transaction ends, so that allocation counts are always recounted from a settled picture."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_advisory_xact_lock(%s)", [QUEUE_LOCK])
    capacity_version.changed()


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
            plan, cluster = _place(request, waiting[position + 1 :], clusters, grouped, fleets, demand)
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
                dispatch.after_commit(dispatch.PROVISION, pool.pk)
                results.append(Admission(request.pk, True, pool.pk))
                continue
            reason = _as_reason(plan.reason) if plan is not None else Reason(NO_CLUSTER)
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


def _place(request, upcoming, clusters, grouped, fleets, demand):
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
        plan = replace(plan, reason=Reason(CLOSEST, cluster=cluster.name, reason=_as_reason(plan.reason)))
    return plan, cluster


def _as_reason(reason: str) -> Reason:
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


FITS, WAITS, NEVER = "fits", "waits", "never"


@dataclass(frozen=True)
class Repartition:
    """A wholly free GPU the plan gives a new layout: MIG on with these instance profiles, or MIG off."""

    gpu: str  # "node GPU index"
    mig: bool
    profiles: tuple[str, ...]


@dataclass(frozen=True)
class Landing:
    """Where one instance (or one whole GPU) of the request would go."""

    profile: str
    gpu: str  # "node GPU index"
    start: int | None  # the MIG instance's first memory slice; None for a whole GPU


@dataclass(frozen=True)
class Verdict:
    """Whether a request would be admitted now, without reserving anything: it `fits` (on `cluster`, after
    `repartitions`, landing as `landings` say), it `waits` (no room now, `reason` says what is missing) or
    it can `never` fit (not even were every candidate cluster empty and every GPU in service: `reason` is
    what the engine says of that empty fleet). The queue admits by the same placement, so a request that
    fits now is admitted when approved, one that waits stays queued with the same kind of reason."""

    outcome: str  # FITS, WAITS or NEVER
    reason: Reason | None = None
    cluster: str = ""
    repartitions: tuple[Repartition, ...] = ()
    landings: tuple[Landing, ...] = ()

    @property
    def reason_data(self) -> dict | None:
        """The reason as stored on a waiting request, for `selectors.render_reason`."""
        return self.reason.as_data() if self.reason is not None else None


def verdicts(requests: Sequence[PoolRequest]) -> dict[int, Verdict]:
    """The verdict of each request (by id), on the fleet as placement sees it: the capacity picture, kept
    while the capacity version holds, as the request form reads it (a page of verdicts does not read
    every GPU again). Reads a fixed number of queries however many requests (their items prefetched)."""
    picture = capacity_picture()
    clusters = [c for c in picture.clusters if c.pk in picture.ready]
    grouped = {c.pk: bool(picture.group_names[c.pk]) for c in clusters}
    fleets = picture.fleets
    empty: dict[str, placement.Fleet] | None = None
    unready = {c.pk for c in picture.clusters if c.pk not in picture.ready}
    plans: dict[int, tuple[placement.Placement, Cluster]] = {}
    found: dict[int, Verdict] = {}
    demand = queue_demand(now=timezone.now())  # as the queue will place it, re-partitions included
    for request in requests:
        plan, cluster = _place(request, [], clusters, grouped, fleets, demand)
        if plan is not None and plan.placed:
            plans[request.pk] = (plan, cluster)
            continue
        reason = _as_reason(plan.reason) if plan is not None else Reason(NO_CLUSTER)
        # Never is said only where every cluster the request may use is ready: one that is down may
        # bring back what is missing.
        if request.cluster_id in unready or (request.cluster_id is None and unready):
            found[request.pk] = Verdict(WAITS, reason)
            continue
        if empty is None:
            empty = picture.emptied_fleets
        ever, _cluster = _place(request, [], clusters, grouped, empty, demand)
        if ever is not None and not ever.placed:
            found[request.pk] = Verdict(NEVER, _as_reason(ever.reason))
        else:
            found[request.pk] = Verdict(WAITS, reason)
    gpu_ids = {int(a.gpu) for plan, _c in plans.values() for a in plan.assignments}
    gpu_ids |= {int(c.gpu) for plan, _c in plans.values() for c in plan.reconfigure}
    names = {
        str(g.pk): f"{g.node.name} GPU {g.index}"
        for g in GpuCapacity.objects.filter(pk__in=gpu_ids).select_related("node")
    }
    for pk, (plan, cluster) in plans.items():
        found[pk] = Verdict(
            FITS,
            cluster=cluster.name,
            repartitions=tuple(
                Repartition(names[c.gpu], c.mig, tuple(profile for profile, _start in c.instances))
                for c in plan.reconfigure
            ),
            landings=tuple(Landing(a.profile, names[a.gpu], a.start) for a in plan.assignments),
        )
    return found


def verdict(request: PoolRequest) -> Verdict:
    return verdicts([request])[request.pk]


def preview(request: PoolRequest) -> str:
    """A request's verdict in words, one line each: the admin's placement preview."""
    found = verdict(request)
    if found.outcome == NEVER:
        return _("Never fits: %(reason)s") % {"reason": render_reason(found.reason_data)}
    if found.outcome == WAITS:
        if found.reason.template == NO_CLUSTER:
            return _("No cluster is ready.")
        return _("Does not fit now: %(reason)s") % {"reason": render_reason(found.reason_data)}
    lines = [_("Fits now on %(cluster)s:") % {"cluster": found.cluster}]
    for change in found.repartitions:
        layout = " + ".join(change.profiles) if change.mig else _("MIG off")
        lines.append(_("re-partition %(gpu)s into %(layout)s") % {"gpu": change.gpu, "layout": layout})
    for landing in found.landings:
        where = landing.gpu if landing.start is None else f"{landing.gpu} @{landing.start}"
        lines.append(f"{landing.profile} → {where}")
    return "\n".join(lines)
