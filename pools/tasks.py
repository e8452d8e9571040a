"""Celery tasks of the pools app: thin, idempotent wrappers over its services. Services send them by name
(pools/task_names.py) through `portal.dispatch`; beat's schedule and their queues are in the app's plugin."""

from __future__ import annotations

from celery import shared_task

from pools.conf import settings
from pools.models import Cluster
from pools.notifications import send_event_email as send_email
from pools.services.deadlines import release_reclaimed
from pools.services.deadlines import sweep_stuck_pools as sweep
from pools.services.inventory import sync_due_clusters, sync_inventory
from pools.services.provisioning import (
    RELEASE_RETRIED,
    TRANSIENT,
    WAITING,
    finish_release,
    provision_step,
)
from pools.services.queue import admit_waiting
from pools.services.replacement import settle_move
from pools.whatif.runs import execute_whatif_run as execute_run


@shared_task
def sync_all_clusters() -> int:
    """Beat: queue a sync of every cluster whose back-off has run out, each watching for a while."""
    return sync_due_clusters()


@shared_task
def sync_cluster_now(cluster_id: int, watch_seconds: float = 0) -> str:
    """Catch up with the cluster, then go on watching it for `watch_seconds`: bounded, never for ever."""
    cluster = Cluster.objects.filter(pk=cluster_id).first()
    if cluster is None:
        return "cluster removed"
    report = sync_inventory(
        cluster=cluster, watch_seconds=min(watch_seconds, settings.CAPACITY_WATCH_SECONDS)
    )
    return report.summary() if report else "another sync of this cluster is running"


@shared_task
def admit_waiting_requests() -> str:
    """Run the queue: after approvals, and periodically (capacity may have freed up)."""
    results = admit_waiting()
    admitted = sum(r.admitted for r in results)
    return f"{admitted} admitted, {len(results) - admitted} waiting"


def _drive(task, step) -> str:
    """Run `step(last_try=…)` again until it is done: polled while it waits (a MIG change), a transient
    error (cluster or database not answering) retried with back-off; after SYNC_BACKOFF_MAX_SECONDS of
    retries the step's last try gives up (the service decides what that means)."""
    retries = task.request.retries
    last_try = retries * settings.PROVISION_POLL_SECONDS > settings.SYNC_BACKOFF_MAX_SECONDS
    try:
        outcome = step(last_try=last_try)
    except TRANSIENT as error:
        delay = min(settings.PROVISION_POLL_SECONDS * 2 ** min(retries, 10), 300)
        raise task.retry(countdown=delay) from error
    if outcome == WAITING:
        raise task.retry(countdown=settings.PROVISION_POLL_SECONDS)
    return outcome


@shared_task(bind=True, max_retries=None)
def provision_pool(self, pool_id: int) -> str:
    """Repeat provisioning steps until the pool is active or failed; any error other than a transient
    one fails it at once."""
    return _drive(self, lambda last_try: provision_step(pool_id=pool_id, last_try=last_try))


@shared_task(bind=True, max_retries=None)
def settle_pool_move(self, pool_id: int) -> str:
    """Drive a re-placed pool's new GPUs (MIG layout, instance UUIDs, quota) as provision_pool drives a new
    pool's."""
    return _drive(self, lambda last_try: settle_move(pool_id=pool_id, last_try=last_try))


@shared_task(bind=True, max_retries=20)
def finish_pool_release(self, pool_id: int) -> str:
    """Shrink the quota of a released pool; retried with back-off, and on the last try the release
    is closed even if the quota could not be shrunk (the service records why)."""
    try:
        pool = finish_release(pool_id=pool_id, last_try=self.request.retries >= self.max_retries)
    except RELEASE_RETRIED as error:
        raise self.retry(countdown=min(5 * 2**self.request.retries, 600)) from error
    return pool.state if pool else "gone"


@shared_task
def sweep_stuck_pools() -> str:
    """Beat: re-drive pools in provisioning or releasing past their first deadline, end them past
    the second (POOL_REDRIVE_SECONDS, POOL_STUCK_SECONDS); fail what-if runs past theirs."""
    return sweep().summary()


@shared_task
def release_reclaimed_pools() -> str:
    """Sent for the moment a reclaim's notice ends (and run by the sweeper too): release what is due."""
    released = release_reclaimed()
    return f"{len(released)} released"


# Routed to WHATIF_QUEUE (the app's plugin), which workers of its own consume: a run of many minutes never
# holds up provisioning or alerts. The sweeper fails a run past WHATIF_RUN_SECONDS; the limits stop the
# worker's part of it soon after (where the worker's pool can stop a task), so that a run past saving does
# not hold the worker.
@shared_task(soft_time_limit=settings.WHATIF_RUN_SECONDS + 30, time_limit=settings.WHATIF_RUN_SECONDS + 90)
def execute_whatif_run(run_id: int) -> str:
    """A kept what-if run, run to its end; a second delivery finds it claimed and does nothing."""
    return execute_run(run_id=run_id)


@shared_task(autoretry_for=(OSError,), retry_backoff=True, retry_backoff_max=600, max_retries=8)
def send_event_email(event_id: int) -> str:
    return send_email(event_id)
