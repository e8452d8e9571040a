"""Celery tasks of the pools app: thin, idempotent wrappers over sync and services."""

from __future__ import annotations

from celery import shared_task
from django.conf import settings

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
        report = sync_cluster(cluster=cluster)
    if report.changed:  # capacity may have appeared: the queue may admit more now
        admit_waiting_requests.delay()
    return report.summary()


@shared_task
def admit_waiting_requests() -> str:
    """Run the queue: after approvals, and periodically (capacity may have freed up)."""
    results = admit_waiting()
    admitted = sum(r.admitted for r in results)
    return f"{admitted} admitted, {len(results) - admitted} waiting"


@shared_task(bind=True, max_retries=None)
def provision_pool(self, pool_id: int) -> str:
    """Repeat provisioning steps until the pool is active or failed; an unreachable cluster is retried
    with back-off, and after SYNC_BACKOFF_MAX_SECONDS of it the pool fails."""
    from pools.drivers.base import ClusterUnreachable
    from pools.services.provisioning import WAITING, fail_pool, provision_step

    try:
        outcome = provision_step(pool_id=pool_id)
    except ClusterUnreachable as error:
        delay = min(settings.PROVISION_POLL_SECONDS * 2**self.request.retries, 300)
        if self.request.retries * settings.PROVISION_POLL_SECONDS > settings.SYNC_BACKOFF_MAX_SECONDS:
            fail_pool(pool_id=pool_id, reason=str(error))
            return "failed"
        raise self.retry(countdown=delay) from error
    if outcome == WAITING:
        raise self.retry(countdown=settings.PROVISION_POLL_SECONDS)
    return outcome


@shared_task(bind=True, max_retries=20)
def finish_pool_release(self, pool_id: int) -> str:
    from pools.drivers.base import DriverError
    from pools.services.provisioning import finish_release

    try:
        pool = finish_release(pool_id=pool_id)
        return pool.state if pool else "gone"
    except DriverError as error:
        raise self.retry(countdown=min(5 * 2**self.request.retries, 600)) from error


@shared_task(autoretry_for=(OSError,), retry_backoff=True, retry_backoff_max=600, max_retries=8)
def send_event_email(event_id: int) -> str:
    from pools.notifications import send_event_email as send

    return send(event_id)
