"""Inventory: the one way a cluster's capacity, and its state, are written into the portal.

`sync_inventory` takes the cluster's sync lock (two syncs of one cluster never run at once: beat ticks,
workers, commands, provisioning and the benchmarks share it), reads the cluster through its driver, writes
what changed (pools/services/inventory_rows.py) and the cluster's state in one transaction, and runs the
queue when capacity may have appeared. A cluster that cannot be read keeps its last known picture, records
why (its status says which way it failed), and is retried with exponential back-off. `request_sync` asks a
worker to do it soon, for callers that must not wait on a cluster, such as the admin inside a web request;
`sync_due_clusters` does so for every cluster whose back-off has run out (beat's tick).

Each sync also applies the portal's admission policy where it is missing or was changed (an audit entry
says so), keeps why it cannot be applied on the cluster for the operators, and records the GPUs in use
by namespaces that hold no allocation on them (pools/services/trespasses.py).
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import datetime, timedelta

from django.core.cache import cache
from django.db import transaction
from django.utils import timezone
from django.utils.translation import gettext_noop

from pools import capacity_version, task_names
from pools.conf import settings
from pools.drivers.base import (
    DRA,
    Binding,
    ClusterDriver,
    ClusterUnauthorised,
    ClusterUnreachable,
    DriverError,
    driver_for,
)
from pools.models import Cluster
from pools.secrets import SecretUnreadable
from pools.services.inventory_rows import SyncReport, heartbeat_due, write_inventory
from pools.services.trespasses import record_trespasses, record_vanished
from portal import audit, dispatch

__all__ = ["SyncReport", "request_sync", "sync_due_clusters", "sync_inventory", "sync_lock"]

log = logging.getLogger(__name__)


def sync_inventory(
    *, cluster: Cluster, even_if_running: bool = False, now: datetime | None = None
) -> SyncReport | None:
    """Sync one cluster now; None when another sync of it is running (and doing the same work).

    `even_if_running` syncs anyway: provisioning needs the instances its own MIG change made, which
    a sync that started earlier may not see, and a sync whose worker died keeps its lock until it
    expires. Two syncs at once are safe (every row is written race-proof), only redundant.
    """
    with sync_lock(cluster.pk) as held:
        if not held and not even_if_running:
            return None
        report = _sync(cluster, now or timezone.now())
    if report.changed:  # capacity may have appeared: the queue may admit more now
        dispatch.after_commit(task_names.ADMIT)
    return report


def request_sync(*, cluster: Cluster) -> None:
    """Have a worker sync the cluster soon."""
    dispatch.after_commit(task_names.SYNC, cluster.pk)


def sync_due_clusters(*, now: datetime | None = None) -> int:
    """Have a worker sync each cluster whose back-off, if any, has run out; how many."""
    now = now or timezone.now()
    due = [c for c in Cluster.objects.order_by("name") if c.next_sync_at is None or c.next_sync_at <= now]
    for cluster in due:
        request_sync(cluster=cluster)
    return len(due)


@contextmanager
def sync_lock(cluster_id: int) -> Iterator[bool]:
    """A short-lived lock so that two beat ticks or workers never sync one cluster at once.

    Yields whether this caller holds it; the lock expires by itself if its holder dies.
    """
    key = f"pools:sync-lock:{cluster_id}"
    held = cache.add(key, "1", timeout=max(settings.CAPACITY_SYNC_SECONDS * 5, 300))
    try:
        yield held
    finally:
        if held:
            cache.delete(key)


def _sync(cluster: Cluster, now: datetime) -> SyncReport:
    """Read the cluster through its driver (the whole of it first: nodes, GPUs, pods), then write the
    difference and the cluster's state in one transaction."""
    report = SyncReport(cluster=cluster.name)
    try:
        driver = driver_for(cluster)
        nodes = driver.inventory()
        pods = driver.workloads()
        binding = driver.binding()
        claims = driver.claims() if binding.mode == DRA else []
    except (DriverError, SecretUnreadable) as error:
        if cluster.status == Cluster.Status.READY:
            capacity_version.changed()  # a ready cluster stops offering anything now
        _record_failure(cluster, error, now)
        report.ok, report.error = False, str(error)
        return report
    admission_note = _apply_admission_policy(cluster, driver, now)
    was_ready = cluster.status == Cluster.Status.READY
    with transaction.atomic():
        write_inventory(cluster=cluster, nodes=nodes, pods=pods, claims=claims, now=now, report=report)
        _record_success(cluster, now, report, binding, admission_note)
        record_trespasses(cluster=cluster, pods=pods, claims=claims, now=now)
        record_vanished(cluster=cluster, nodes=nodes, now=now)
        if report.changed or not was_ready:
            capacity_version.changed()
    log.info("sync %s", report.summary())
    return report


ADMISSION_RESTORED = gettext_noop("Cluster %(cluster)s: %(what)s")


def _apply_admission_policy(cluster: Cluster, driver: ClusterDriver, now: datetime) -> str:
    """Apply the admission policy where it is missing or changed; returns why it is not in force ("" when it
    is). A policy put back after a sync had found it in force is audited: someone or something removed or
    changed it (the first one applied, at the cluster's first sync, is not news)."""
    try:
        restored = driver.ensure_admission_policy()
    except DriverError as error:
        return str(error)[:500]
    if restored and cluster.last_sync_at is not None and not cluster.admission_note:
        audit.record(
            "cluster.admission_restored",
            summary=ADMISSION_RESTORED,
            values={"cluster": cluster.name, "what": restored},
            subject=("cluster", cluster.pk),
            at=now,
        )
    return ""


def _record_failure(cluster: Cluster, error: Exception, now: datetime) -> None:
    if isinstance(error, ClusterUnauthorised):
        status = Cluster.Status.UNAUTHORISED
    elif isinstance(error, ClusterUnreachable):
        status = Cluster.Status.UNREACHABLE
    else:
        status = Cluster.Status.ERROR
    failures = cluster.failures + 1
    delay = min(settings.CAPACITY_SYNC_SECONDS * 2 ** (failures - 1), settings.SYNC_BACKOFF_MAX_SECONDS)
    Cluster.objects.filter(pk=cluster.pk).update(
        status=status,
        last_error=str(error)[:4000],
        failures=failures,
        next_sync_at=now + timedelta(seconds=delay),
    )
    cluster.status, cluster.last_error, cluster.failures = status, str(error)[:4000], failures
    log.warning("sync %s failed (%s in a row): %s", cluster.name, failures, error)


def _record_success(
    cluster: Cluster, now: datetime, report: SyncReport, binding: Binding, admission_note: str
) -> None:
    changes = {}
    if (cluster.binding, cluster.binding_note) != (binding.mode, binding.why[:300]):
        changes["binding"], changes["binding_note"] = binding.mode, binding.why[:300]
    if cluster.admission_note != admission_note:
        changes["admission_note"] = admission_note
    if cluster.status != Cluster.Status.READY:
        changes["status"] = Cluster.Status.READY
    if cluster.last_error:
        changes["last_error"] = ""
    if cluster.failures:
        changes["failures"] = 0
    if cluster.next_sync_at is not None:
        changes["next_sync_at"] = None
    if report.changed:
        changes["last_change_at"] = now
    if changes or heartbeat_due(cluster.last_sync_at, now):
        changes["last_sync_at"] = now
    if changes:
        Cluster.objects.filter(pk=cluster.pk).update(**changes)
        for name, value in changes.items():
            setattr(cluster, name, value)
