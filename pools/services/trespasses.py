"""What each sync finds of the cluster against what the pools hold: trespasses, GPUs in use by a namespace
that holds no allocation on them; and, under DRA, devices of pools that the GPU driver no longer publishes.

Words used here:
- held: what the live allocations of a namespace's pools hold, per node and device-plugin resource (a
  count), and per device UUID;
- in use: what the cluster's pods ask of a node (scheduled pods, Pending or Running), per resource, and the
  devices allocated to claims, per UUID;
- trespass: in use beyond held: a namespace's pods asking a node for more of a resource than its pools hold
  there (the count beyond), or a claim allocated a device that no live allocation of its namespace holds
  (then the pool that holds it, if any, is the one trespassed on);
- vanished: a live allocation held by a claim of its own whose UUID the GPU driver's slices no longer list
  on its node (one whose GPUs the sync could read); it is marked until the device is back or the allocation
  gets another (a re-placement), and shown on its pool's page and its node's.

A claim the portal made for a pool being released is not counted: its release deletes it next. Each open
trespass is one row (Trespass) from the sync that first saw it to the one that no longer does; monitoring
raises an alert for each (monitoring/alerts/rules.py: trespass).
"""

from __future__ import annotations

from collections import Counter, defaultdict
from dataclasses import dataclass
from datetime import datetime

from pools.drivers.base import DRA, ClaimInfo, NodeInfo, PodInfo
from pools.kinds import kind_of
from pools.models import Allocation, Cluster, NodeCapacity, Pool, PoolState, Trespass
from pools.services.binding import BOUND_STATES

USES = ("Pending", "Running")
USERS_LENGTH = 500


@dataclass(frozen=True)
class Found:
    namespace: str
    node: str
    users: str
    resource_name: str = ""
    count: int = 1
    device_uuid: str = ""
    pool_id: int | None = None

    @property
    def key(self) -> tuple[str, str, str, str]:
        return (self.namespace, self.node, self.resource_name, self.device_uuid)


@dataclass(frozen=True)
class Held:
    """What a live allocation holds, as the comparison needs it."""

    namespace: str
    node: str
    resource_name: str
    uuid: str
    pool_id: int


def _users(kind: str, names: list[str]) -> str:
    text = ", ".join(f"{kind} {name}" for name in sorted(names))
    return text if len(text) <= USERS_LENGTH else text[: USERS_LENGTH - 1] + "…"


def find_trespasses(pods: list[PodInfo], claims: list[ClaimInfo], held: list[Held]) -> list[Found]:
    """What is in use beyond what is held (see the module's words)."""
    holds = Counter((h.node, h.namespace, h.resource_name) for h in held)
    asked: Counter = Counter()
    askers: dict[tuple[str, str, str], list[str]] = defaultdict(list)
    for pod in pods:
        if not pod.node or pod.phase not in USES:
            continue
        for resource, count in pod.resources.items():
            asked[(pod.node, pod.namespace, resource)] += count
            askers[(pod.node, pod.namespace, resource)].append(pod.name)
    found = [
        Found(namespace, node, _users("pod", askers[key]), resource_name=resource, count=count - holds[key])
        for key, count in sorted(asked.items())
        if count > holds[key]
        for node, namespace, resource in [key]
    ]
    owners: dict[str, dict[str, int]] = defaultdict(dict)  # UUID: {namespace: pool}
    for h in held:
        if h.uuid:
            owners[h.uuid][h.namespace] = h.pool_id
    for claim in claims:
        for uuid in claim.devices:
            if uuid and claim.namespace not in owners.get(uuid, {}):
                pool = next(iter(owners.get(uuid, {}).values()), None)
                found.append(
                    Found(
                        claim.namespace,
                        claim.node,
                        _users("claim", [claim.name]),
                        device_uuid=uuid,
                        pool_id=pool,
                    )
                )
    return found


def _held(cluster: Cluster) -> list[Held]:
    rows = Allocation.objects.filter(
        released_at__isnull=True, pool__cluster=cluster, pool__state__in=BOUND_STATES
    ).values_list("pool__project__namespace", "gpu__node__name", "resource_name", "instance_uuid", "pool_id")
    return [Held(*row) for row in rows]


