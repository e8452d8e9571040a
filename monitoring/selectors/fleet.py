"""The fleet as a whole: allocated against used per cluster and each pool's part of it, the hottest and
idlest, recent events, and each tenant's efficiency over a range (the words are those of
monitoring.selectors)."""

from __future__ import annotations

from dataclasses import dataclass, fields
from datetime import datetime, timedelta

from django.db import connection, transaction
from django.db.models import Count, Max, Q, QuerySet
from django.utils import timezone

from monitoring.models import GpuEvent, Latest
from monitoring.models.samples import WHOLE_GPU
from monitoring.storage import samples
from pools import mig
from pools.kinds import SHARE_KINDS, shown_slices
from pools.models import Cluster
from pools.selectors import monitoring as pools

FRESH = timedelta(minutes=10)
TOP = 10  # hottest and idlest GPUs shown


def fresh_since(now: datetime | None = None) -> datetime:
    return (now or timezone.now()) - FRESH


def _held() -> tuple[str, dict]:
    """The CTEs `held`, every allocation, live or past, with its sample slot and compute slices (see the
    module's words), and `inventory`, every GPU where it is: pools' own relations, and their parameters.
    `inventory` is planned where it is used, never made once as a table: a query that keeps a cluster, a GPU
    group or a node of it is then planned on the GPUs' own statistics (a made table has none, and a join on
    a few of its rows was planned as a loop over every GPU: minutes at a hundred thousand GPUs)."""
    held, inventory = pools.allocations(), pools.gpus()
    sql = f"""
    held AS (SELECT a.*, COALESCE(a.start, {WHOLE_GPU}) AS slot FROM ({held.sql}) a),
    inventory AS NOT MATERIALIZED ({inventory.sql})"""
    return sql, {**held.params, **inventory.params}


def _fetch(sql: str, params: dict) -> list[tuple]:
    with connection.cursor() as cursor:
        cursor.execute(sql, params)
        return cursor.fetchall()


def _fetch_without_jit(sql: str, params: dict) -> list[tuple]:
    """`_fetch` with PostgreSQL's JIT off: a pass over a large fleet is planned costly enough for it to
    optimise and inline, which takes seconds where the query itself takes a fraction of one."""
    with transaction.atomic(), connection.cursor() as cursor:
        cursor.execute("SET LOCAL jit = off")
        cursor.execute(sql, params)
        return cursor.fetchall()


def _share(part: float, whole: float) -> float | None:
    return part / whole if whole else None


# --- per cluster: allocated against used, now -------------------------------------------------------


class _Shares:
    """Shares of allocated, measured and used compute slices (see the module's words)."""

    compute_total: int
    allocated: int
    measured: int
    used: float

    @property
    def allocated_share(self) -> float | None:
        return _share(self.allocated, self.compute_total)

    @property
    def efficiency(self) -> float | None:
        return _share(self.used, self.measured)

    @property
    def coverage(self) -> float | None:
        return _share(self.measured, self.allocated)


@dataclass(frozen=True)
class ClusterUsage(_Shares):
    cluster_id: int
    name: str
    gpus: int
    reporting: int  # GPUs with fresh figures
    compute_total: int
    allocated: int
    measured: int
    used: float
    power_w: float
    memory_used_bytes: int
    memory_total_bytes: int
    utilisation_pct: float | None = None  # averaged over the GPUs with fresh figures that give it
    temperature_max_c: float | None = None  # the hottest GPU's, of those with fresh figures


def _node_scope(
    *, cluster_id: int | None, group_id: int | None, ungrouped: bool, node_id: int | None
) -> tuple[str, dict]:
    """The SQL condition (on a GPU of `inventory`, `g`, to follow a WHERE) and parameters that keep one
    cluster, one GPU group of it (or, `ungrouped`, its nodes in no group) or one node; empty for the whole
    fleet."""
    conditions, params = [], {}
    if cluster_id is not None:
        conditions.append("g.cluster_id = %(scope_cluster)s")
        params["scope_cluster"] = cluster_id
    if group_id is not None:
        conditions.append("g.group_id = %(scope_group)s")
        params["scope_group"] = group_id
    elif ungrouped:
        conditions.append("g.group_id IS NULL")
    if node_id is not None:
        conditions.append("g.node_id = %(scope_node)s")
        params["scope_node"] = node_id
    return "".join(f" AND {condition}" for condition in conditions), params


