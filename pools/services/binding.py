"""How a project's pools are bound to its namespace in a cluster, from what the database holds: the nodes
where its pools hold GPUs (which the cluster's admission policy confines its GPU pods to), under DRA one
ResourceClaim per exclusive device (a whole GPU or a MIG instance, selected by UUID), and the GPU quota.

Words used here:
- live: an allocation not released, of a pool provisioning or in use;
- device claim: the claim of one live allocation whose unit is a device of its own (a share is not: a
  claim cannot hold a GPU shared with other claims, so shares stay counted by the quota, and confined);
- binding a pool: after its GPUs are laid out (provisioning, a settled move), or before some are given back
  (a shrink, `without` them), or after its release: every call sets absolute values, so repeating it is
  harmless and a later call mends what an earlier one left.
"""

from __future__ import annotations

from collections.abc import Collection

from django.db.models import Count
from django.utils.translation import gettext as _

from pools.drivers.base import DRA, ClusterDriver, DeviceClaim, DriverError
from pools.kinds import kind_of
from pools.models import IN_USE_STATES, Allocation, Pool, PoolState
from pools.selectors.binding import claim_name

BOUND_STATES = (PoolState.PROVISIONING, *IN_USE_STATES)


class DeviceNotPublished(DriverError):
    """The cluster's GPU driver lists no device for an allocation, so no claim can select it."""


def _live(project_id: int, cluster_id: int, without: Collection[int] = ()):
    return Allocation.objects.filter(
        released_at__isnull=True,
        pool__project_id=project_id,
        pool__cluster_id=cluster_id,
        pool__state__in=BOUND_STATES,
    ).exclude(pk__in=list(without))


def project_quota(project_id: int, cluster_id: int, without: Collection[int] = ()) -> dict[str, int]:
    """The GPU quota of a project's namespace in one cluster: its live allocations, summed over its pools."""
    rows = _live(project_id, cluster_id, without).values("resource_name").annotate(n=Count("id"))
    return {row["resource_name"]: row["n"] for row in rows}


def project_nodes(project_id: int, cluster_id: int, without: Collection[int] = ()) -> list[str]:
    """The nodes where a project's pools hold GPUs in one cluster: where its GPU pods may run."""
    return sorted(set(_live(project_id, cluster_id, without).values_list("gpu__node__name", flat=True)))


def device_claims(pool: Pool, without: Collection[int] = ()) -> list[DeviceClaim]:
    """One claim per live allocation of the pool whose unit is a device of its own, selecting its UUID;
    DeviceNotPublished when the cluster has not told one's UUID."""
    claims = []
    live = Allocation.objects.filter(pool=pool, released_at__isnull=True).exclude(pk__in=list(without))
    for allocation in live.select_related("gpu__node").order_by("pk"):
        kind = kind_of(allocation.profile)
        if not kind.own_device:
            continue
        if not allocation.instance_uuid:
            raise DeviceNotPublished(unpublished_text(allocation))
        claims.append(DeviceClaim(claim_name(allocation), allocation.instance_uuid, kind.takes_whole_gpu))
    return claims


def unpublished_text(allocation: Allocation) -> str:
    return _(
        "The cluster's GPU driver lists no DRA device for %(unit)s on GPU %(index)s of %(node)s, so no "
        "ResourceClaim can select it: its ResourceSlice has not been published, or the device vanished."
    ) % {"unit": allocation.profile, "index": allocation.gpu.index, "node": allocation.gpu.node.name}


def unpublished(pool: Pool) -> str:
    """Why the pool cannot be bound through DRA yet ("" when every device it needs is known)."""
    try:
        device_claims(pool)
    except DeviceNotPublished as missing:
        return str(missing)
    return ""


def bind_pool(pool: Pool, driver: ClusterDriver, *, without: Collection[int] = ()) -> None:
    """Bind the pool's project namespace to what its live allocations are now (leaving out `without`, which
    are about to be given back): the nodes its GPU pods may use, the pool's claims under DRA, the quota.
    A namespace the portal has not made yet has nothing to bind (provisioning makes it first)."""
    namespace, project, cluster = pool.project.namespace, pool.project_id, pool.cluster_id
    live_pool = pool.state in BOUND_STATES
    if pool.cluster.binding == DRA:
        driver.apply_claims(namespace, str(pool.pk), device_claims(pool, without) if live_pool else [])
    driver.bind_namespace(namespace, pool.cluster.binding, project_nodes(project, cluster, without))
    quota = project_quota(project, cluster, without)
    if quota:
        driver.apply_quota(namespace, quota)
    else:
        driver.remove_quota(namespace)


def record_uuids(pool: Pool) -> None:
    """Record the UUID of each device the pool holds, now that the cluster reports them: a whole GPU's or a
    share's is its GPU's, a MIG instance's its own."""
    for allocation in Allocation.objects.filter(pool=pool, released_at__isnull=True).select_related("gpu"):
        if kind_of(allocation.profile).gpu_figures:
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
        if uuid != allocation.instance_uuid:  # a new device: the old one's vanishing is no longer news
            Allocation.objects.filter(pk=allocation.pk).update(instance_uuid=uuid, device_vanished_at=None)
