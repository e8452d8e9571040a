"""The portal's own collection of GPU figures, cluster by cluster: from the cluster's Prometheus when it
names one (the GPU Operator's dcgm-exporter), else from the simulated collector for a simulated cluster.
Clusters whose nodes run `gpu_agent` push their figures instead and are not collected here.

Every run leaves a CollectorStatus row, so that a Prometheus that fails is seen by operators, not only
logged; what was read goes through `monitoring.ingest.readings`, like an agent's batch.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from datetime import UTC, datetime

from django.db.models import Prefetch

from monitoring.collectors import CollectorUnavailable
from monitoring.collectors.dcgm_prometheus import DcgmPrometheusCollector
from monitoring.collectors.simulated import SimulatedCollector, SimulatedGpu, SimulatedHost, SimulatedInstance
from monitoring.conf import settings
from monitoring.ingest.readings import ingest
from monitoring.models import CollectorStatus
from pools.models import Allocation, Cluster, GpuCapacity, NodeCapacity
from pools.secrets import SecretUnreadable
from portal import outbound

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Collected:
    cluster: str
    source: str
    gpus: int
    samples: int
    error: str = ""


def collectable() -> list[Cluster]:
    """Clusters the portal collects itself: those with a Prometheus URL, and simulated ones."""
    return [
        cluster
        for cluster in Cluster.objects.order_by("name")
        if cluster.prometheus_url or cluster.driver == Cluster.Driver.SIMULATED
    ]


def collector_for(cluster: Cluster, *, now: datetime | None = None, clock=None):
    """The collector of a cluster: its Prometheus when it names one, else the simulated one, reading at
    `now` (or at whatever `clock()` says, for a replay of the past; by default, the time of reading)."""
    if cluster.prometheus_url:
        try:
            url = cluster.prometheus_read_url()  # with its credential, if one is stored
        except SecretUnreadable as error:
            raise CollectorUnavailable(str(error)) from error
        return DcgmPrometheusCollector(
            url, timeout=settings.MONITORING_PROMETHEUS_TIMEOUT_SECONDS, session=outbound.Session()
        )
    return SimulatedCollector(
        hosts=simulated_hosts(cluster),
        busy=busy_instances(cluster),
        clock=clock if now is None else (lambda: now),
        seed=cluster.pk,
        ecc_one_in=settings.MONITORING_SIMULATED_ECC_ONE_IN,
        driver_loaded_at=cluster.created_at,
    )


def simulated_hosts(cluster: Cluster) -> list[SimulatedHost]:
    """The cluster's nodes and GPUs as the portal knows them (the inventory sync mirrors the fleet)."""
    gpus = GpuCapacity.objects.filter(present=True).order_by("index")
    nodes = (
        NodeCapacity.objects.filter(cluster=cluster, present=True)
        .order_by("name")
        .prefetch_related(Prefetch("gpus", queryset=gpus))
    )
    return [
        SimulatedHost(
            node.name,
            tuple(
                SimulatedGpu(
                    gpu.index,
                    gpu.uuid,
                    gpu.model,
                    mig_enabled=gpu.mig_enabled,
                    instances=tuple(
                        SimulatedInstance(entry["profile"], entry["start"], entry.get("uuid", ""))
                        for entry in gpu.layout or []
                    ),
                )
                for gpu in node.gpus.all()
                if gpu.uuid
            ),
        )
        for node in nodes
    ]


def busy_instances(cluster: Cluster) -> dict[tuple[str, int], str]:
    """(GPU UUID, slot) → the pool holding it: slot -1 for a full GPU, else the instance's first slice."""
    live = Allocation.objects.filter(gpu__node__cluster=cluster, released_at__isnull=True).values_list(
        "gpu__uuid", "gpu__mig_enabled", "slices", "pool_id"
    )
    return {
        (uuid, slices.lower if mig_enabled else -1): f"pool-{pool_id}"
        for uuid, mig_enabled, slices, pool_id in live
    }


def read(collector) -> tuple:
    """The collector's readings; an address the portal sends nothing to makes it unavailable."""
    try:
        return collector.readings()
    except outbound.AddressRefused as refused:  # checked at each reading: what a name resolves to may change
        raise CollectorUnavailable(f"Prometheus at {collector.url} is refused: {refused.message}") from None


def collect(cluster: Cluster, *, now: datetime | None = None) -> Collected:
    """Read the cluster once and store what was read; a failure is recorded on its CollectorStatus."""
    now_ = now or datetime.now(UTC)
    source = "dcgm" if cluster.prometheus_url else "simulated"
    status = CollectorStatus.objects.filter(cluster=cluster).first() or CollectorStatus(cluster=cluster)
    status.source, status.last_run_at = source, now_
    collector = None
    try:
        collector = collector_for(cluster, now=now)
        readings = read(collector)
        result = ingest(cluster=cluster, readings=readings, source=source, strict=False, now=now_)
    except CollectorUnavailable as error:
        log.warning("collecting %s: %s", cluster.name, error)
        status.last_error = str(error)
        status.save()
        return Collected(cluster.name, source, 0, 0, f"{cluster.name}: {error}")
    finally:
        if collector is not None:
            collector.close()
    status.last_success_at, status.last_error = now_, ""
    status.problems = [*(p for r in readings for p in r.problems), *result.problems][:50]
    status.gpus = result.gpus
    status.save()
    return Collected(cluster.name, source, result.gpus, result.samples)
