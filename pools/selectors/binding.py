"""What a pool's page shows of its binding in the cluster: the claim of each unit under DRA, the project's GPU
pods with the pool's units each uses, and the trespasses on what the pool holds.

Words used here:
- unit: one live allocation of the pool;
- uses: under DRA, the units whose devices are allocated to a pod's claims (known exactly); through the
  device plugin, the pool's units on the pod's node of a resource the pod asks for (the kubelet picks
  which one of them, and the cluster does not say).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

from django.db.models import Q, QuerySet

from pools.kinds import kind_of
from pools.manifest import Unit
from pools.models import Allocation, Cluster, NodeCapacity, Pool, Trespass, WorkloadProfile

CLAIM_PREFIX = "gpu-portal-"


def claim_name(allocation: Allocation) -> str:
    """The name of the ResourceClaim the portal makes for an allocation, in its project's namespace."""
    return f"{CLAIM_PREFIX}{allocation.pool_id}-{allocation.pk}"


def claimed(allocation: Allocation, cluster: Cluster) -> bool:
    """Whether the allocation is bound by a claim of its own: under DRA, a unit that is its own device."""
    return cluster.binding == Cluster.Binding.DRA and kind_of(allocation.profile).own_device


def manifest_units(pool: Pool, live: Iterable[Allocation]) -> list[Unit]:
    cluster = pool.cluster
    return [
        Unit(a.gpu.node.name, a.resource_name, claim_name(a) if claimed(a, cluster) else "") for a in live
    ]


@dataclass
class PodUse:
    name: str
    node: str
    phase: str
    resources: dict[str, int] = field(default_factory=dict)
    units: list[Allocation] = field(default_factory=list)
    exact: bool = True  # the units are the pod's own (DRA), not the ones it may be using


def pool_pods(pool: Pool, live: list[Allocation]) -> list[PodUse]:
    """The project's GPU pods in the pool's cluster that use any of the pool's live units, by name."""
    rows = WorkloadProfile.objects.filter(
        cluster_id=pool.cluster_id, namespace=pool.project.namespace, present=True
    ).order_by("pod_name", "resource_name")
    by_uuid = {a.instance_uuid: a for a in live if a.instance_uuid and claimed(a, pool.cluster)}
    pods: dict[str, PodUse] = {}
    for row in rows:
        pod = pods.setdefault(row.pod_name, PodUse(row.pod_name, row.node_name, row.phase))
        if row.resource_name:
            pod.resources[row.resource_name] = row.count
            mine = [
                a
                for a in live
                if (a.gpu.node.name, a.resource_name) == (row.node_name, row.resource_name)
                and not claimed(a, pool.cluster)
            ]
            if mine:
                pod.units.extend(mine)
                pod.exact = False
        else:
            pod.units.extend(by_uuid[uuid] for uuid in row.devices if uuid in by_uuid)
    return [pod for pod in pods.values() if pod.units]


def open_trespasses(*, pool: Pool | None = None, node: NodeCapacity | None = None) -> QuerySet[Trespass]:
    """Open trespasses on what the pool holds (its devices, or its resources on its nodes), or on a node."""
    found = Trespass.objects.filter(ended_at__isnull=True).select_related("cluster", "node", "pool")
    if node is not None:
        return found.filter(node=node)
    if pool is None:
        return found
    held = set(
        Allocation.objects.filter(pool=pool, released_at__isnull=True).values_list(
            "gpu__node_id", "resource_name"
        )
    )
    on_resources = Q()
    for node_id, resource in held:
        on_resources |= Q(node_id=node_id, resource_name=resource, device_uuid="")
    return found.filter(Q(pool=pool) | on_resources) if held else found.filter(pool=pool)


def vanished_devices(*, node: NodeCapacity) -> QuerySet[Allocation]:
    """The live allocations on the node whose device the GPU driver no longer publishes (at most the node's
    devices: a few dozen)."""
    return (
        Allocation.objects.filter(gpu__node=node, released_at__isnull=True, device_vanished_at__isnull=False)
        .select_related("gpu", "pool__project__tenant")
        .order_by("gpu__index", "slices")
    )
