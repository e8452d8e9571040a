"""Provisioning and release of pools: MIG changes through the driver, namespace and quota, then active.

`provision_step` does one idempotent step and says whether the pool is done, must be
polled again, or failed; the Celery task repeats it. Every external call is safe to
repeat: a MIG change is asked for once per node (the config name is remembered on the
pool), namespaces and quotas are set to an absolute value. On a final failure the
pool's capacity goes back to the queue and nothing it reserved stays behind.

Errors. A transient one (the cluster or the database does not answer, a concurrent
writer's row appeared) is raised for the task to retry the step. A driver error fails
the pool with the driver's words; anything else fails it too, naming only the kind of
error for the tenant while the log keeps the traceback. A release retries, and when it
cannot shrink the namespace's quota in the end it is still closed (`close_release`):
its capacity was free from the moment it was asked.

Deadlines (`pools.services.deadlines`) end what stays in flight too long.
"""

from __future__ import annotations

import logging
from collections import defaultdict
from datetime import datetime, timedelta
from functools import partial

from django.db import IntegrityError, InterfaceError, OperationalError, transaction
from django.db.models import Max
from django.utils import timezone
from django.utils.translation import gettext as _

from pools import task_names
from pools.conf import settings
from pools.drivers.base import (
    DRA,
    NAMESPACE_LABELS,
    ClusterDriver,
    ClusterUnreachable,
    DriverError,
    GpuLayout,
    MigInstanceInfo,
    driver_for,
)
from pools.mig import MIG_CHANGING, MigState
from pools.models import Allocation, GpuCapacity, Pool, PoolState
from pools.placement.reasons import Reason
from pools.services.binding import bind_pool, record_uuids, unpublished
from pools.services.ends import cancel_changes
from pools.services.inventory import sync_inventory
from pools.services.requests import asked_or_administers
from pools.services.reservations import lock_capacity, recount_allocated, release_allocations
from pools.services.transitions import transition
from portal import dispatch
from portal.errors import InvalidInput, NotAllowed
from portal.models import namespace_problem

log = logging.getLogger(__name__)

DONE, WAITING, FAILED = "done", "waiting", "failed"
SHARING_KEY = "sharing:"  # before a node's name in `Pool.mig_configs`: the device plugin config asked for it

# Errors a repeated step gets past: the cluster or the database answers again, or the row a
# concurrent writer inserted is there to be read. The tasks retry them; the sweeper bounds that.
TRANSIENT = (ClusterUnreachable, OperationalError, InterfaceError, IntegrityError)
# A release has nothing to lose by waiting, so it retries every driver error too.
RELEASE_RETRIED = (DriverError, *TRANSIENT)


def layouts_to_apply(pool: Pool) -> dict[str, list[GpuLayout]]:
    """Per node name, the planned layouts of the GPUs this pool was given that still wait for one."""
    gpus = GpuCapacity.objects.filter(
        allocations__pool=pool, allocations__released_at__isnull=True, planned_layout__isnull=False
    ).select_related("node")
    layouts: dict[str, list[GpuLayout]] = defaultdict(list)
    for gpu in gpus.distinct():
        plan = gpu.planned_layout
        if not plan["mig"] and not gpu.mig_enabled:
            continue  # MIG stays off: only its node's share mode may change (`shares_to_apply`)
        instances = tuple(MigInstanceInfo(i["profile"], i["start"]) for i in plan["instances"])
        layouts[gpu.node.name].append(GpuLayout(gpu.index, plan["mig"], instances))
    return layouts


def shares_to_apply(pool: Pool) -> dict[str, str]:
    """Per node name, the share mode ("" for none) planned for the MIG-off GPUs this pool was given, where the
    node is not in it yet."""
    gpus = GpuCapacity.objects.filter(
        allocations__pool=pool, allocations__released_at__isnull=True, planned_layout__mig=False
    ).select_related("node")
    return {
        gpu.node.name: gpu.planned_layout.get("sharing", "")
        for gpu in gpus.distinct()
        if gpu.node.sharing != gpu.planned_layout.get("sharing", "")
    }


