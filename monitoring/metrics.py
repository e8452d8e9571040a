"""/metrics: the fleet's newest figures and the portal's own, in the Prometheus text format, for a
Prometheus that scrapes the portal (monitoring/grafana/gpu-portal.json draws them).

Who may read it: a request bearing `Authorization: Bearer <METRICS_TOKEN>` (when the setting is set), or,
while no proxy is trusted (TRUSTED_PROXY_COUNT 0), one from an address in METRICS_ALLOWED_NETWORKS; anyone
else gets a plain 403. Behind a proxy the address is never believed: every client of an ingress controller
arrives from the cluster's own network (and the portal refuses to start without a token there:
portal/startup.py). Where: with METRICS_PORT, only on that port, which the deployment's web Service and
Ingress never reach (portal/telemetry.py); the public port answers 404.

Families (gauges unless said otherwise):
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
- gpu_portal_requests_waiting{state=approved|queued}, gpu_portal_requests_waiting_oldest_seconds.
- gpu_portal_pools{state}.
- gpu_portal_pool_provisioning_seconds{outcome=active|failed} (summary): from reservation to active or
  failed; quantiles over the last 24 hours, count and sum since the portal began.
- gpu_portal_metering_lag_seconds: billing's own figure (billing.services.metering_lag).
- gpu_portal_pools_overdue{state=provisioning|releasing, deadline=redrive|stuck} and
  gpu_portal_pools_overdue_oldest_seconds: pools past their deadlines (pools.services.deadlines).

Each family is one query whatever the fleet's size. The portal's processes add theirs (web requests, tasks,
the task queue: portal/telemetry.py).
"""

from __future__ import annotations

import hmac
import ipaddress
import logging
from collections.abc import Iterator
from datetime import datetime, timedelta

from django.conf import settings
from django.db import connection
from django.db.models import Count, Min
from django.http import Http404, HttpRequest, HttpResponse
from django.utils import timezone
from django.views.decorators.gzip import gzip_page
from django.views.decorators.http import require_safe
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.exposition import CONTENT_TYPE_LATEST, generate_latest

from billing.services import metering_lag
from monitoring import selectors
from monitoring.models.samples import WHOLE_GPU
from pools import mig
from pools.models import Pool, PoolRequest, PoolState, RequestState
from pools.services.deadlines import overdue_pools
from portal import telemetry

log = logging.getLogger(__name__)

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
QUANTILES = (0.5, 0.9, 0.99)


# --- who may read it --------------------------------------------------------------------------------


def _bears_token(request: HttpRequest) -> bool:
    token = settings.METRICS_TOKEN
    scheme, _space, given = request.headers.get("Authorization", "").partition(" ")
    if not token or scheme.lower() != "bearer":
        return False
    return hmac.compare_digest(given.strip().encode(), token.encode())


def _from_allowed_network(request: HttpRequest) -> bool:
    try:
        address = ipaddress.ip_address(request.META.get("REMOTE_ADDR", ""))
    except ValueError:
        return False
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped:
        address = address.ipv4_mapped
    for entry in settings.METRICS_ALLOWED_NETWORKS:
        try:
            network = ipaddress.ip_network(entry.strip(), strict=False)
        except ValueError:
            log.warning("METRICS_ALLOWED_NETWORKS: %r is not a network; ignored", entry)
            continue
        if address.version == network.version and address in network:
            return True
    return False


def may_read(request: HttpRequest) -> bool:
    if _bears_token(request):
        return True
    return settings.TRUSTED_PROXY_COUNT == 0 and _from_allowed_network(request)


# --- the figures --------------------------------------------------------------------------------------


def _rows(sql: str, params: dict) -> list[tuple]:
    with connection.cursor() as cursor:
        cursor.execute(sql, params)
        return cursor.fetchall()


