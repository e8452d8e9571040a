"""The fleet's figures on /metrics (`collect`, served by portal/metrics.py through monitoring's plugin), for
a Prometheus that scrapes the portal (monitoring/grafana/gpu-portal.json draws them).

Families (gauges):
- per GPU and per MIG instance, from the newest figures (monitoring.models.Latest), labelled cluster, node,
  gpu (index), uuid (the GPU's), model, profile ("full" for the whole GPU, else the MIG profile),
  mig_start (the instance's first memory slice; empty for the whole GPU), tenant, project and pool (empty
  when unallocated): gpu_portal_gpu_power_watts, _temperature_celsius, _utilisation_ratio,
  _sm_active_ratio, _memory_used_bytes, _memory_total_bytes, _ecc_errors{type=corrected|uncorrected}
  (volatile counts, since the driver loaded). Figures older than monitoring.selectors.FRESH are left out
  (a silent GPU must not look steady); gpu_portal_gpu_last_seen_timestamp_seconds is always there.
- gpu_portal_gpu_events_24h{…, kind}: XID, uncorrected ECC, lost and layout events per GPU, last 24 hours.
- gpu_portal_cluster_gpus{cluster, kind=present|reporting}, gpu_portal_cluster_compute_slices{cluster,
  kind=total|allocated|measured|used}: allocated against used, as the fleet page says it.

Each family is one query whatever the fleet's size; where the GPUs are and who holds them come from pools'
own relations (pools/selectors/monitoring.py).
"""

from __future__ import annotations

from collections.abc import Iterator
from datetime import datetime, timedelta

from django.db import connection
from django.utils import timezone
from prometheus_client.core import GaugeMetricFamily, Metric

from monitoring import selectors
from monitoring.models.samples import WHOLE_GPU
from pools.kinds import WHOLE
from pools.selectors import monitoring as pools

PREFIX = "gpu_portal_"
GPU_LABELS = ("cluster", "node", "gpu", "uuid", "model", "profile", "mig_start", "tenant", "project", "pool")
# (family, help, column of the query, factor to the family's unit)
GPU_FIGURES = (
    ("gpu_power_watts", "Power drawn, in watts.", "power_w", 1.0),
    ("gpu_temperature_celsius", "GPU temperature, in degrees Celsius.", "temperature_c", 1.0),
    ("gpu_utilisation_ratio", "Share of time a kernel was running (0-1).", "utilisation_pct", 0.01),
    (
        "gpu_sm_active_ratio",
        "Share of time the streaming multiprocessors had work (0-1).",
        "sm_active_pct",
        0.01,
    ),
    ("gpu_memory_used_bytes", "Memory in use, in bytes.", "memory_used_bytes", 1.0),
    ("gpu_memory_total_bytes", "Memory in all, in bytes.", "memory_total_bytes", 1.0),
)
WINDOW = timedelta(hours=24)


def collect() -> Iterator[Metric]:
    """Every family, read now (the plugin's `metrics` entry)."""
    return FleetCollector().collect()


def _rows(sql: str, params: dict) -> list[tuple]:
    with connection.cursor() as cursor:
        cursor.execute(sql, params)
        return cursor.fetchall()


def _gpu_rows() -> list[tuple]:
    inventory, held = pools.gpus(), pools.allocations(live=True)
    return _rows(
        f"""
        SELECT g.cluster_name, g.node_name, g.index, g.uuid, g.model, l.slot, l.profile, l.at,
               l.power_w, l.temperature_c, l.utilisation_pct, l.sm_active_pct,
               l.memory_used_bytes, l.memory_total_bytes, l.ecc_corrected, l.ecc_uncorrected,
               COALESCE(a.tenant_slug, ''), COALESCE(a.project_slug, ''), a.pool_id
        FROM monitoring_latest l
        JOIN ({inventory.sql}) g ON g.gpu_id = l.gpu_id
        LEFT JOIN ({held.sql}) a ON a.gpu_id = l.gpu_id AND l.slot = COALESCE(a.start, {WHOLE_GPU})
        WHERE g.present AND g.node_present
        ORDER BY g.cluster_name, g.node_name, g.index, l.slot
        """,
        {**inventory.params, **held.params},
    )


