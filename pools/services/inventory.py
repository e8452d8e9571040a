"""Inventory: the one way a cluster's capacity, and its state, are written into the portal.

`sync_inventory` takes the cluster's sync lock (two syncs of one cluster never run at once: beat ticks,
workers, commands, provisioning and the benchmarks share it) and follows the cluster as Kubernetes
controllers do, through its driver's list and watch (pools/drivers/base.py):
- a list, page by page, each page written in a transaction of its own (pools/services/inventory_rows.py
  writes what changed, so a worker holds one page of a fleet at a time): at a cluster's first sync, when the
  cluster says the version to watch from has expired (410), when its binding mode changes, and as a safety
  net once its last full list is CAPACITY_RELIST_SECONDS old;
- otherwise a watch from where the last sync stopped (the versions kept on the Cluster), each batch of
  changes written as it comes: a sync catches up with what changed since the last one, and beat's goes on
  watching for CAPACITY_WATCH_SECONDS. A sync that finds nothing new writes nothing.
Then, in one transaction, what is not one object's: the devices that vanished when the nodes or what the
pools hold changed, the trespasses where pods changed, and everywhere when the claims or what the pools
hold changed (pools/services/trespasses.py), and the cluster's state; the queue runs when capacity may have
appeared.
A cluster that cannot be read keeps its last known picture, records why (its status says which way it
failed), and is retried with exponential back-off. `request_sync` asks a worker to do it soon, for callers
that must not wait on a cluster, such as the admin inside a web request; `sync_due_clusters` does so for
every cluster whose back-off has run out (beat's tick).

Each sync also applies the portal's admission policy where it is missing or was changed (an audit entry
says so), and keeps why it cannot be applied on the cluster for the operators.
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
    CLAIMS,
    DRA,
    NODES,
    PODS,
    SLICES,
    Binding,
    CaughtUp,
    ClaimChange,
    ClaimInfo,
    ClusterDriver,
    ClusterUnauthorised,
    ClusterUnreachable,
    DriverError,
    Expired,
    NodeChange,
    NodeInfo,
    PodChange,
    PodInfo,
    Progress,
    Quiet,
    driver_for,
    list_key,
)
from pools.models import Cluster
from pools.secrets import SecretUnreadable
from pools.services.inventory_rows import Scope, SyncReport, heartbeat_due, write_inventory
from pools.services.trespasses import held_digest, record_trespasses, record_vanished
from portal import audit, dispatch

__all__ = ["SyncReport", "request_sync", "sync_due_clusters", "sync_inventory", "sync_lock"]

log = logging.getLogger(__name__)

CATCH_UP_SECONDS = 10.0  # how long a sync waits to catch up with a cluster that sends no bookmark
BATCH = 500  # watched objects written in one transaction at most
RELISTS = 3  # expired versions listed again in one sync at most
EVERY_LIST = frozenset({NODES, PODS, CLAIMS})
# Which list gives each stream its version again once it expired.
LISTS = {NODES: NODES, SLICES: NODES, PODS: PODS, CLAIMS: CLAIMS}


def sync_inventory(
    *, cluster: Cluster, even_if_running: bool = False, now: datetime | None = None, watch_seconds: float = 0
) -> SyncReport | None:
    """Sync one cluster now; None when another sync of it is running (and doing the same work).

    `even_if_running` syncs anyway: provisioning needs the instances its own MIG change made, which
    a sync that started earlier may not see, and a sync whose worker died keeps its lock until it
    expires. Two syncs at once are safe (every row is written race-proof), only redundant. With
    `watch_seconds`, the sync goes on watching that long once caught up (beat's does).
    """
    with sync_lock(cluster.pk) as held:
        if not held and not even_if_running:
            return None
        return _sync(cluster, now, watch_seconds)


def request_sync(*, cluster: Cluster, watch_seconds: float = 0) -> None:
    """Have a worker sync the cluster soon (and go on watching it for `watch_seconds`)."""
    if watch_seconds:
        dispatch.after_commit(task_names.SYNC, cluster.pk, watch_seconds)
    else:
        dispatch.after_commit(task_names.SYNC, cluster.pk)


def sync_due_clusters(*, now: datetime | None = None) -> int:
    """Have a worker sync, and watch for CAPACITY_WATCH_SECONDS, each cluster whose back-off, if any, has
    run out; how many."""
    now = now or timezone.now()
    due = [c for c in Cluster.objects.order_by("name") if c.next_sync_at is None or c.next_sync_at <= now]
    for cluster in due:
        request_sync(cluster=cluster, watch_seconds=settings.CAPACITY_WATCH_SECONDS)
    return len(due)


@contextmanager
def sync_lock(cluster_id: int) -> Iterator[bool]:
    """A short-lived lock so that two beat ticks or workers never sync one cluster at once.

    Yields whether this caller holds it; the lock expires by itself if its holder dies.
    """
    key = f"pools:sync-lock:{cluster_id}"
    timeout = max(settings.CAPACITY_SYNC_SECONDS * 5, settings.CAPACITY_WATCH_SECONDS + 300)
    held = cache.add(key, "1", timeout=timeout)
    try:
        yield held
    finally:
        if held:
            cache.delete(key)


def _sync(cluster: Cluster, now: datetime | None, watch_seconds: float) -> SyncReport:
    """Follow the cluster through its driver (a list where due, else a watch), writing as it goes, then what
    is not one object's and the cluster's state in one transaction."""
    was_ready = cluster.status == Cluster.Status.READY
    run = _Run(cluster, now)
    try:
        driver = driver_for(cluster)
        binding = driver.binding()
        admission_note = _apply_admission_policy(cluster, driver, run.now())
        run.driver, run.dra = driver, binding.mode == DRA
        binding_changed = binding.mode != cluster.binding
        if binding_changed or _relist_due(cluster, run.now()):
            run.relist()
        run.follow(watch_seconds)
        trespasses_at = run.trespasses_at()
        claims = run.claims() if run.dra and trespasses_at is None else []
    except (DriverError, SecretUnreadable) as error:
        if was_ready:
            capacity_version.changed()  # a ready cluster stops offering anything now
        _record_failure(cluster, error, run.now())
        run.report.ok, run.report.error = False, str(error)
        run.announce()
        return run.report
    now = run.now()
    with transaction.atomic():
        _record_success(cluster, now, run, binding, admission_note)
        if run.vanished_due(binding_changed):
            record_vanished(cluster=cluster, now=now)
        if trespasses_at is None or trespasses_at:
            record_trespasses(cluster=cluster, claims=claims, now=now, pods_at=trespasses_at)
        transaction.on_commit(lambda: cache.set(_held_key(cluster), run.held, timeout=None))
        if run.report.changed or not was_ready:
            capacity_version.changed()
    run.announce()
    log.info("sync %s", run.report.summary())
    return run.report


def _relist_due(cluster: Cluster, now: datetime) -> bool:
    if cluster.listed_at is None or not cluster.watch_versions:
        return True
    return now - cluster.listed_at >= timedelta(seconds=settings.CAPACITY_RELIST_SECONDS)


def _held_key(cluster: Cluster) -> str:
    return f"pools:sync-held:{cluster.pk}"


class _Batch:
    """Watched changes not written yet: the last of each node and pod, and whether a claim changed."""

    def __init__(self) -> None:
        self.nodes: dict[str, NodeInfo | None] = {}
        self.pods: dict[str, PodInfo | None] = {}
        self.claims_changed = False

    def add(self, change: NodeChange | PodChange | ClaimChange) -> None:
        if isinstance(change, NodeChange):
            self.nodes[change.name] = change.node
        elif isinstance(change, PodChange):
            self.pods[list_key(change.namespace, change.name)] = change.pod
        else:
            self.claims_changed = True

    def __len__(self) -> int:
        return len(self.nodes) + len(self.pods)


class _Run:
    """One sync of one cluster: what it has read and written so far, and where each stream stands."""

    def __init__(self, cluster: Cluster, now: datetime | None) -> None:
        self.cluster = cluster
        self.fixed_now = now
        self.driver: ClusterDriver
        self.dra = False
        self.report = SyncReport(cluster=cluster.name)
        self.versions: dict[str, str] = dict(cluster.watch_versions or {})
        self.nodes_changed = self.claims_changed = False
        self._claims: list[ClaimInfo] | None = None  # read when needed, again once a claim changed
        self.whole = False  # listed whole (the safety net's interval starts again)
        self.held = ""
        self.announced = 0  # rows written when the queue was last told

    def now(self) -> datetime:
        return self.fixed_now or timezone.now()

    def relist(self, lists: frozenset[str] = EVERY_LIST) -> None:
        """List the cluster page by page (or only `lists`), writing each page; its versions become those to
        watch from."""
        self.report.listed = True
        if lists == EVERY_LIST:
            self.versions, self.whole = {}, True
        if CLAIMS in lists:
            self._claims, self.claims_changed = None, True
            if self.dra:
                self.claims()  # the pods' claims need them, and the claims stream its version
        if NODES in lists:
            for page in self.driver.list_nodes():
                self._write(nodes=page.items, node_scope=Scope.of_page(page))
                self.versions.update(page.versions)
            self.nodes_changed = True
        if PODS in lists:
            for page in self.driver.list_pods():
                pods = page.items
                self._write(pods=pods, pod_scope=Scope.of_page(page), claims=self._pod_claims(pods))
                self.versions.update(page.versions)

    def follow(self, seconds: float) -> None:
        """Watch from where each stream stands: until caught up (at most CATCH_UP_SECONDS), or with `seconds`
        for that long in all, writing each batch of changes as it comes (during the catch-up, once it is
        whole or BATCH long); an expired stream is listed again and the watch goes on."""
        deadline = timezone.now() + timedelta(seconds=seconds or CATCH_UP_SECONDS)
        for _attempt in range(RELISTS):
            batch, caught_up = _Batch(), False
            left = (deadline - timezone.now()).total_seconds()
            try:
                for item in self.driver.watch(self.versions, seconds=max(left, 1.0)):
                    if isinstance(item, (NodeChange, PodChange, ClaimChange)):
                        batch.add(item)
                        self.versions[item.stream] = item.version
                        self.report.watched += 1
                        if len(batch) >= BATCH:
                            batch = self._flush(batch)
                    elif isinstance(item, Progress):
                        self.versions[item.stream] = item.version
                    elif isinstance(item, CaughtUp):
                        batch, caught_up = self._flush(batch), True
                        if not seconds:
                            return
                    elif isinstance(item, Quiet) and caught_up:
                        batch = self._flush(batch)
                        self.announce()  # watching on: the queue need not wait for the end
                self._flush(batch)
                return
            except Expired as expired:
                self._flush(batch)
                log.info("sync %s: %s; listing it again", self.cluster.name, expired)
                self.relist(frozenset({LISTS.get(expired.stream, expired.stream)}))
        raise DriverError(f"{self.cluster.name}: the versions to watch from kept expiring")

    def _flush(self, batch: _Batch) -> _Batch:
        if batch.claims_changed:
            self._claims, self.claims_changed = None, True
        if batch:
            nodes = [node for node in batch.nodes.values() if node is not None]
            pods = [pod for pod in batch.pods.values() if pod is not None]
            self._write(
                nodes=nodes,
                node_scope=Scope.of_keys(batch.nodes) if batch.nodes else None,
                pods=pods,
                pod_scope=Scope.of_keys(batch.pods) if batch.pods else None,
                claims=self._pod_claims(pods),
            )
            self.nodes_changed = self.nodes_changed or bool(batch.nodes)
        return _Batch()

    def announce(self) -> None:
        """Run the queue when capacity may have appeared since it was last told: the queue may admit more."""
        if self.report.rows > self.announced:
            dispatch.after_commit(task_names.ADMIT)
            self.announced = self.report.rows

    def _write(self, **found) -> None:
        """One page or batch in a transaction of its own; pictures of the fleet are stale once it changed."""
        before = self.report.rows
        with transaction.atomic():
            write_inventory(cluster=self.cluster, now=self.now(), report=self.report, **found)
            if self.report.rows != before:
                capacity_version.changed()

    def _pod_claims(self, pods) -> list[ClaimInfo]:
        """The claims, where a pod uses any (under DRA), for the devices of its claims."""
        return self.claims() if self.dra and any(pod.claims for pod in pods) else []

    def claims(self) -> list[ClaimInfo]:
        if self._claims is None:
            self._claims = []
            for page in self.driver.list_claims():
                self._claims.extend(page.items)
                self.versions.update(page.versions)
        return self._claims

    def held_changed(self) -> bool:
        """Whether what the pools hold changed since the last sync (the digest it kept)."""
        if not self.held:
            self.held = held_digest(self.cluster)
        return cache.get(_held_key(self.cluster)) != self.held

    def trespasses_at(self) -> set[tuple[str, str]] | None:
        """Where the trespasses may have changed: everywhere (None) once listed, a claim changed, or what the
        pools hold; else at each (node, namespace) where pods changed (none: nowhere)."""
        held_changed = self.held_changed()  # the digest is kept for the next sync whatever else changed
        if self.report.listed or self.claims_changed or held_changed:
            return None
        return self.report.pods_at

    def vanished_due(self, binding_changed: bool) -> bool:
        return self.report.listed or binding_changed or self.nodes_changed or self.held_changed()


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
    cluster: Cluster, now: datetime, run: _Run, binding: Binding, admission_note: str
) -> None:
    """The cluster's state after a sync; where its streams stand is written with it, and at least with each
    heartbeat, never alone (a sync that found nothing new writes nothing)."""
    report, changes = run.report, {}
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
    if run.whole:
        changes["listed_at"] = now
    if changes or heartbeat_due(cluster.last_sync_at, now):
        changes["last_sync_at"] = now
        if run.versions != cluster.watch_versions:
            changes["watch_versions"] = run.versions
    if changes:
        Cluster.objects.filter(pk=cluster.pk).update(**changes)
        for name, value in changes.items():
            setattr(cluster, name, value)
