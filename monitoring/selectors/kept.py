"""Figures of the whole fleet, or of a wide part of it, that the pages show, kept a short while for every
process: allocated against used per cluster (and within a capacity page's scope), the hottest and idlest,
each tenant's efficiency over a range, and the order of the fleet page's GPU table (`gpus.GpuTable`).

Working one out reads every GPU's newest figures and every live allocation: seconds at a hundred thousand
GPUs, far too much for each view of a page. The first process that needs a figure works it out with the
selector that says it (monitoring.selectors) and leaves it in the shared cache for
MONITORING_FIGURES_SECONDS; every view meanwhile, in any process, reads it back. The figures themselves are
readings of the last minutes (fresh: FRESH), which agents and collection renew every quarter minute or so:
kept a few seconds more, they still say what the fleet reads now, and the page says when they were worked
out (`Kept.at`).
"""

from __future__ import annotations

from collections.abc import Callable, Hashable
from dataclasses import dataclass
from datetime import datetime
from typing import Generic, TypeVar

from django.core.cache import cache
from django.utils import timezone

from monitoring.conf import settings
from monitoring.models import Latest
from monitoring.selectors.capacity import ScopeUsage, scope_usage
from monitoring.selectors.fleet import (
    ClusterUsage,
    Idle,
    TenantEfficiency,
    cluster_usage,
    hottest,
    idlest,
    tenant_efficiency,
)
from portal.shared_cache import read_back
from portal.shell import CapacityScope

T = TypeVar("T")


@dataclass(frozen=True)
class Kept(Generic[T]):
    """A figure and when it was worked out."""

    value: T
    at: datetime


def kept(name: str, key: tuple[Hashable, ...], work_out: Callable[[datetime], T]) -> Kept[T]:
    """`work_out(now)`'s figure, read back from the shared cache while it is younger than
    MONITORING_FIGURES_SECONDS, else worked out now and left there for the others."""
    keep = settings.MONITORING_FIGURES_SECONDS
    address = "monitoring:kept:" + ":".join(str(part) for part in (name, *key))
    if keep > 0:
        found = read_back(address)
        if found is not None:
            return found
    now = timezone.now()
    found = Kept(work_out(now), now)
    if keep > 0:
        cache.set(address, found, timeout=keep)
    return found


def kept_cluster_usage() -> Kept[list[ClusterUsage]]:
    """`cluster_usage` of the whole fleet: the fleet page's clusters."""
    return kept("clusters", (), lambda now: cluster_usage(now=now))


def kept_scope_usage(*, scope: CapacityScope) -> Kept[ScopeUsage]:
    """`scope_usage` of a capacity page's scope (the fleet, a cluster, a GPU group, a node)."""
    key = (scope.cluster_id, scope.group_id, scope.ungrouped, scope.node_id)
    return kept("scope", key, lambda now: scope_usage(scope=scope, now=now))


def kept_hottest() -> Kept[list[Latest]]:
    return kept("hottest", (), lambda now: hottest(now=now))


def kept_idlest() -> Kept[list[Idle]]:
    return kept("idlest", (), lambda now: idlest(now=now))


def kept_tenant_efficiency(
    *, range_name: str, span: Callable[[datetime], tuple[datetime, datetime]]
) -> Kept[list[TenantEfficiency]]:
    """`tenant_efficiency` over the range of that name, `span(now)` its start and end."""

    def work_out(now: datetime) -> list[TenantEfficiency]:
        start, end = span(now)
        return tenant_efficiency(start=start, end=end, now=now)

    return kept("tenants", (range_name,), work_out)
