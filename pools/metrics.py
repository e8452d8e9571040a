"""Pools' figures on /metrics (`collect`, served by portal/metrics.py through pools' plugin).

Families (gauges unless said otherwise):
- gpu_portal_requests_waiting{state=approved|queued}, gpu_portal_requests_waiting_oldest_seconds: approved
  requests not admitted yet, and how long the oldest has waited since its approval.
- gpu_portal_pools{state}.
- gpu_portal_pool_provisioning_seconds{outcome=active|failed} (summary): from reservation to active or
  failed; quantiles over the last 24 hours, count and sum since the portal began.
- gpu_portal_pools_overdue{state=provisioning|releasing, deadline=redrive|stuck} and
  gpu_portal_pools_overdue_oldest_seconds: pools past their deadlines (pools.services.deadlines).

Each family is one query whatever the number of pools.
"""

from __future__ import annotations

from collections.abc import Iterator
from datetime import datetime, timedelta

from django.db import connection
from django.db.models import Count, Min
from django.utils import timezone
from prometheus_client.core import GaugeMetricFamily, Metric

from pools.conf import settings
from pools.models import Pool, PoolRequest, PoolState, RequestState
from pools.services.deadlines import overdue_pools

PREFIX = "gpu_portal_"
WINDOW = timedelta(hours=24)
QUANTILES = (0.5, 0.9, 0.99)

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


def collect() -> Iterator[Metric]:
    """Every family, read now (the plugin's `metrics` entry)."""
    return PoolsCollector().collect()


class PoolsCollector:
    """Collects every family at scrape time (prometheus_client's custom collector protocol)."""

    def __init__(self, *, now: datetime | None = None):
        self.now = now or timezone.now()

    def collect(self) -> Iterator[Metric]:
        yield from self._requests()
        yield self._pools()
        yield self._provisioning()
        yield from self._overdue()

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
        with connection.cursor() as cursor:
            cursor.execute(_PROVISIONING_SQL, {"quantiles": list(QUANTILES), "since": self.now - WINDOW})
            found = {row[0]: row[1:] for row in cursor.fetchall()}
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