def provision_step(*, pool_id: int, last_try: bool = False) -> str:
    """One step of provisioning a pool; returns done, waiting or failed.

    A transient error is raised for the task to retry, unless this is its last try: then the
    pool fails. Any other error fails the pool: capacity returned, tenant told, reason recorded.
    """
    pool = Pool.objects.select_related("cluster", "project__tenant").filter(pk=pool_id).first()
    if pool is None or pool.state != PoolState.PROVISIONING:  # gone, or a duplicate delivery after the end
        return DONE if pool and pool.state == PoolState.ACTIVE else FAILED
    driver = None
    quota_touched = False  # from here on a failure must shrink the namespace's quota again
    try:
        driver = driver_for(pool.cluster)
        if cluster_changes(pool, driver):
            return WAITING
        sync_inventory(cluster=pool.cluster, even_if_running=True)  # learn the new instances and UUIDs
        record_uuids(pool)
        if devices_unpublished(pool):
            return WAITING
        problem = namespace_problem(pool.project)
        if problem:  # a namespace made before the rules: never label or limit it
            fail_pool(pool_id=pool.pk, reason=problem)
            return FAILED
        driver.ensure_namespace(pool.project.namespace, NAMESPACE_LABELS)
        quota_touched = True
        bind_pool(pool, driver)
        with transaction.atomic():
            pool = Pool.objects.select_for_update().get(pk=pool.pk)
            if pool.state == PoolState.PROVISIONING:
                transition(pool, PoolState.ACTIVE)
                pool.active_at = timezone.now()
                pool.save(update_fields=["state", "active_at"])
                return DONE
        # Failed meanwhile (the sweeper, past its deadline): the binding just set still counted it.
        if pool.state == PoolState.FAILED:
            settle_binding(pool, driver)
        return DONE if pool.state == PoolState.ACTIVE else FAILED
    except TRANSIENT as error:
        if not last_try:
            raise
        log.warning("pool %s: giving up provisioning after retries: %r", pool.pk, error)
        reason = error_text(error)
    except DriverError as error:
        reason = str(error)
    except Exception as error:
        log.exception("pool %s: provisioning stopped on an unexpected error", pool.pk)
        reason = error_text(error)
    pool = fail_pool(pool_id=pool.pk, reason=reason)
    if quota_touched:
        settle_binding(pool, driver)
    return FAILED


def error_text(error: Exception) -> str:
    """What a tenant may read about an error: a driver's own words, or else only its kind (the
    log has the rest; a database error can quote rows of other tenants)."""
    if isinstance(error, DriverError):
        return str(error)
    return _(
        "Provisioning stopped on an unexpected error (%(error)s); the platform team has the details."
    ) % {"error": type(error).__name__}


def settle_binding(pool: Pool, driver: ClusterDriver) -> None:
    """Best effort: bind the namespace of a pool that failed after it was bound to what is live now; claims,
    nodes or a quota left behind would let the namespace take GPUs that went back to the fleet."""
    try:
        bind_pool(pool, driver)
    except Exception:
        log.warning("pool %s failed; its namespace could not be unbound", pool.pk, exc_info=True)


def devices_unpublished(pool: Pool, since: datetime | None = None) -> bool:
    """Under DRA, whether a device the pool holds has no UUID from the cluster yet, to wait for; one still
    missing MIG_PENDING_TIMEOUT_SECONDS after `since` (default: the reservation) never comes, and the
    DriverError says which."""
    if pool.cluster.binding != DRA or not (missing := unpublished(pool)):
        return False
    if _minutes_past_deadline(pool, since) is not None:
        raise DriverError(missing)
    return True


def mig_changes(pool: Pool, driver, since: datetime | None = None) -> bool:
    """Ask for each node's MIG change once, then watch it; True while any is still under way. A change
    still pending MIG_PENDING_TIMEOUT_SECONDS after `since` (default: the reservation) is stuck."""
    under_way = False
    for node, layouts in layouts_to_apply(pool).items():
        config = pool.mig_configs.get(node)
        if config is None and _ask_mig_change(pool, driver, node, layouts):
            under_way = True
            continue
        config = pool.mig_configs[node]
        status = driver.mig_state(node)
        if status.config != config:
            if not _asked_later_for_another_pool(pool, node, status.config):
                raise DriverError(_("%(node)s was given another MIG config meanwhile.") % {"node": node})
            # The later change keeps this pool's layouts (the driver protocol's rule): it is the one to reach.
            config = pool.mig_configs[node] = status.config
            Pool.objects.filter(pk=pool.pk).update(mig_configs=pool.mig_configs)
        if status.state == MigState.FAILED:
            raise DriverError(_("The GPU Operator could not re-partition %(node)s.") % {"node": node})
        if status.state != MigState.SUCCESS:
            if (minutes := _minutes_past_deadline(pool, since)) is not None:
                raise DriverError(
                    _("%(node)s is still %(state)s after %(minutes)s minutes; the re-partitioning is stuck.")
                    % {"node": node, "state": status.state, "minutes": minutes}
                )
            under_way = True
    return under_way


