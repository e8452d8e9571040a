"""Provisioning and release of pools: MIG changes through the driver, namespace and quota, then active.

`provision_step` does one idempotent step and says whether the pool is done, must be
polled again, or failed; the Celery task repeats it. Every external call is safe to
repeat: a MIG change is asked for once per node (the config name is remembered on the
pool), namespaces and quotas are set to an absolute value. On a final failure the
pool's capacity goes back to the queue and nothing it reserved stays behind.
"""

from __future__ import annotations

import logging
from collections import defaultdict
from datetime import timedelta

from django.conf import settings
from django.db import transaction
from django.db.models import Count
from django.utils import timezone
from django.utils.translation import gettext as _

from pools.drivers.base import (
    NAMESPACE_LABELS,
    ClusterUnreachable,
    DriverError,
    GpuLayout,
    MigInstanceInfo,
    MigState,
    driver_for,
)
from pools.models import POOL_TRANSITIONS, Allocation, GpuCapacity, Pool, PoolEvent, PoolState
from pools.notifications import notify_after_commit
from pools.services.queue import lock_capacity, recount_allocated
from pools.services.requests import asked_or_administers
from pools.sync import sync_cluster
from portal.errors import Conflict, InvalidInput, NotAllowed
from portal.models import namespace_problem

log = logging.getLogger(__name__)

DONE, WAITING, FAILED = "done", "waiting", "failed"


def move_pool(pool: Pool, to: str, *, actor=None, reason: str = "") -> None:
    if to not in POOL_TRANSITIONS[pool.state]:
        raise Conflict(
            _("Pool #%(id)s is %(state)s; it cannot become %(to)s.")
            % {"id": pool.pk, "state": PoolState(pool.state).label, "to": PoolState(to).label}
        )
    event = PoolEvent.objects.create(
        request_id=pool.request_id, pool=pool, actor=actor, from_state=pool.state, to_state=to, reason=reason
    )
    notify_after_commit(event)
    pool.state = to


def _layouts_to_apply(pool: Pool) -> dict[str, list[GpuLayout]]:
    """Per node name, the planned layouts of the GPUs this pool was given that still wait for one."""
    gpus = GpuCapacity.objects.filter(allocations__pool=pool, planned_layout__isnull=False).select_related(
        "node"
    )
    layouts: dict[str, list[GpuLayout]] = defaultdict(list)
    for gpu in gpus.distinct():
        plan = gpu.planned_layout
        instances = tuple(MigInstanceInfo(i["profile"], i["start"]) for i in plan["instances"])
        layouts[gpu.node.name].append(GpuLayout(gpu.index, plan["mig"], instances))
    return layouts


def project_quota(project_id: int, cluster_id: int) -> dict[str, int]:
    """The GPU quota of a project's namespace in one cluster: its live allocations, summed over its pools."""
    rows = (
        Allocation.objects.filter(
            released_at__isnull=True,
            pool__project_id=project_id,
            pool__cluster_id=cluster_id,
            pool__state__in=[PoolState.PROVISIONING, PoolState.ACTIVE],
        )
        .values("resource_name")
        .annotate(n=Count("id"))
    )
    return {row["resource_name"]: row["n"] for row in rows}


def provision_step(*, pool_id: int) -> str:
    """One step of provisioning a pool; returns done, waiting or failed."""
    pool = Pool.objects.select_related("cluster", "project__tenant").filter(pk=pool_id).first()
    if pool is None or pool.state != PoolState.PROVISIONING:  # gone, or a duplicate delivery after the end
        return DONE if pool and pool.state == PoolState.ACTIVE else FAILED
    driver = driver_for(pool.cluster)
    try:
        pending = _mig_changes(pool, driver)
        if pending:
            return WAITING
        sync_cluster(cluster=pool.cluster)  # learn the new instances and their UUIDs
        _bind_instances(pool)
        problem = namespace_problem(pool.project)
        if problem:  # a namespace made before the rules: never label or limit it
            fail_pool(pool_id=pool.pk, reason=problem)
            return FAILED
        driver.ensure_namespace(pool.project.namespace, NAMESPACE_LABELS)
        driver.apply_quota(pool.project.namespace, project_quota(pool.project_id, pool.cluster_id))
    except ClusterUnreachable:
        raise  # transient: the task retries with back-off
    except DriverError as error:
        fail_pool(pool_id=pool.pk, reason=str(error))
        return FAILED
    with transaction.atomic():
        pool = Pool.objects.select_for_update().get(pk=pool.pk)
        if pool.state != PoolState.PROVISIONING:
            return DONE if pool.state == PoolState.ACTIVE else FAILED
        move_pool(pool, PoolState.ACTIVE)
        pool.active_at = timezone.now()
        pool.save(update_fields=["state", "active_at"])
    return DONE


