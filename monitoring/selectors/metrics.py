"""What /metrics reads of the fleet beyond `fleet_usage` (the fleet page's figures per cluster, and each
pool's part of them): the pools' names, each tenant's figures, each cluster's events and faults, and the
GPUs in trouble one by one (the words are those of monitoring.selectors).

- tenant figures: its pools' added up (monitoring.selectors.fleet: PoolUsage).
- in trouble: a GPU with an open fault or a firing alert (open: not resolved, acknowledged or not). Only
  these get series of their own on /metrics; dcgm-exporter's own scrape has every GPU's.

Each reads in one query whatever the fleet's size: the GPUs in trouble are read by their ids, never the
whole fleet. Pools are read through their own relations (pools/selectors/monitoring.py).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime, timedelta

from django.db import connection
from django.db.models import Count, F

from monitoring.models import Alert
from monitoring.models.samples import WHOLE_GPU
from monitoring.selectors.fleet import PoolUsage
from pools.kinds import shown_slices
from pools.models import Pool
from pools.selectors import monitoring as pools

EVENTS_WINDOW = timedelta(hours=24)


def _fetch(sql: str, params: dict) -> list[tuple]:
    with connection.cursor() as cursor:
        cursor.execute(sql, params)
        return cursor.fetchall()


# --- pools and tenants -----------------------------------------------------------------------------


@dataclass(frozen=True)
class PoolNames:
    cluster: str
    tenant: str  # slugs
    project: str


def pool_names(pool_ids: Iterable[int]) -> dict[int, PoolNames]:
    """Where each of these pools is and whose it is, by id (the ids go as one array, however many)."""
    found = pools.relation(
        Pool.objects.order_by().values(
            "id",
            cluster_name=F("cluster__name"),
            tenant_slug=F("project__tenant__slug"),
            project_slug=F("project__slug"),
        ),
        "pools",
    )
    rows = _fetch(
        f"SELECT p.id, p.cluster_name, p.tenant_slug, p.project_slug FROM ({found.sql}) p "
        "WHERE p.id = ANY(%(ids)s)",
        {**found.params, "ids": list(pool_ids)},
    )
    return {pk: PoolNames(cluster, tenant, project) for pk, cluster, tenant, project in rows}


@dataclass(frozen=True)
class TenantFigures:
    tenant: str
    pools: int  # pools holding live allocations
    units: int
    reporting: int
    allocated: int | float
    measured: int | float
    used: float
    memory_used_bytes: int | None
    memory_total_bytes: int | None


def _add(a: int | None, b: int | None) -> int | None:
    return b if a is None else a if b is None else a + b


def tenant_figures(held: list[PoolUsage], names: dict[int, PoolNames]) -> list[TenantFigures]:
    """Each tenant's pools' figures added up, by tenant slug."""
    tenants: dict[str, TenantFigures] = {}
    for pool in held:
        slug = names[pool.pool_id].tenant
        was = tenants.get(slug) or TenantFigures(slug, 0, 0, 0, 0, 0, 0.0, None, None)
        tenants[slug] = TenantFigures(
            slug,
            was.pools + 1,
            was.units + pool.units,
            was.reporting + pool.reporting,
            shown_slices(was.allocated + pool.allocated),
            shown_slices(was.measured + pool.measured),
            was.used + pool.used,
            _add(was.memory_used_bytes, pool.memory_used_bytes),
            _add(was.memory_total_bytes, pool.memory_total_bytes),
        )
    return [tenants[slug] for slug in sorted(tenants)]


# --- per cluster: events and faults ----------------------------------------------------------------


def cluster_troubles(*, now: datetime) -> list[tuple[str, str, int]]:
    """(cluster, what, count): the GPU events of the last EVENTS_WINDOW by kind ("xid", "ecc", "lost",
    "layout"), and the GPUs with an open fault ("fault"), by cluster."""
    inventory = pools.gpus()
    sql = f"""
        WITH happened AS (
            SELECT e.gpu_id, e.kind AS what FROM monitoring_gpuevent e WHERE e.at >= %(since)s
            UNION ALL
            SELECT f.gpu_id, 'fault' FROM monitoring_gpufault f WHERE f.cleared_at IS NULL
        )
        SELECT g.cluster_name, h.what, count(*)
        FROM happened h
        JOIN ({inventory.sql}) g ON g.gpu_id = h.gpu_id
        GROUP BY g.cluster_name, h.what
        ORDER BY g.cluster_name, h.what
    """
    return _fetch(sql, {**inventory.params, "since": now - EVENTS_WINDOW})


def firing_alerts() -> dict[str, int]:
    """Open alerts of any subject, by severity."""
    return dict(Alert.objects.open().order_by().values_list("severity").annotate(n=Count("pk")))


# --- the GPUs in trouble ---------------------------------------------------------------------------

# Materialised first, so that the GPUs in trouble are read by their ids, never the whole fleet.
_IN_TROUBLE = """
    trouble AS MATERIALIZED (
        SELECT gpu_id, 'fault' AS why, kind AS what, 1 AS count
        FROM monitoring_gpufault WHERE cleared_at IS NULL
        UNION ALL
        SELECT gpu_id, 'alert', severity, count(*)
        FROM monitoring_alert WHERE resolved_at IS NULL AND gpu_id IS NOT NULL
        GROUP BY gpu_id, severity
    )"""


def troubled_figures() -> list[tuple]:
    """The newest figures of each GPU in trouble and of its instances, with where it is and which pool holds
    each: (cluster, node, index, uuid, slot, profile, at, power_w, temperature_c, utilisation_pct,
    sm_active_pct, memory_used_bytes, memory_total_bytes, ecc_corrected, ecc_uncorrected, pool id or None),
    by cluster, node, index and slot. Stale figures are there too: the caller says what they still mean."""
    inventory, held = pools.gpus(), pools.allocations(live=True)
    sql = f"""
        WITH {_IN_TROUBLE},
        troubled AS MATERIALIZED (SELECT DISTINCT gpu_id FROM trouble)
        SELECT DISTINCT g.cluster_name, g.node_name, g.index, g.uuid, l.slot, l.profile, l.at,
               l.power_w, l.temperature_c, l.utilisation_pct, l.sm_active_pct,
               l.memory_used_bytes, l.memory_total_bytes, l.ecc_corrected, l.ecc_uncorrected, a.pool_id
        FROM troubled t
        JOIN monitoring_latest l ON l.gpu_id = t.gpu_id
        JOIN ({inventory.sql}) g ON g.gpu_id = t.gpu_id
        LEFT JOIN ({held.sql}) a ON a.gpu_id = t.gpu_id AND l.slot = COALESCE(a.start, {WHOLE_GPU})
        ORDER BY g.cluster_name, g.node_name, g.index, l.slot, a.pool_id
    """
    return _fetch(sql, {**inventory.params, **held.params})


def troubles() -> list[tuple]:
    """Why each GPU in trouble is: (cluster, node, index, uuid, model, "fault", its kind, 1) for its open
    fault, and (…, "alert", severity, how many) for its firing alerts, by cluster, node and index."""
    inventory = pools.gpus()
    sql = f"""
        WITH {_IN_TROUBLE}
        SELECT g.cluster_name, g.node_name, g.index, g.uuid, g.model, t.why, t.what, t.count
        FROM trouble t
        JOIN ({inventory.sql}) g ON g.gpu_id = t.gpu_id
        ORDER BY g.cluster_name, g.node_name, g.index, t.why, t.what
    """
    return _fetch(sql, inventory.params)