@dataclass(frozen=True)
class PoolUsage:
    """A pool's part of its cluster's compute slices (allocated, measured, used), and the newest figures of
    what it holds: each GPU or instance once (a pool's shares of one GPU read the GPU's figures)."""

    pool_id: int
    cluster_id: int
    units: int  # GPUs and instances held
    reporting: int  # of them with fresh figures
    allocated: int | float
    measured: int | float
    used: float
    sm_active_pct: float | None  # averaged over the units that report it
    memory_used_bytes: int | None  # added up over the units that report it
    memory_total_bytes: int | None


@dataclass(frozen=True)
class FleetUsage:
    clusters: list[ClusterUsage]
    pools: list[PoolUsage]  # the pools holding live allocations, by cluster and id


# The profiles whose units share a GPU and its figures (pools/kinds: the kinds not measured alone).
_SHARES = [profile for kind in SHARE_KINDS for profile in kind.every_profile()]


def fleet_usage(
    *,
    now: datetime | None = None,
    cluster_id: int | None = None,
    group_id: int | None = None,
    ungrouped: bool = False,
    node_id: int | None = None,
) -> FleetUsage:
    """Per cluster, in one query: present GPUs and their fresh figures (power and memory added up,
    utilisation averaged, the hottest's temperature); compute slices in all, allocated, measured and used
    (see the module's words), added up from each pool's part of them, which comes too (/metrics exports
    both). With `cluster_id`, that cluster only, and within it one GPU group (`group_id`), its nodes in no
    group (`ungrouped`) or one node (`node_id`) when given."""
    nodes, scope = _node_scope(cluster_id=cluster_id, group_id=group_id, ungrouped=ungrouped, node_id=node_id)
    held, params = _held()
    clusters = pools.clusters()
    # Live allocations never share a slice: only shares of a GPU can put two of a pool's on one GPU's
    # figures, and those alone are grouped into units, so that the rest is read in one pass.
    sql = f"""
        WITH {held},
        gpus AS (
            SELECT g.cluster_id, count(*) AS gpus, count(l.id) AS reporting,
                   COALESCE(sum(l.power_w), 0) AS power_w,
                   COALESCE(sum(l.memory_used_bytes), 0) AS memory_used,
                   COALESCE(sum(l.memory_total_bytes), 0) AS memory_total,
                   avg(l.utilisation_pct) AS utilisation, max(l.temperature_c) AS temperature
            FROM inventory g
            LEFT JOIN monitoring_latest l
                   ON l.gpu_id = g.gpu_id AND l.slot = {WHOLE_GPU} AND l.at >= %(fresh)s
            WHERE g.present AND g.node_present{nodes}
            GROUP BY g.cluster_id
        ),
        live AS MATERIALIZED (
            SELECT h.pool_id, h.gpu_id, h.slot, h.compute, h.profile = ANY(%(shares)s) AS shared
            FROM held h WHERE h.released_at IS NULL
        ),
        units AS (
            SELECT pool_id, gpu_id, slot, compute FROM live WHERE NOT shared
            UNION ALL
            SELECT pool_id, gpu_id, slot, sum(compute) FROM live WHERE shared GROUP BY pool_id, gpu_id, slot
        ),
        busy AS (
            SELECT g.cluster_id, u.pool_id, count(*) AS units, count(l.id) AS reporting,
                   sum(u.compute) AS allocated,
                   COALESCE(sum(u.compute) FILTER (WHERE l.sm_active_pct IS NOT NULL), 0) AS measured,
                   COALESCE(sum(u.compute * l.sm_active_pct / 100.0), 0)::float8 AS used,
                   avg(l.sm_active_pct) AS sm_active, sum(l.memory_used_bytes)::bigint AS memory_used,
                   sum(l.memory_total_bytes)::bigint AS memory_total
            FROM units u
            JOIN inventory g ON g.gpu_id = u.gpu_id
            LEFT JOIN monitoring_latest l ON l.gpu_id = u.gpu_id AND l.slot = u.slot AND l.at >= %(fresh)s
            WHERE true{nodes}
            GROUP BY g.cluster_id, u.pool_id
        )
        SELECT c.id, c.name, COALESCE(gpus.gpus, 0), COALESCE(gpus.reporting, 0),
               COALESCE(gpus.power_w, 0)::float8, COALESCE(gpus.memory_used, 0)::bigint,
               COALESCE(gpus.memory_total, 0)::bigint, gpus.utilisation, gpus.temperature,
               busy.pool_id, busy.units, busy.reporting,
               busy.allocated, busy.measured, busy.used, busy.sm_active, busy.memory_used, busy.memory_total
        FROM ({clusters.sql}) c
        LEFT JOIN gpus ON gpus.cluster_id = c.id
        LEFT JOIN busy ON busy.cluster_id = c.id
        {"WHERE c.id = %(scope_cluster)s" if cluster_id is not None else ""}
        ORDER BY c.name, c.id, busy.pool_id
    """
    params = {**params, **clusters.params, "fresh": fresh_since(now), "shares": _SHARES, **scope}
    found: dict[int, list[tuple]] = {}
    for row in _fetch_without_jit(sql, params):
        found.setdefault(row[0], []).append(row)
    clusters_found, pools_found = [], []
    for cluster, rows in found.items():
        name, gpus, reporting, power, memory_used, memory_total, utilisation, hottest = rows[0][1:9]
        parts = [row[9:] for row in rows if row[9] is not None]
        pools_found += [
            PoolUsage(pool, cluster, units, seen, shown_slices(allocated), shown_slices(measured), *figures)
            for pool, units, seen, allocated, measured, *figures in parts
        ]
        allocated, measured = (shown_slices(sum(part[k] for part in parts)) for k in (3, 4))
        clusters_found.append(
            ClusterUsage(
                cluster, name, gpus, reporting, gpus * mig.COMPUTE_SLICES, allocated, measured,
                float(sum(part[5] for part in parts)), power, memory_used, memory_total, utilisation, hottest,
            )
        )  # fmt: skip
    return FleetUsage(clusters_found, pools_found)


