"""The approvers' verdicts: whether a request would be admitted now, without reserving anything, by the
queue's own placement (pools/services/queue.py): it fits (where, after which re-partitions), it waits (what is
missing), or it can never fit. Shown on the approvers' pages and as the admin's placement preview.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from django.utils import timezone
from django.utils.translation import gettext as _

from pools import placement
from pools.models import Cluster, GpuCapacity, PoolRequest
from pools.placement.admission import BEYOND_LIMIT
from pools.placement.reasons import Reason
from pools.selectors import capacity_picture, render_reason
from pools.selectors.demand import queue_demand
from pools.selectors.quotas import ledger, quota_owner, request_slices
from pools.services.queue import NO_CLUSTER, as_reason, place_request

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
    what the engine says of that empty fleet). The queue admits by the same placement and the same quota
    ledger, so a request that fits now is admitted when approved, one that waits (a limit, or no room) stays
    queued with the same kind of reason."""

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
    books, _holdings = ledger({r.project.tenant_id for r in requests})
    for request in requests:
        quota = books.verdict(request.project.tenant_id, request.project_id, request_slices(request))
        if quota.kind == BEYOND_LIMIT:  # the queue would not admit it however much room there is
            found[request.pk] = Verdict(WAITS, quota.reason(quota_owner(request.project, quota.project)))
            continue
        plan, cluster = place_request(request, [], clusters, grouped, fleets, demand)
        if plan is not None and plan.placed:
            plans[request.pk] = (plan, cluster)
            continue
        reason = as_reason(plan.reason) if plan is not None else Reason(NO_CLUSTER)
        # Never is said only where every cluster the request may use is ready: one that is down may
        # bring back what is missing.
        if request.cluster_id in unready or (request.cluster_id is None and unready):
            found[request.pk] = Verdict(WAITS, reason)
            continue
        if empty is None:
            empty = picture.emptied_fleets
        ever, _cluster = place_request(request, [], clusters, grouped, empty, demand)
        if ever is not None and not ever.placed:
            found[request.pk] = Verdict(NEVER, as_reason(ever.reason))
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