def _event_rows(since: datetime) -> list[tuple]:
    inventory = pools.gpus()
    return _rows(
        f"""
        SELECT g.cluster_name, g.node_name, g.index, g.uuid, g.model, e.kind, count(*)
        FROM monitoring_gpuevent e
        JOIN ({inventory.sql}) g ON g.gpu_id = e.gpu_id
        WHERE e.at >= %(since)s
        GROUP BY g.cluster_name, g.node_name, g.index, g.uuid, g.model, e.kind
        ORDER BY g.cluster_name, g.node_name, g.index, e.kind
        """,
        {**inventory.params, "since": since},
    )


class FleetCollector:
    """Collects every family at scrape time (prometheus_client's custom collector protocol)."""

    def __init__(self, *, now: datetime | None = None):
        self.now = now or timezone.now()

    def collect(self) -> Iterator[Metric]:
        yield from self._gpus()
        yield self._events()
        yield from self._clusters()

    def _gpus(self) -> Iterator[Metric]:
        families = {
            column: (GaugeMetricFamily(PREFIX + name, text, labels=GPU_LABELS), factor)
            for name, text, column, factor in GPU_FIGURES
        }
        ecc = GaugeMetricFamily(
            PREFIX + "gpu_ecc_errors",
            "Volatile ECC error counts, since the driver loaded.",
            labels=(*GPU_LABELS, "type"),
        )
        seen = GaugeMetricFamily(
            PREFIX + "gpu_last_seen_timestamp_seconds", "When the figures were read.", labels=GPU_LABELS
        )
        fresh = selectors.fresh_since(self.now)
        for row in _gpu_rows():
            cluster, node, index, uuid, model, slot, profile, at, *figures = row
            corrected, uncorrected, tenant, project, pool = figures[6:]
            labels = [
                cluster,
                node,
                str(index),
                uuid,
                model,
                WHOLE.profile if slot == WHOLE_GPU else (profile or "unknown"),
                "" if slot == WHOLE_GPU else str(slot),
                tenant,
                project,
                "" if pool is None else str(pool),
            ]
            seen.add_metric(labels, at.timestamp())
            if at < fresh:
                continue
            for (family, factor), value in zip(families.values(), figures[:6], strict=True):
                if value is not None:
                    family.add_metric(labels, float(value) * factor)
            for kind, value in (("corrected", corrected), ("uncorrected", uncorrected)):
                if value is not None:
                    ecc.add_metric([*labels, kind], float(value))
        yield from (family for family, _factor in families.values())
        yield ecc
        yield seen

    def _events(self) -> Metric:
        family = GaugeMetricFamily(
            PREFIX + "gpu_events_24h",
            "GPU events (xid, ecc, lost, layout) in the last 24 hours.",
            labels=("cluster", "node", "gpu", "uuid", "model", "kind"),
        )
        for cluster, node, index, uuid, model, kind, count in _event_rows(self.now - WINDOW):
            family.add_metric([cluster, node, str(index), uuid, model, kind], count)
        return family

    def _clusters(self) -> Iterator[Metric]:
        gpus = GaugeMetricFamily(
            PREFIX + "cluster_gpus", "Present GPUs, and those with fresh figures.", labels=("cluster", "kind")
        )
        compute = GaugeMetricFamily(
            PREFIX + "cluster_compute_slices",
            "Compute slices: in all, allocated, allocated with SM activity known, and used (weighted by it).",
            labels=("cluster", "kind"),
        )
        for usage in selectors.cluster_usage(now=self.now):
            gpus.add_metric([usage.name, "present"], usage.gpus)
            gpus.add_metric([usage.name, "reporting"], usage.reporting)
            for kind in ("total", "allocated", "measured", "used"):
                value = usage.compute_total if kind == "total" else getattr(usage, kind)
                compute.add_metric([usage.name, kind], value)
        yield gpus
        yield compute