def changes_to_apply(pool: Pool) -> bool:
    """Whether the GPUs this pool was given still wait for a MIG layout or for their node's share mode."""
    return bool(layouts_to_apply(pool) or shares_to_apply(pool))


def cluster_changes(pool: Pool, driver, since: datetime | None = None) -> bool:
    """The pool's MIG changes, then its nodes' share modes, each asked once and watched to its deadline;
    True while any is still under way (provisioning and a settling move both drive them)."""
    return mig_changes(pool, driver, since) or sharing_changes(pool, driver, since)


def sharing_changes(pool: Pool, driver, since: datetime | None = None) -> bool:
    """Once a node's MIG changes are done (this pool's, or another's on that node), ask for its planned
    share mode once (the device plugin's config), then watch it; True while any is still under way. One
    not applied MIG_PENDING_TIMEOUT_SECONDS after `since` (default: the reservation) never will be: the
    device plugin could not read or apply it."""
    under_way = False
    for node, sharing in shares_to_apply(pool).items():
        key = SHARING_KEY + node
        if key not in pool.mig_configs:
            if driver.mig_state(node).state in MIG_CHANGING:  # the plugin is paused for it: ask after
                _within_deadline(pool, since, node, sharing)
                under_way = True
                continue
            if _ask_once(pool, key, partial(driver.apply_sharing, node, sharing)):
                under_way = True
                continue
        if driver.sharing_state(node).sharing != sharing:
            _within_deadline(pool, since, node, sharing)
            under_way = True
    return under_way


def _within_deadline(pool: Pool, since: datetime | None, node: str, sharing: str) -> None:
    if (minutes := _minutes_past_deadline(pool, since)) is not None:
        raise DriverError(
            _(
                "The device plugin on %(node)s has not shared its GPUs as %(mode)s after %(minutes)s "
                "minutes; its config cannot be applied there."
            )
            % {"node": node, "mode": sharing or _("whole GPUs"), "minutes": minutes}
        )


