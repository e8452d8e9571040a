"""Celery tasks of the pools app: thin, idempotent wrappers over sync and services."""

from __future__ import annotations

from celery import shared_task

from pools.models import Cluster
from pools.services.queue import admit_waiting
from pools.sync import clusters_due, sync_cluster, sync_lock


@shared_task
def sync_all_clusters() -> int:
    """Beat: queue a sync of every cluster whose back-off has run out."""
    due = clusters_due()
    for cluster in due:
        sync_cluster_now.delay(cluster.pk)
    return len(due)


@shared_task
def sync_cluster_now(cluster_id: int) -> str:
    with sync_lock(cluster_id) as held:
        if not held:
            return "another sync of this cluster is running"
        cluster = Cluster.objects.filter(pk=cluster_id).first()
        if cluster is None:
            return "cluster removed"
        return sync_cluster(cluster=cluster).summary()


@shared_task
def admit_waiting_requests() -> str:
    """Run the queue: after approvals, and periodically (capacity may have freed up)."""
    results = admit_waiting()
    admitted = sum(r.admitted for r in results)
    return f"{admitted} admitted, {len(results) - admitted} waiting"