def cluster_usage(
    *,
    now: datetime | None = None,
    cluster_id: int | None = None,
    group_id: int | None = None,
    ungrouped: bool = False,
    node_id: int | None = None,
) -> list[ClusterUsage]:
    """`fleet_usage`'s clusters."""
    scope = {"cluster_id": cluster_id, "group_id": group_id, "ungrouped": ungrouped, "node_id": node_id}
    return fleet_usage(now=now, **scope).clusters


@dataclass(frozen=True)
class FleetTotals(_Shares):
    gpus: int = 0
    reporting: int = 0
    compute_total: int = 0
    allocated: int = 0
    measured: int = 0
    used: float = 0.0
    power_w: float = 0.0
    memory_used_bytes: int = 0
    memory_total_bytes: int = 0


def fleet_totals(clusters: list[ClusterUsage]) -> FleetTotals:
    """The clusters' figures added up."""
    return FleetTotals(**{f.name: sum(getattr(c, f.name) for c in clusters) for f in fields(FleetTotals)})


# --- hottest and idlest -----------------------------------------------------------------------------


def hottest(*, limit: int = TOP, now: datetime | None = None) -> list[Latest]:
    """The present GPUs running hottest now (fresh figures), with their node and cluster."""
    return list(
        Latest.objects.filter(
            slot=WHOLE_GPU, at__gte=fresh_since(now), temperature_c__isnull=False, gpu__present=True
        )
        .select_related("gpu__node__cluster")
        .order_by("-temperature_c", "gpu_id")[:limit]
    )


@dataclass(frozen=True)
class Idle:
    gpu_id: int
    cluster: str
    node: str
    index: int
    profile: str
    slot: int
    sm_active_pct: float
    memory_used_bytes: int | None
    tenant: str
    project: str
    pool_id: int


def idlest(*, limit: int = TOP, now: datetime | None = None) -> list[Idle]:
    """Allocated GPUs and instances with the lowest SM activity now: compute paid for and not used."""
    held, params = _held()
    sql = f"""
        WITH {held}
        SELECT h.gpu_id, g.cluster_name, g.node_name, g.index, h.profile, h.slot, l.sm_active_pct,
               l.memory_used_bytes, h.tenant_slug, h.project_slug, h.pool_id
        FROM held h
        JOIN inventory g ON g.gpu_id = h.gpu_id
        JOIN monitoring_latest l ON l.gpu_id = h.gpu_id AND l.slot = h.slot AND l.at >= %(fresh)s
        WHERE h.released_at IS NULL AND l.sm_active_pct IS NOT NULL
        ORDER BY l.sm_active_pct, h.gpu_id, h.slot
        LIMIT %(limit)s
    """
    rows = _fetch(sql, {**params, "fresh": fresh_since(now), "limit": limit})
    return [Idle(*row) for row in rows]


def recent_events() -> QuerySet[GpuEvent]:
    """GPU events, newest first, with their GPU, node and cluster (read for the page's events only, not
    joined to every GPU first); the page pages through them."""
    return GpuEvent.objects.prefetch_related("gpu__node__cluster").order_by("-at", "-pk")


# --- per tenant: efficiency over a range -----------------------------------------------------------