def _mig_changes(pool: Pool, driver) -> bool:
    """Ask for each node's MIG change once, then watch it; True while any is still under way."""
    under_way = False
    for node, layouts in _layouts_to_apply(pool).items():
        config = pool.mig_configs.get(node)
        if config is None:
            config = driver.apply_mig_layout(node, layouts)
            Pool.objects.filter(pk=pool.pk).update(mig_configs={**pool.mig_configs, node: config})
            pool.mig_configs[node] = config
            under_way = True
            continue
        status = driver.mig_state(node)
        if status.config != config:
            raise DriverError(_("%(node)s was given another MIG config meanwhile.") % {"node": node})
        if status.state == MigState.FAILED:
            raise DriverError(_("The GPU Operator could not re-partition %(node)s.") % {"node": node})
        if status.state != MigState.SUCCESS:
            waited = timezone.now() - pool.reserved_at
            if waited > timedelta(seconds=settings.MIG_PENDING_TIMEOUT_SECONDS):
                raise DriverError(
                    _("%(node)s is still %(state)s after %(minutes)s minutes; the re-partitioning is stuck.")
                    % {"node": node, "state": status.state, "minutes": int(waited.total_seconds() // 60)}
                )
            under_way = True
    return under_way


def _bind_instances(pool: Pool) -> None:
    """Record the UUID of each MIG instance the pool holds, now that the cluster reports them."""
    for allocation in Allocation.objects.filter(pool=pool, released_at__isnull=True).select_related("gpu"):
        if allocation.profile == "full":
            uuid = allocation.gpu.uuid
        else:
            uuid = next(
                (
                    i.get("uuid", "")
                    for i in allocation.gpu.layout
                    if i["start"] == allocation.slices.lower and i["profile"] == allocation.profile
                ),
                "",
            )
        if uuid != allocation.instance_uuid:
            Allocation.objects.filter(pk=allocation.pk).update(instance_uuid=uuid)


def fail_pool(*, pool_id: int, reason: str) -> Pool:
    """Give the pool's capacity back and tell why; its request stays fulfilled, the pool failed."""
    with transaction.atomic():
        pool = Pool.objects.select_for_update().get(pk=pool_id)
        if pool.state != PoolState.PROVISIONING:
            return pool
        move_pool(pool, PoolState.FAILED, reason=reason)
        pool.failure_reason = reason[:4000]
        pool.save(update_fields=["state", "failure_reason"])
        _free(pool)
    log.warning("pool %s failed: %s", pool.pk, reason)
    return pool


def _free(pool: Pool) -> None:
    lock_capacity()
    now = timezone.now()
    live = Allocation.objects.filter(pool=pool, released_at__isnull=True)
    gpu_ids = set(live.values_list("gpu_id", flat=True))
    node_ids = set(GpuCapacity.objects.filter(pk__in=gpu_ids).values_list("node_id", flat=True))
    live.update(released_at=now)
    # A planned layout nobody holds any more is dropped: the GPU is free to be planned again.
    GpuCapacity.objects.filter(pk__in=gpu_ids, planned_layout__isnull=False).exclude(
        allocations__released_at__isnull=True
    ).update(planned_layout=None)
    recount_allocated(node_ids)
    transaction.on_commit(_run_queue)


def _run_queue() -> None:
    from pools.tasks import admit_waiting_requests

    admit_waiting_requests.delay()


def release_pool(*, pool_id: int, user) -> Pool:
    """The tenant gives a pool back: its capacity is free at once; the quota follows (finish_release)."""
    pool = Pool.objects.select_related("request__project", "project").filter(pk=pool_id).first()
    if pool is None:
        raise InvalidInput(_("Pool #%(id)s does not exist.") % {"id": pool_id})
    if not asked_or_administers(user, pool.request):
        raise NotAllowed(_("Only who asked for the pool, or an admin of the tenant, can release it."))
    with transaction.atomic():
        pool = Pool.objects.select_for_update().get(pk=pool_id)
        move_pool(pool, PoolState.RELEASING, actor=user)
        pool.save(update_fields=["state"])
        _free(pool)
        transaction.on_commit(lambda: _finish_later(pool.pk))
    return pool


def _finish_later(pool_id: int) -> None:
    from pools.tasks import finish_pool_release

    finish_pool_release.delay(pool_id)


def finish_release(*, pool_id: int) -> Pool:
    """Shrink the namespace's quota to the project's remaining pools, then mark the pool released."""
    pool = Pool.objects.select_related("project", "cluster").filter(pk=pool_id).first()
    if pool is None or pool.state != PoolState.RELEASING:
        return pool
    driver = driver_for(pool.cluster)
    quota = project_quota(pool.project_id, pool.cluster_id)
    if quota:
        driver.apply_quota(pool.project.namespace, quota)
    else:
        driver.remove_quota(pool.project.namespace)
    with transaction.atomic():
        pool = Pool.objects.select_for_update().get(pk=pool_id)
        if pool.state == PoolState.RELEASING:
            move_pool(pool, PoolState.RELEASED)
            pool.released_at = timezone.now()
            pool.save(update_fields=["state", "released_at"])
    return pool
