"""What monitoring knows of the GPUs on an operator's capacity page (a `portal.shell.CapacityScope`): the
alerts firing there, compute slices allocated against used (the fleet page's `cluster_usage`, kept to the
scope), and the newest figures of each GPU drawn."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from django.db.models import Q, QuerySet

from monitoring.models import Alert, Latest
from monitoring.models.samples import WHOLE_GPU
from monitoring.selectors.alerts import SUBJECT_ROWS
from monitoring.selectors.fleet import ClusterUsage, FleetTotals, cluster_usage, fleet_totals, fresh_since
from pools.models import GpuCapacity
from portal.shell import CapacityScope


def _where(scope: CapacityScope) -> Q:
    """Alerts about a GPU or a node within the scope; at cluster level also its agents' and pools'."""
    if scope.node_id is not None:
        return Q(gpu__node_id=scope.node_id) | Q(node_id=scope.node_id)
    if scope.group_id is not None:
        return Q(gpu__node__group_id=scope.group_id) | Q(node__group_id=scope.group_id)
    if scope.cluster_id is None:
        return Q()
    if scope.ungrouped:
        return Q(gpu__node__cluster_id=scope.cluster_id, gpu__node__group__isnull=True) | Q(
            node__cluster_id=scope.cluster_id, node__group__isnull=True
        )
    return (
        Q(gpu__node__cluster_id=scope.cluster_id)
        | Q(node__cluster_id=scope.cluster_id)
        | Q(agent_token__cluster_id=scope.cluster_id)
        | Q(pool__cluster_id=scope.cluster_id)
    )


def firing_alerts(*, scope: CapacityScope) -> QuerySet[Alert]:
    """The alerts open (not resolved) within the scope, the gravest and newest first, to be paged."""
    return (
        Alert.objects.open()
        .filter(_where(scope))
        .select_related(*SUBJECT_ROWS)
        .order_by("severity", "-fired_at", "-pk")  # "critical" sorts before "warning"
    )


@dataclass(frozen=True)
class ScopeUsage:
    """Compute slices allocated against used: per cluster in the scope, and all of them added up."""

    clusters: list[ClusterUsage]
    totals: FleetTotals


def scope_usage(*, scope: CapacityScope, now: datetime | None = None) -> ScopeUsage:
    clusters = cluster_usage(
        now=now,
        cluster_id=scope.cluster_id,
        group_id=scope.group_id,
        ungrouped=scope.ungrouped,
        node_id=scope.node_id,
    )
    return ScopeUsage(clusters, fleet_totals(clusters))


@dataclass(frozen=True)
class GpuFigures:
    gpu: GpuCapacity
    latest: Latest | None  # None: never heard from
    fresh: bool


def gpu_figures(*, gpu_ids: list[int], now: datetime | None = None) -> list[GpuFigures]:
    """These GPUs by node and index, each with its newest whole-GPU figures and whether they are fresh,
    in two queries."""
    fresh = fresh_since(now)
    latest = {row.gpu_id: row for row in Latest.objects.filter(gpu_id__in=gpu_ids, slot=WHOLE_GPU)}
    gpus = GpuCapacity.objects.filter(pk__in=gpu_ids).order_by("node_id", "index")
    return [
        GpuFigures(gpu, found, found is not None and found.at >= fresh)
        for gpu in gpus
        for found in [latest.get(gpu.pk)]
    ]
