"""The fleet's figures on /metrics (`collect`, served by portal/metrics.py through monitoring's plugin), for
a Prometheus that scrapes the portal (monitoring/grafana/gpu-portal.json draws them).

The portal says what only it knows: who holds what and how busy it is, per cluster, tenant and pool. Every
GPU's own series belong to dcgm-exporter's scrape, which Prometheus reads apart; the portal exports a GPU
one by one only while it is in trouble (an open fault or a firing alert), so that a scrape stays small and
quick whatever the fleet's size. The words are monitoring.selectors' (fresh, allocated, measured, used);
figures older than FRESH are left out, so that a silent GPU never looks steady.

Families (gauges):
- per cluster, the fleet page's own figures (monitoring/selectors/fleet.py: fleet_usage, which the page's
  cluster_usage reads): gpu_portal_cluster_gpus{cluster, kind=present|reporting},
  gpu_portal_cluster_compute_slices{cluster, kind=total|allocated|measured|used}, _power_watts,
  _memory_used_bytes, _memory_total_bytes, _utilisation_ratio (averaged over its GPUs that give it),
  _temperature_max_celsius; and gpu_portal_cluster_gpu_faults_open and
  gpu_portal_cluster_gpu_events_24h{cluster, kind=xid|ecc|lost|layout}.
- gpu_portal_alerts_firing{severity}: open alerts of any subject.
- gpu_portal_monitoring_batches_waiting: agents' batches taken and not yet stored
  (monitoring.ingest.accepted), read from Redis.
- per tenant holding live allocations, its pools' figures added up: gpu_portal_tenant_pools,
  gpu_portal_tenant_units{tenant, kind=held|reporting} (GPUs and instances),
  gpu_portal_tenant_compute_slices{tenant, kind=allocated|measured|used}, _memory_used_bytes,
  _memory_total_bytes.
- per pool holding live allocations (fleet_usage's part of its cluster), labelled pool (its id) alone, so
  that a pool costs four short lines: gpu_portal_pool_info{pool, cluster, tenant, project} (always 1: join
  on pool for its names), gpu_portal_pool_compute_slices (allocated), gpu_portal_pool_sm_active_ratio
  (averaged over its GPUs and instances, as its chart is), gpu_portal_pool_memory_used_bytes.
- per GPU in trouble and each of its MIG instances, labelled cluster, node, gpu (index), uuid (the GPU's,
  as dcgm-exporter's UUID), profile ("full" for the whole GPU, else the MIG profile), mig_start (the
  instance's first memory slice; empty for the whole GPU) and pool (empty when unallocated):
  gpu_portal_gpu_power_watts, _temperature_celsius, _utilisation_ratio, _sm_active_ratio,
  _memory_used_bytes, _memory_total_bytes, _ecc_errors{type=corrected|uncorrected} (volatile counts, since
  the driver loaded), and gpu_portal_gpu_last_seen_timestamp_seconds (there even when stale); why it is in
  trouble, with its model: gpu_portal_gpu_fault_open{cluster, node, gpu, uuid, model, kind} and
  gpu_portal_gpu_alerts_firing{cluster, node, gpu, uuid, model, severity}.

Six queries and one question to Redis in all, whatever the fleet's size: one pass over the newest figures
(fleet_usage), the rest read by ids or over what is in trouble; where the GPUs are and who holds them come
from pools' own relations (pools/selectors/monitoring.py).
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from datetime import datetime

import redis
from django.utils import timezone
from prometheus_client.core import GaugeMetricFamily, Metric

from monitoring import selectors
from monitoring.ingest import accepted
from monitoring.models import GpuEvent
from monitoring.models.alerts import Severity
from monitoring.models.samples import WHOLE_GPU
from monitoring.selectors import metrics as figures
from monitoring.selectors.fleet import ClusterUsage, PoolUsage, fleet_usage
from pools.kinds import WHOLE

log = logging.getLogger(__name__)

PREFIX = "gpu_portal_"
GPU_LABELS = ("cluster", "node", "gpu", "uuid", "profile", "mig_start", "pool")
WHERE_LABELS = ("cluster", "node", "gpu", "uuid", "model")
# (family, help, from a percentage: a ratio), in the order of troubled_figures' columns from power_w on
GPU_FIGURES = (
    ("gpu_power_watts", "Power drawn, in watts.", False),
    ("gpu_temperature_celsius", "GPU temperature, in degrees Celsius.", False),
    ("gpu_utilisation_ratio", "Share of time a kernel was running (0-1).", True),
    ("gpu_sm_active_ratio", "Share of time the streaming multiprocessors had work (0-1).", True),
    ("gpu_memory_used_bytes", "Memory in use, in bytes.", False),
    ("gpu_memory_total_bytes", "Memory in all, in bytes.", False),
)
IN_TROUBLE = " Only GPUs with an open fault or a firing alert: dcgm-exporter has every GPU's."
COMPUTE_KINDS = ("allocated", "measured", "used")


def collect() -> Iterator[Metric]:
    """Every family, read now (the plugin's `metrics` entry)."""
    return FleetCollector().collect()


def _gauge(name: str, text: str, labels: tuple[str, ...] = ()) -> GaugeMetricFamily:
    return GaugeMetricFamily(PREFIX + name, text, labels=labels)


def _ratio(pct: float) -> float:
    """A percentage as a ratio, to four decimals: no more than the figures' own precision."""
    return round(float(pct) / 100, 4)


def _slices(value: float) -> float:
    return round(float(value), 3)


class FleetCollector:
    """Collects every family at scrape time (prometheus_client's custom collector protocol)."""

    def __init__(self, *, now: datetime | None = None):
        self.now = now or timezone.now()

    def collect(self) -> Iterator[Metric]:
        usage = fleet_usage(now=self.now)
        yield from self._clusters(usage.clusters)
        yield self._alerts()
        names = figures.pool_names(pool.pool_id for pool in usage.pools)
        yield from self._tenants(figures.tenant_figures(usage.pools, names))
        yield from self._pools(usage.pools, names)
        yield from self._gpus()
        yield from self._troubles()
        yield from self._waiting()

    # --- agents' batches ---------------------------------------------------------------------------

    def _waiting(self) -> Iterator[Metric]:
        """The batches taken and not yet stored; left out when Redis does not answer (/readyz says so)."""
        try:
            waiting = accepted.waiting()
        except (redis.RedisError, OSError) as error:
            log.warning("Left out the agents' batches waiting: Redis did not answer (%s)", error)
            return
        family = _gauge("monitoring_batches_waiting", "Agents' batches taken and waiting to be stored.")
        family.add_metric([], waiting)
        yield family

    # --- per cluster -------------------------------------------------------------------------------

    def _clusters(self, usage: list[ClusterUsage]) -> Iterator[Metric]:
        label = ("cluster",)
        gpus = _gauge("cluster_gpus", "Present GPUs, and those with fresh figures.", ("cluster", "kind"))
        compute = _gauge(
            "cluster_compute_slices",
            "Compute slices: in all, allocated, allocated with SM activity known, and used (weighted by it).",
            ("cluster", "kind"),
        )
        power = _gauge("cluster_power_watts", "Power drawn by the GPUs with fresh figures.", label)
        used = _gauge("cluster_memory_used_bytes", "Memory in use on the GPUs with fresh figures.", label)
        total = _gauge("cluster_memory_total_bytes", "Memory of the GPUs with fresh figures.", label)
        utilisation = _gauge(
            "cluster_utilisation_ratio",
            "Share of time a kernel was running (0-1), averaged over the GPUs with fresh figures that give "
            "it (a MIG-cut GPU gives none).",
            label,
        )
        hottest = _gauge(
            "cluster_temperature_max_celsius",
            "The hottest GPU's temperature, of those with fresh figures.",
            label,
        )
        for row in usage:
            gpus.add_metric([row.name, "present"], row.gpus)
            gpus.add_metric([row.name, "reporting"], row.reporting)
            compute.add_metric([row.name, "total"], row.compute_total)
            for kind in COMPUTE_KINDS:
                compute.add_metric([row.name, kind], _slices(getattr(row, kind)))
            power.add_metric([row.name], row.power_w)
            used.add_metric([row.name], row.memory_used_bytes)
            total.add_metric([row.name], row.memory_total_bytes)
            if row.utilisation_pct is not None:
                utilisation.add_metric([row.name], _ratio(row.utilisation_pct))
            if row.temperature_max_c is not None:
                hottest.add_metric([row.name], row.temperature_max_c)
        yield from (gpus, compute, power, used, total, utilisation, hottest)
        yield from self._cluster_troubles([row.name for row in usage])

    def _cluster_troubles(self, clusters: list[str]) -> Iterator[Metric]:
        faults = _gauge(
            "cluster_gpu_faults_open", "GPUs with an open fault (drained until cleared).", ("cluster",)
        )
        events = _gauge(
            "cluster_gpu_events_24h",
            "GPU events (xid, ecc, lost, layout) in the last 24 hours.",
            ("cluster", "kind"),
        )
        counted = {(cluster, what): n for cluster, what, n in figures.cluster_troubles(now=self.now)}
        for cluster in clusters:
            faults.add_metric([cluster], counted.get((cluster, "fault"), 0))
            for kind in GpuEvent.Kind.values:
                events.add_metric([cluster, kind], counted.get((cluster, kind), 0))
        yield from (faults, events)

    def _alerts(self) -> Metric:
        family = _gauge("alerts_firing", "Open alerts (acknowledged or not), of any subject.", ("severity",))
        counts = figures.firing_alerts()
        for severity in Severity.values:
            family.add_metric([severity], counts.get(severity, 0))
        return family

    # --- per tenant and per pool -------------------------------------------------------------------

    def _tenants(self, found: list[figures.TenantFigures]) -> Iterator[Metric]:
        label = ("tenant",)
        pools = _gauge("tenant_pools", "Pools holding GPUs or instances now.", label)
        units = _gauge(
            "tenant_units",
            "GPUs and instances held, and those of them with fresh figures.",
            ("tenant", "kind"),
        )
        compute = _gauge(
            "tenant_compute_slices",
            "Compute slices held: allocated, with SM activity known, and used (weighted by it).",
            ("tenant", "kind"),
        )
        used = _gauge("tenant_memory_used_bytes", "Memory in use on what the tenant holds.", label)
        total = _gauge(
            "tenant_memory_total_bytes", "Memory of what the tenant holds, with fresh figures.", label
        )
        for row in found:
            pools.add_metric([row.tenant], row.pools)
            units.add_metric([row.tenant, "held"], row.units)
            units.add_metric([row.tenant, "reporting"], row.reporting)
            for kind in COMPUTE_KINDS:
                compute.add_metric([row.tenant, kind], _slices(getattr(row, kind)))
            if row.memory_used_bytes is not None:
                used.add_metric([row.tenant], row.memory_used_bytes)
            if row.memory_total_bytes is not None:
                total.add_metric([row.tenant], row.memory_total_bytes)
        yield from (pools, units, compute, used, total)

    def _pools(self, held: list[PoolUsage], names: dict[int, figures.PoolNames]) -> Iterator[Metric]:
        label = ("pool",)
        info = _gauge(
            "pool_info",
            "Where each pool is and whose it is (always 1: join on pool).",
            ("pool", "cluster", "tenant", "project"),
        )
        compute = _gauge("pool_compute_slices", "Compute slices the pool holds.", label)
        sm_active = _gauge(
            "pool_sm_active_ratio",
            "Share of time the streaming multiprocessors had work (0-1), averaged over the pool's GPUs and "
            "instances with fresh figures.",
            label,
        )
        used = _gauge("pool_memory_used_bytes", "Memory in use on the pool's GPUs and instances.", label)
        for row in held:
            pool, named = str(row.pool_id), names[row.pool_id]
            info.add_metric([pool, named.cluster, named.tenant, named.project], 1)
            compute.add_metric([pool], _slices(row.allocated))
            if row.sm_active_pct is not None:
                sm_active.add_metric([pool], _ratio(row.sm_active_pct))
            if row.memory_used_bytes is not None:
                used.add_metric([pool], row.memory_used_bytes)
        yield from (info, compute, sm_active, used)

    # --- the GPUs in trouble -----------------------------------------------------------------------

    def _gpus(self) -> Iterator[Metric]:
        families = [(_gauge(name, text + IN_TROUBLE, GPU_LABELS), ratio) for name, text, ratio in GPU_FIGURES]
        ecc = _gauge(
            "gpu_ecc_errors",
            "Volatile ECC error counts, since the driver loaded." + IN_TROUBLE,
            (*GPU_LABELS, "type"),
        )
        seen = _gauge(
            "gpu_last_seen_timestamp_seconds", "When the figures were read." + IN_TROUBLE, GPU_LABELS
        )
        fresh = selectors.fresh_since(self.now)
        for row in figures.troubled_figures():
            cluster, node, index, uuid, slot, profile, at, *measured, corrected, uncorrected, pool = row
            labels = [
                cluster,
                node,
                str(index),
                uuid,
                WHOLE.profile if slot == WHOLE_GPU else (profile or "unknown"),
                "" if slot == WHOLE_GPU else str(slot),
                "" if pool is None else str(pool),
            ]
            seen.add_metric(labels, at.timestamp())
            if at < fresh:
                continue
            for (family, ratio), value in zip(families, measured, strict=True):
                if value is not None:
                    family.add_metric(labels, _ratio(value) if ratio else float(value))
            for kind, value in (("corrected", corrected), ("uncorrected", uncorrected)):
                if value is not None:
                    ecc.add_metric([*labels, kind], float(value))
        yield from (family for family, _is_ratio in families)
        yield ecc
        yield seen

    def _troubles(self) -> Iterator[Metric]:
        faults = _gauge(
            "gpu_fault_open",
            "A GPU's open fault, by the kind of event that opened it (always 1).",
            (*WHERE_LABELS, "kind"),
        )
        alerts = _gauge(
            "gpu_alerts_firing", "Open alerts about a GPU or its instances.", (*WHERE_LABELS, "severity")
        )
        for cluster, node, index, uuid, model, why, what, count in figures.troubles():
            family = faults if why == "fault" else alerts
            family.add_metric([cluster, node, str(index), uuid, model, what], count)
        yield faults
        yield alerts