def _minutes_past_deadline(pool: Pool, since: datetime | None) -> int | None:
    """The whole minutes waited since `since` (default: the reservation), once a change has waited longer
    than MIG_PENDING_TIMEOUT_SECONDS; None before."""
    waited = timezone.now() - (since or pool.reserved_at)
    if waited > timedelta(seconds=settings.MIG_PENDING_TIMEOUT_SECONDS):
        return int(waited.total_seconds() // 60)
    return None


def _asked_later_for_another_pool(pool: Pool, node: str, config: str) -> bool:
    """Whether the portal itself asked for `config` on `node`, for another pool of the cluster, after
    this pool's change: a change asked while ours was pending carries our layouts along, where a config
    set by anyone else may not."""
    return (
        Pool.objects.filter(cluster_id=pool.cluster_id, mig_configs__contains={node: config})
        .exclude(pk=pool.pk)
        .exists()
    )


def _ask_mig_change(pool: Pool, driver, node: str, layouts: list[GpuLayout]) -> bool:
    """Ask for the node's MIG change and remember it on the pool, unless a concurrent run of this
    pool's task asked first (two deliveries at once read the pool before either had asked); False
    then, and `pool.mig_configs` holds what that run asked. The pool's row stays locked over the
    driver call, so only one run asks: asked again, the same change would re-partition the GPUs
    once more, or mark pending a node that has it already, which the MIG manager, seeing no new
    config, may never end."""
    return _ask_once(pool, node, partial(driver.apply_mig_layout, node, layouts))


def _ask_once(pool: Pool, key: str, ask) -> bool:
    """`ask` the driver for a change and remember its config on the pool under `key`, unless a concurrent
    run of this pool's task asked first; False then, and `pool.mig_configs` holds what that run asked."""
    with transaction.atomic():
        asked = Pool.objects.select_for_update().values_list("mig_configs", flat=True).get(pk=pool.pk)
        first = key not in asked
        if first:
            asked = {**asked, key: ask()}
            Pool.objects.filter(pk=pool.pk).update(mig_configs=asked)
    pool.mig_configs = asked
    return first


def fail_pool(*, pool_id: int, reason: str) -> Pool:
    """Give the pool's capacity back and tell why; its request stays fulfilled, the pool failed.

    Billing stops when the capacity is given back: `released_at` is that moment, as for a release.
    """
    with transaction.atomic():
        pool = Pool.objects.select_for_update().get(pk=pool_id)
        if pool.state != PoolState.PROVISIONING:
            return pool
        transition(pool, PoolState.FAILED, reason=reason)
        pool.failure_reason = reason[:4000]
        pool.released_at = _free(pool)
        pool.save(update_fields=["state", "failure_reason", "released_at"])
    log.warning("pool %s failed: %s", pool.pk, reason)
    return pool


def _free(pool: Pool, at: datetime | None = None) -> datetime:
    """Release the pool's live allocations (as of `at`, else now) and re-run the queue; returns the moment
    they were freed."""
    lock_capacity()
    now = at or timezone.now()
    recount_allocated(release_allocations(Allocation.objects.filter(pool=pool), now))
    dispatch.after_commit(task_names.ADMIT)
    return now


def release_pool(*, pool_id: int, user) -> Pool:
    """The tenant gives a pool back: its capacity is free at once; the quota follows (finish_release)."""
    pool = Pool.objects.select_related("request__project", "project").filter(pk=pool_id).first()
    if pool is None:
        raise InvalidInput(_("Pool #%(id)s does not exist.") % {"id": pool_id})
    if not asked_or_administers(user, pool.request):
        raise NotAllowed(_("Only who asked for the pool, or an admin of the tenant, can release it."))
    with transaction.atomic():
        return release_locked(Pool.objects.select_for_update().get(pk=pool_id), actor=user)


def release_locked(
    pool: Pool, *, actor=None, at: datetime | None = None, reason: Reason | None = None
) -> Pool:
    """Release a pool whose row the caller holds locked: by `actor`, or by the portal (a reclaim's notice
    ended, `at` that moment) with `reason`. Billing stops when the capacity is free (at `at`, else now),
    whatever the quota change takes later."""
    transition(pool, PoolState.RELEASING, actor=actor, reason=reason or "")
    pool.released_at = _free(pool, at)
    pool.save(update_fields=["state", "released_at"])
    cancel_changes(pool)
    dispatch.after_commit(task_names.FINISH_RELEASE, pool.pk)
    return pool


def finish_release(*, pool_id: int, last_try: bool = False) -> Pool | None:
    """Unbind the pool (its claims deleted, the namespace's nodes and quota those of the project's remaining
    pools), then mark the pool released.

    A driver or transient error is raised for the task to retry, unless this is its last try; any
    other error, or the last try's, closes the release without the quota change (close_release).
    """
    pool = Pool.objects.select_related("project", "cluster").filter(pk=pool_id).first()
    if pool is None or pool.state != PoolState.RELEASING:
        return pool
    try:
        bind_pool(pool, driver_for(pool.cluster))
    except RELEASE_RETRIED as error:
        if not last_try:
            raise
        log.warning("pool %s: giving up shrinking its quota after retries: %r", pool.pk, error)
        return close_release(pool_id=pool.pk, reason=_unfinished_release_text(error))
    except Exception as error:
        log.exception("pool %s: its release stopped on an unexpected error", pool.pk)
        return close_release(pool_id=pool.pk, reason=_unfinished_release_text(error))
    return _mark_released(pool_id=pool.pk, reason="")


def _unfinished_release_text(error: Exception) -> str:
    """The reason a release closed without its quota change, in words a tenant may read."""
    detail = str(error) if isinstance(error, DriverError) else type(error).__name__
    return _(
        "The pool is released, but the quota of its namespace could not be shrunk (%(error)s); "
        "the platform team has the details."
    ) % {"error": detail}


def close_release(*, pool_id: int, reason: str) -> Pool | None:
    """End a release whose quota change keeps failing: the pool is released anyway, with the
    reason on its event for the tenant and the operators. Its capacity has been free since the
    release was asked (release_pool); only the namespace's quota may still count it."""
    return _mark_released(pool_id=pool_id, reason=reason)


def _mark_released(*, pool_id: int, reason: str) -> Pool | None:
    with transaction.atomic():
        pool = Pool.objects.select_for_update().filter(pk=pool_id).first()
        if pool is None or pool.state != PoolState.RELEASING:
            return pool
        if Allocation.objects.filter(pool=pool, released_at__isnull=True).exists():
            _free(pool)  # release_pool freed them already; never leave one live behind a released pool
        transition(pool, PoolState.RELEASED, reason=reason)
        # Billing stopped when the capacity was given back (release_pool), not when the quota caught up.
        if pool.released_at is None:
            freed = Allocation.objects.filter(pool=pool).aggregate(at=Max("released_at"))["at"]
            pool.released_at = freed or timezone.now()
        pool.save(update_fields=["state", "released_at"])
    if reason:
        log.warning("pool %s released without its quota change: %s", pool.pk, reason)
    return pool
