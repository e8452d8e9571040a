"""A month of the portal's own requests as the what-if simulator's trace (pools/placement/simulation.py):
today's fleet, emptied, and the month's approved requests with the times they arrived and held capacity.

Words used here:
- month: a calendar month in BILLING_TIME_ZONE, written YYYY-MM, from 2000-01 to 2999-12 as usage months
  are. Second 0 of the trace is its first instant; the horizon is its length, or the time up to now for
  the month under way.
- arrival: a request's approval, the moment it joins the queue (the queue's recent demand counts from it
  too, pools/selectors/demand.py). Rejected requests never count, even those rejected while queued.
- hold: how long the request's pool really held capacity: from its reservation to its release (a failed
  pool's release is when it gave its capacity back). A pool still live holds past the horizon whenever it
  is admitted (from its arrival to a second after the horizon).
- estimated hold: a request approved but never admitted (cancelled while it waited, or waiting still) is
  given the median hold (the lower middle one) of the month's admitted requests of its purpose, or of all
  of them where none had its purpose, or a hold past the horizon where none was admitted. It is demand the
  fleet did not serve, which a larger fleet would have: leaving it out would flatter the real fleet. The
  median, not the mean, so that one month-long pool does not set the hold of every short one.
- fleet: every registered cluster's GPUs as placement sees them today (pools/selectors/fleet.py), with
  nothing allocated and nothing being re-partitioned: the month starts free, on today's layouts, groups
  and drains.
- route: where the queue would try a request (pools/placement/whatif.py): the cluster it asked for, or
  each cluster of the run in name order, each with the group a request of its purpose lands in there.
  Priorities are not kept: the simulator takes requests in arrival order.
"""

from __future__ import annotations

import re
from collections import defaultdict
from dataclasses import dataclass, replace
from datetime import datetime, timedelta
from statistics import median_low
from zoneinfo import ZoneInfo

from django.db.models import Count, Q
from django.utils import timezone

from pools import pricing
from pools.conf import settings
from pools.models import Cluster, GpuCapacity, GpuGroup, Pool, PoolRequest, RequestState
from pools.placement.fleet_changes import NodeSize
from pools.placement.simulation import SimulationTrace, TimedRequest
from pools.placement.types import Fleet, Gpu
from pools.placement.whatif import Route

# The queue's own translation of a request for the engine, so that a month replays the items and groups
# the queue asked for; it builds plain data and reads only the prefetched items.
from pools.selectors.fleet import engine_request, fleet_snapshot

FIRST_YEAR, LAST_YEAR = 2000, 2999
_SECOND = timedelta(seconds=1)


class HistoryError(ValueError):
    """A month or cluster that cannot be read as history; the message says what was expected."""


@dataclass(frozen=True)
class MonthHistory:
    month: str  # YYYY-MM
    time_zone: str
    start: datetime  # second 0 of the trace
    trace: SimulationTrace
    routes: dict[str, tuple[Route, ...]]  # per request id, the clusters the queue would try, in order
    estimated: tuple[str, ...]  # ids of the requests never admitted, whose hold is the median's


def parse_month(text: str) -> tuple[int, int]:
    """Reads "2026-11" as (2026, 11); anything else is refused with what was expected."""
    found = re.fullmatch(r"(\d{4})-(\d{2})", text.strip(), flags=re.ASCII) if isinstance(text, str) else None
    if not found or not 1 <= int(found[2]) <= 12 or not FIRST_YEAR <= int(found[1]) <= LAST_YEAR:
        raise HistoryError(
            f"A month is written YYYY-MM, from {FIRST_YEAR}-01 to {LAST_YEAR}-12, e.g. 2026-11, not {text!r}."
        )
    return int(found[1]), int(found[2])


def month_trace(*, month: str, cluster: str | None = None) -> SimulationTrace:
    """The month's requests on today's emptied fleet, as the simulator takes them (see month_history)."""
    return month_history(month=month, cluster=cluster).trace


def month_history(*, month: str, cluster: str | None = None, now: datetime | None = None) -> MonthHistory:
    """The month as a trace with what a what-if run needs beside it; only the named cluster's requests
    (asked for it, or for any cluster and admitted there) and GPUs when `cluster` is given. Six queries,
    however many requests the month holds. Raises HistoryError for a bad month, one not begun by `now`
    (default: the clock), or an unknown cluster."""
    label, start, until = month_span(month, now=now)
    horizon = (until - start) // _SECOND
    clusters = _clusters(cluster)
    grouped, fleet = _fleet_of(clusters)
    requests = _requests(start, until, clusters[0] if cluster is not None else None)
    timed: list[TimedRequest] = []
    routes: dict[str, tuple[Route, ...]] = {}
    held: dict[str, list[int]] = defaultdict(list)  # per purpose, the holds of the admitted requests
    waited: list[int] = []  # positions of the requests never admitted
    for request in requests:
        arrive = (request.approved_at - start) // _SECOND
        route = tuple(
            (c.name, engine_request(request, grouped[c.pk]).group)
            for c in clusters
            if request.cluster_id in (None, c.pk)
        )
        groups = {group for _cluster, group in route}
        pool = _pool_of(request)
        if pool is None:
            hold = 0  # estimated below, once every admitted request's hold is known
            waited.append(len(timed))
        else:
            hold = _held(pool, start, arrive, horizon)
            held[request.purpose].append(hold)
        routes[str(request.pk)] = route
        timed.append(
            TimedRequest(
                id=str(request.pk),
                arrive=arrive,
                hold=hold,
                items=engine_request(request, False).items,
                group=groups.pop() if len(groups) == 1 else None,  # differing groups: each route's own
            )
        )
    every = [hold for holds in held.values() for hold in holds]
    for position in waited:
        holds = held.get(requests[position].purpose) or every
        hold = median_low(holds) if holds else horizon - timed[position].arrive + 1
        timed[position] = replace(timed[position], hold=hold)
    trace = SimulationTrace(fleet, tuple(timed), horizon, settings.QUEUE_BACKFILL_GRACE_SECONDS)
    estimated = tuple(timed[position].id for position in waited)
    return MonthHistory(label, pricing.month_time_zone(), start, trace, routes, estimated)