def _releasing(claims: list[ClaimInfo], cluster: Cluster) -> set[str]:
    """The pool labels of the portal's claims whose pool is being released."""
    labels = {claim.pool for claim in claims if claim.pool.isdigit()}
    ids = Pool.objects.filter(
        cluster=cluster, pk__in=[int(label) for label in labels], state=PoolState.RELEASING
    ).values_list("pk", flat=True)
    return {str(pk) for pk in ids}


def record_trespasses(
    *, cluster: Cluster, pods: list[PodInfo], claims: list[ClaimInfo], now: datetime
) -> int:
    """Open a row for each trespass first seen, refresh the ones still there, end the ones gone; returns how
    many are open. Runs in the sync's transaction, under the cluster's sync lock."""
    releasing = _releasing(claims, cluster)
    counted = [claim for claim in claims if claim.pool not in releasing]
    found = {f.key: f for f in find_trespasses(pods, counted, _held(cluster))}
    open_rows = {
        (row.namespace, row.node.name if row.node else "", row.resource_name, row.device_uuid): row
        for row in Trespass.objects.filter(cluster=cluster, ended_at__isnull=True).select_related("node")
    }
    ended = [row.pk for key, row in open_rows.items() if key not in found]
    if ended:
        Trespass.objects.filter(pk__in=ended).update(ended_at=now)
    new, changed = [], []
    first_seen = [f for key, f in found.items() if key not in open_rows]
    named = {f.node for f in first_seen}
    nodes = (
        dict(NodeCapacity.objects.filter(cluster=cluster, name__in=named).values_list("name", "pk"))
        if named
        else {}
    )
    for key, f in found.items():
        row = open_rows.get(key)
        if row is None:
            new.append(
                Trespass(
                    cluster=cluster,
                    node_id=nodes.get(f.node),
                    namespace=f.namespace,
                    users=f.users,
                    resource_name=f.resource_name,
                    count=f.count,
                    device_uuid=f.device_uuid,
                    pool_id=f.pool_id,
                    first_seen_at=now,
                    last_seen_at=now,
                )
            )
        elif (row.users, row.count, row.pool_id) != (f.users, f.count, f.pool_id):
            row.users, row.count, row.pool_id, row.last_seen_at = f.users, f.count, f.pool_id, now
            changed.append(row)
    Trespass.objects.bulk_create(new)
    Trespass.objects.bulk_update(changed, ["users", "count", "pool_id", "last_seen_at"])
    return len(found)


def _published(nodes: list[NodeInfo]) -> tuple[set[str], set[str]]:
    """The nodes whose devices a sync could read, and the UUIDs of their devices."""
    read = [node for node in nodes if node.gpus_known and not node.error]
    uuids = {gpu.uuid for node in read for gpu in node.gpus if not gpu.mig_enabled}
    uuids |= {i.uuid for node in read for gpu in node.gpus for i in gpu.instances}
    return {node.name for node in read}, uuids - {""}


def record_vanished(*, cluster: Cluster, nodes: list[NodeInfo], now: datetime) -> int:
    """Under DRA, mark the live claimed allocations whose device the driver no longer publishes, and unmark
    those whose device is back; returns how many are marked. Runs in the sync's transaction."""
    live = Allocation.objects.filter(
        released_at__isnull=True, pool__cluster=cluster, pool__state__in=BOUND_STATES
    ).exclude(instance_uuid="")
    if cluster.binding != DRA:  # nothing is claimed: no device can have vanished
        marked = list(live.filter(device_vanished_at__isnull=False).values_list("pk", flat=True))
        if marked:
            Allocation.objects.filter(pk__in=marked).update(device_vanished_at=None)
        return 0
    read, uuids = _published(nodes)
    rows = [
        (pk, profile, uuid, at)
        for pk, node, profile, uuid, at in live.values_list(
            "pk", "gpu__node__name", "profile", "instance_uuid", "device_vanished_at"
        )
        if node in read
    ]
    gone = {pk for pk, profile, uuid, _at in rows if kind_of(profile).own_device and uuid not in uuids}
    back = [pk for pk, _profile, _uuid, at in rows if at is not None and pk not in gone]
    newly = [pk for pk, _profile, _uuid, at in rows if at is None and pk in gone]
    if newly:
        Allocation.objects.filter(pk__in=newly).update(device_vanished_at=now)
    if back:
        Allocation.objects.filter(pk__in=back).update(device_vanished_at=None)
    return len(gone)