_GPU_SQL = f"""
    SELECT c.name, n.name, g.index, g.uuid, g.model, l.slot, l.profile, l.at,
           l.power_w, l.temperature_c, l.utilisation_pct, l.sm_active_pct,
           l.memory_used_bytes, l.memory_total_bytes, l.ecc_corrected, l.ecc_uncorrected,
           COALESCE(t.slug, ''), COALESCE(pr.slug, ''), p.id
    FROM monitoring_latest l
    JOIN pools_gpucapacity g ON g.id = l.gpu_id
    JOIN pools_nodecapacity n ON n.id = g.node_id
    JOIN pools_cluster c ON c.id = n.cluster_id
    LEFT JOIN pools_allocation a ON a.gpu_id = l.gpu_id AND a.released_at IS NULL
         AND l.slot = CASE WHEN a.profile = '{mig.FULL_GPU}' THEN {WHOLE_GPU} ELSE lower(a.slices) END
    LEFT JOIN pools_pool p ON p.id = a.pool_id
    LEFT JOIN portal_project pr ON pr.id = p.project_id
    LEFT JOIN portal_tenant t ON t.id = pr.tenant_id
    WHERE g.present AND n.present
    ORDER BY c.name, n.name, g.index, l.slot
"""

_EVENTS_SQL = """
    SELECT c.name, n.name, g.index, g.uuid, g.model, e.kind, count(*)
    FROM monitoring_gpuevent e
    JOIN pools_gpucapacity g ON g.id = e.gpu_id
    JOIN pools_nodecapacity n ON n.id = g.node_id
    JOIN pools_cluster c ON c.id = n.cluster_id
    WHERE e.at >= %(since)s
    GROUP BY c.name, n.name, g.index, g.uuid, g.model, e.kind
    ORDER BY c.name, n.name, g.index, e.kind
"""

_PROVISIONING_SQL = f"""
    SELECT e.to_state, count(*), COALESCE(sum(d.seconds), 0)::float8,
           percentile_cont(%(quantiles)s::float8[]) WITHIN GROUP (ORDER BY d.seconds)
               FILTER (WHERE e.at >= %(since)s)
    FROM pools_poolevent e
    JOIN pools_pool p ON p.id = e.pool_id
    CROSS JOIN LATERAL (SELECT GREATEST(extract(epoch FROM e.at - p.reserved_at), 0)::float8 AS seconds) d
    WHERE e.from_state = '{PoolState.PROVISIONING.value}'
      AND e.to_state IN ('{PoolState.ACTIVE.value}', '{PoolState.FAILED.value}')
    GROUP BY e.to_state
"""