@dataclass(frozen=True)
class TenantEfficiency:
    tenant_id: int
    slug: str
    name: str
    allocated_hours: float  # compute-slice hours held in the range
    measured_hours: float
    used_hours: float

    @property
    def efficiency(self) -> float | None:
        return _share(self.used_hours, self.measured_hours)

    @property
    def coverage(self) -> float | None:
        return _share(self.measured_hours, self.allocated_hours)


def rollup_for(*, start: datetime, end: datetime, now: datetime) -> int:
    """The roll-up a range is read from: 5 minutes where a chart would read raw samples or 5-minute
    buckets, else 1 hour (samples.resolution_for says which detail is still kept)."""
    return samples.resolution_for(end - start, now=now, start=start) or samples.FIVE_MINUTES


def tenant_efficiency(
    *, start: datetime, end: datetime, now: datetime | None = None
) -> list[TenantEfficiency]:
    """Per tenant that held capacity in [start, end), from roll-ups: compute-slice hours allocated,
    measured and used, each allocation counted only while it was held (buckets cut at its ends)."""
    now = now or timezone.now()
    seconds = rollup_for(start=start, end=end, now=now)
    held, params = _held()
    sql = f"""
        WITH {held},
        span AS (
            SELECT h.gpu_id, h.slot, h.compute, h.tenant_id, h.tenant_slug, h.tenant_name,
                   GREATEST(h.allocated_at, %(start)s) AS since,
                   LEAST(COALESCE(h.released_at, 'infinity'), %(end)s) AS until
            FROM held h
            WHERE h.allocated_at < %(end)s AND (h.released_at IS NULL OR h.released_at > %(start)s)
              AND h.compute > 0
        ),
        allocated AS (
            SELECT tenant_id, tenant_slug, tenant_name,
                   sum(compute * extract(epoch FROM until - since)) AS seconds
            FROM span GROUP BY tenant_id, tenant_slug, tenant_name
        ),
        seen AS (
            SELECT s.tenant_id,
                   sum(s.compute * o.seconds) AS measured,
                   sum(s.compute * o.seconds * r.sm_active_pct_avg / 100.0) AS used
            FROM span s
            JOIN monitoring_rollup r ON r.gpu_id = s.gpu_id AND r.slot = s.slot AND r.seconds = %(res)s
                 AND r.bucket >= %(start)s - make_interval(secs => %(res)s) AND r.bucket < %(end)s
                 AND r.bucket < s.until AND r.bucket + make_interval(secs => %(res)s) > s.since
                 AND r.sm_active_pct_avg IS NOT NULL
            CROSS JOIN LATERAL (
                SELECT extract(epoch FROM LEAST(r.bucket + make_interval(secs => %(res)s), s.until)
                                          - GREATEST(r.bucket, s.since)) AS seconds
            ) o
            GROUP BY s.tenant_id
        )
        SELECT a.tenant_id, a.tenant_slug, a.tenant_name, (a.seconds / 3600)::float8,
               (COALESCE(seen.measured, 0) / 3600)::float8, (COALESCE(seen.used, 0) / 3600)::float8
        FROM allocated a
        LEFT JOIN seen ON seen.tenant_id = a.tenant_id
        ORDER BY a.tenant_name, a.tenant_id
    """
    params = {**params, "start": start, "end": end, "res": seconds}
    return [TenantEfficiency(*row) for row in _fetch(sql, params)]


@dataclass(frozen=True)
class Collection:
    """How one cluster's figures arrive: collected by the portal (its Prometheus, or the simulated fleet)
    and how the last run went, or pushed by node agents and when one was last heard."""

    cluster: str
    source: str  # "dcgm", "simulated" or "agents"
    last_success_at: datetime | None
    last_error: str
    problems: int
    agents: int
    agent_last_used_at: datetime | None


def collection_status() -> list[Collection]:
    """One row per cluster, in one query."""
    clusters = (
        Cluster.objects.order_by("name")
        .select_related("collector_status")
        .annotate(
            agents=Count("agent_tokens", filter=Q(agent_tokens__revoked_at__isnull=True)),
            agent_last_used_at=Max("agent_tokens__last_used_at"),
        )
    )
    rows = []
    for cluster in clusters:
        status = getattr(cluster, "collector_status", None)
        collected = cluster.prometheus_url or cluster.driver == Cluster.Driver.SIMULATED
        rows.append(
            Collection(
                cluster=cluster.name,
                source=("dcgm" if cluster.prometheus_url else "simulated") if collected else "agents",
                last_success_at=status.last_success_at if status else None,
                last_error=status.last_error if status else "",
                problems=len(status.problems) if status else 0,
                agents=cluster.agents,
                agent_last_used_at=cluster.agent_last_used_at,
            )
        )
    return rows