def month_span(month: str, *, now: datetime | None = None) -> tuple[str, datetime, datetime]:
    """The month as YYYY-MM, its first instant and the instant a run of it ends: its end, or `now` (default:
    the clock) for the month under way. Reads no database; raises HistoryError for a bad month or one not
    begun by `now`."""
    year, number = parse_month(month)
    zone = pricing.month_time_zone()
    start = datetime(year, number, 1, tzinfo=ZoneInfo(zone))
    end = datetime(year + number // 12, number % 12 + 1, 1, tzinfo=ZoneInfo(zone))
    until = min(end, now or timezone.now())
    if (until - start) // _SECOND < 1:
        raise HistoryError(f"The month {year:04d}-{number:02d} has not begun yet ({zone}).")
    return f"{year:04d}-{number:02d}", start, until


def fleet_nodes(*, cluster: str | None = None) -> list[NodeSize]:
    """Today's nodes as a run's fleet holds them (every cluster's, or the named one's), each with its count
    of GPUs and named as placement names it: what a run's changes and the cap on its fleet are checked
    against when it is asked for, in two queries however large the fleet, no GPU built. Raises HistoryError
    for an unknown cluster."""
    rows = (
        GpuCapacity.objects.filter(present=True, node__present=True, node__cluster__in=_clusters(cluster))
        .values_list("node__cluster__name", "node__name")
        .annotate(gpus=Count("pk"))
        .order_by("node__cluster__name", "node__name")
    )
    return [NodeSize(f"{name}/{node}", name, gpus) for name, node, gpus in rows]


def _fleet_of(clusters: list[Cluster]) -> tuple[dict[int, bool], Fleet]:
    """Which of the clusters place by GPU group, and their GPUs as placement sees them today, emptied."""
    grouped = dict.fromkeys((c.pk for c in clusters), False)
    for cluster_id in GpuGroup.objects.values_list("cluster_id", flat=True).distinct():
        grouped[cluster_id] = True
    fleets = fleet_snapshot(clusters, grouped)
    gpus = (gpu for c in clusters for gpu in fleets.get(c.name, Fleet(())).gpus)
    return grouped, Fleet(tuple(_emptied(gpu) for gpu in gpus))


def _clusters(name: str | None) -> list[Cluster]:
    clusters = list(Cluster.objects.order_by("name"))
    if name is None:
        return clusters
    chosen = [c for c in clusters if c.name == name]
    if not chosen:
        known = ", ".join(c.name for c in clusters) or "none is registered"
        raise HistoryError(f"No cluster is named {name!r}; the clusters: {known}.")
    return chosen


def _requests(start: datetime, until: datetime, cluster: Cluster | None) -> list[PoolRequest]:
    """The requests approved in [start, until) and not rejected, in approval order, with items and pool."""
    rows = PoolRequest.objects.filter(approved_at__gte=start, approved_at__lt=until).exclude(
        state=RequestState.REJECTED
    )
    if cluster is not None:
        # A request for any cluster belongs to the one its pool went to; never admitted, to none of them.
        rows = rows.filter(Q(cluster=cluster) | Q(cluster__isnull=True, pool__cluster=cluster))
    return list(rows.select_related("pool").prefetch_related("items").order_by("approved_at", "pk"))


def _held(pool: Pool, start: datetime, arrive: int, horizon: int) -> int:
    """Whole seconds from the pool's reservation to its release, each counted from second 0 as arrivals
    are; a live pool is still held at the horizon, so that its last run does not see it released."""
    if pool.released_at is None:
        return horizon - arrive + 1
    return max(0, (pool.released_at - start) // _SECOND - (pool.reserved_at - start) // _SECOND)


def _pool_of(request: PoolRequest) -> Pool | None:
    try:
        return request.pool  # read with the request (select_related): no query, even when it has none
    except PoolRequest.pool.RelatedObjectDoesNotExist:
        return None


def _emptied(gpu: Gpu) -> Gpu:
    """The GPU free, its layout, group, model and drain as they are: the month starts with nothing held."""
    return replace(
        gpu,
        allocated=False,
        reconfiguring=False,
        instances=tuple(replace(slot, allocated=False) for slot in gpu.instances),
    )