class PortalCollector:
    """Collects every family at scrape time (prometheus_client's custom collector protocol)."""

    def __init__(self, *, now: datetime | None = None):
        self.now = now or timezone.now()

    def collect(self) -> Iterator[Metric]:
        yield from self._gpus()
        yield self._events()
        yield from self._clusters()
        yield from self._requests()
        yield self._pools()
        yield self._provisioning()
        yield GaugeMetricFamily(
            PREFIX + "metering_lag_seconds",
            "How long the oldest period that could be metered has waited beyond the metering delay.",
            value=metering_lag(now=self.now).total_seconds(),
        )
        yield from self._overdue()

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
        for row in _rows(_GPU_SQL, {}):
            cluster, node, index, uuid, model, slot, profile, at, *figures = row
            corrected, uncorrected, tenant, project, pool = figures[6:]
            labels = [
                cluster,
                node,
                str(index),
                uuid,
                model,
                mig.FULL_GPU if slot == WHOLE_GPU else (profile or "unknown"),
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
        for cluster, node, index, uuid, model, kind, count in _rows(
            _EVENTS_SQL, {"since": self.now - WINDOW}
        ):
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

    def _requests(self) -> Iterator[Metric]:
        waiting = PoolRequest.objects.waiting().order_by()
        counts = dict(waiting.values_list("state").annotate(n=Count("pk")))
        family = GaugeMetricFamily(
            PREFIX + "requests_waiting", "Approved requests not admitted yet.", labels=("state",)
        )
        for state in (RequestState.APPROVED, RequestState.QUEUED):
            family.add_metric([state.value], counts.get(state.value, 0))
        yield family
        oldest = waiting.aggregate(oldest=Min("approved_at"))["oldest"]
        yield GaugeMetricFamily(
            PREFIX + "requests_waiting_oldest_seconds",
            "How long the request waiting longest has waited since its approval (0: none waits).",
            value=max((self.now - oldest).total_seconds(), 0) if oldest else 0,
        )

    def _pools(self) -> Metric:
        counts = dict(Pool.objects.order_by().values_list("state").annotate(n=Count("pk")))
        family = GaugeMetricFamily(PREFIX + "pools", "Pools by state.", labels=("state",))
        for state in PoolState:
            family.add_metric([state.value], counts.get(state.value, 0))
        return family

    def _provisioning(self) -> Metric:
        family = Metric(
            PREFIX + "pool_provisioning_seconds",
            "From a pool's reservation to active or failed: quantiles over the last 24 hours, count and "
            "sum since the portal began.",
            "summary",
        )
        found = {
            row[0]: row[1:]
            for row in _rows(_PROVISIONING_SQL, {"quantiles": list(QUANTILES), "since": self.now - WINDOW})
        }
        for outcome in (PoolState.ACTIVE, PoolState.FAILED):
            count, total, quantiles = found.get(outcome.value, (0, 0.0, None))
            for q, value in zip(QUANTILES, quantiles or [None] * len(QUANTILES), strict=True):
                family.add_sample(
                    family.name,
                    {"outcome": outcome.value, "quantile": str(q)},
                    float("nan") if value is None else value,
                )
            family.add_sample(family.name + "_count", {"outcome": outcome.value}, count)
            family.add_sample(family.name + "_sum", {"outcome": outcome.value}, total)
        return family

    def _overdue(self) -> Iterator[Metric]:
        stuck_at = self.now - timedelta(seconds=settings.POOL_STUCK_SECONDS)
        counts = {
            (state, deadline): 0
            for state in (PoolState.PROVISIONING, PoolState.RELEASING)
            for deadline in ("redrive", "stuck")
        }
        oldest = None
        for pool in overdue_pools(now=self.now):
            counts[(pool.state, "stuck" if pool.since <= stuck_at else "redrive")] += 1
            oldest = pool.since if oldest is None else min(oldest, pool.since)
        family = GaugeMetricFamily(
            PREFIX + "pools_overdue",
            "Pools in provisioning or releasing past their deadline: re-driven by the sweeper (redrive), or "
            "past the point where it ends them (stuck).",
            labels=("state", "deadline"),
        )
        for (state, deadline), count in counts.items():
            family.add_metric([str(state), deadline], count)
        yield family
        yield GaugeMetricFamily(
            PREFIX + "pools_overdue_oldest_seconds",
            "How long the longest-overdue pool has been in its state (0: none).",
            value=(self.now - oldest).total_seconds() if oldest else 0,
        )


@require_safe
@gzip_page  # Prometheus asks for gzip; a big fleet's text shrinks about tenfold
def metrics(request: HttpRequest) -> HttpResponse:
    if not telemetry.serves_metrics(request):
        raise Http404
    if not may_read(request):
        return HttpResponse(
            "Forbidden: send Authorization: Bearer <token>"
            + ("" if settings.TRUSTED_PROXY_COUNT else ", or scrape from an allowed network")
            + ".\n",
            status=403,
            content_type="text/plain; charset=utf-8",
        )
    # The web processes' own figures follow the fleet's (portal/telemetry.py): one scrape for both.
    body = generate_latest(PortalCollector()) + telemetry.latest()
    response = HttpResponse(body, content_type=CONTENT_TYPE_LATEST)
    response["Cache-Control"] = "no-store"
    return response
