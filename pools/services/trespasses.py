"""What each sync finds of the cluster against what the pools hold: trespasses, GPUs in use by a namespace
that holds no allocation on them; and, under DRA, devices of pools that the GPU driver no longer publishes.

Words used here:
- held: what the live allocations of a namespace's pools hold, per node and device-plugin resource (a
  count), and per device UUID;
- in use: what the cluster's pods ask of a node (scheduled pods, Pending or Running, as the inventory's
  WorkloadProfile rows hold them), per resource, and the devices allocated to claims, per UUID;
- trespass: in use beyond held: a namespace's pods asking a node for more of a resource than its pools hold
  there (the count beyond), or a claim allocated a device that no live allocation of its namespace holds
  (then the pool that holds it, if any, is the one trespassed on);
- vanished: a live allocation held by a claim of its own whose UUID the GPU driver's slices no longer list
  on its node (one whose GPUs the sync could read); it is marked until the device is back or the allocation
  gets another (a re-placement), and shown on its pool's page and its node's.

A claim the portal made for a pool being released is not counted: its release deletes it next. Each open
trespass is one row (Trespass) from the sync that first saw it to the one that no longer does; monitoring
raises an alert for each (monitoring/alerts/rules.py: trespass). Both are read from the inventory's rows, so
a sync that follows the cluster by watch records them again only when what they depend on changed: the
pods, the claims, the nodes' devices, or what the live allocations hold (`held_digest`).
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Collection, Iterable
from dataclasses import dataclass
from datetime import datetime

from django.contrib.postgres.aggregates import ArrayAgg, StringAgg
from django.db.models import CharField, Count, Func, Sum, Value
from django.db.models.functions import Cast, Coalesce, Concat

from pools.drivers.base import DRA, ClaimInfo
from pools.kinds import kind_of
from pools.mig import MigState
from pools.models import (
    Allocation,
    Cluster,
    GpuCapacity,
    NodeCapacity,
    Pool,
    PoolState,
    Trespass,
    WorkloadProfile,
)
from pools.services.binding import BOUND_STATES
from pools.services.inventory_rows import CLAIMS_ROW

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
class Asked:
    """What a namespace's scheduled pods ask of one resource on one node, and which pods they are."""

    node: str
    namespace: str
    resource_name: str
    count: int
    pods: tuple[str, ...]


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


def find_trespasses(asked: Iterable[Asked], claims: list[ClaimInfo], held: list[Held]) -> list[Found]:
    """What is in use beyond what is held (see the module's words)."""
    holds = Counter((h.node, h.namespace, h.resource_name) for h in held)
    found = [
        Found(
            a.namespace,
            a.node,
            _users("pod", list(a.pods)),
            resource_name=a.resource_name,
            count=a.count - left,
        )
        for a in asked
        if a.count > (left := holds[(a.node, a.namespace, a.resource_name)])
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


def _live(cluster: Cluster):
    return Allocation.objects.filter(
        released_at__isnull=True, pool__cluster=cluster, pool__state__in=BOUND_STATES
    )


def _held(cluster: Cluster, nodes: Collection[str] | None = None) -> list[Held]:
    live = _live(cluster) if nodes is None else _live(cluster).filter(gpu__node__name__in=nodes)
    rows = live.values_list(
        "pool__project__namespace", "gpu__node__name", "resource_name", "instance_uuid", "pool_id"
    )
    return [Held(*row) for row in rows]


def held_digest(cluster: Cluster) -> str:
    """A digest of what the cluster's live allocations hold (one query): it changes when an allocation is
    made or released, its pool leaves or enters the states that bind it, or it gets a device's UUID."""
    text = StringAgg(
        Concat(Cast("pk", CharField()), Value(":"), "instance_uuid", output_field=CharField()),
        delimiter=",",
        order_by="pk",
    )
    found = _live(cluster).aggregate(
        count=Count("pk"), digest=Func(Coalesce(text, Value("")), function="MD5", output_field=CharField())
    )
    return f"{found['count']}:{found['digest']}"


def _asked(cluster: Cluster, at: Collection[tuple[str, str]] | None = None) -> Iterable[Asked]:
    """What the cluster's scheduled GPU pods ask, per node, namespace and resource, summed in SQL; with `at`,
    on those (node, namespace) only."""
    rows = WorkloadProfile.objects.filter(cluster=cluster, present=True, phase__in=USES)
    if at is not None:
        rows = rows.filter(node_name__in={node for node, _ in at}, namespace__in={ns for _, ns in at})
    rows = (
        rows.exclude(node_name="")
        .exclude(resource_name=CLAIMS_ROW)
        .values("node_name", "namespace", "resource_name")
        .annotate(total=Sum("count"), pods=ArrayAgg("pod_name", order_by="pod_name"))
        .order_by("node_name", "namespace", "resource_name")
    )
    for row in rows.iterator(chunk_size=2000):
        if at is not None and (row["node_name"], row["namespace"]) not in at:
            continue
        yield Asked(
            row["node_name"], row["namespace"], row["resource_name"], row["total"], tuple(row["pods"])
        )


def _releasing(claims: list[ClaimInfo], cluster: Cluster) -> set[str]:
    """The pool labels of the portal's claims whose pool is being released."""
    labels = {claim.pool for claim in claims if claim.pool.isdigit()}
    ids = Pool.objects.filter(
        cluster=cluster, pk__in=[int(label) for label in labels], state=PoolState.RELEASING
    ).values_list("pk", flat=True)
    return {str(pk) for pk in ids}


def record_trespasses(
    *,
    cluster: Cluster,
    claims: list[ClaimInfo],
    now: datetime,
    pods_at: Collection[tuple[str, str]] | None = None,
) -> int:
    """Open a row for each trespass first seen, refresh the ones still there, end the ones gone; returns how
    many are open (of those looked at). Runs in the sync's transaction, under the cluster's sync lock, after
    the pods' rows. With `pods_at`, the (node, namespace) pairs where pods changed, only the pods' trespasses
    there are looked at; the claims' stay as they are."""
    open_rows = Trespass.objects.filter(cluster=cluster, ended_at__isnull=True).select_related("node")
    if pods_at is None:
        releasing = _releasing(claims, cluster)
        counted = [claim for claim in claims if claim.pool not in releasing]
        found = {f.key: f for f in find_trespasses(_asked(cluster), counted, _held(cluster))}
    else:
        nodes = {node for node, _namespace in pods_at}
        found = {f.key: f for f in find_trespasses(_asked(cluster, pods_at), [], _held(cluster, nodes))}
        open_rows = open_rows.filter(device_uuid="", node__name__in=nodes)
    open_rows = {
        (row.namespace, row.node.name if row.node else "", row.resource_name, row.device_uuid): row
        for row in open_rows
        if pods_at is None or (row.node.name, row.namespace) in pods_at
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


def _published(node_ids: set[int]) -> tuple[set[int], set[str]]:
    """Of these nodes, those whose devices the last sync could read (present, no error, no MIG change under
    way), and the UUIDs of their devices as their GPU rows keep them."""
    read = set(
        NodeCapacity.objects.filter(
            pk__in=node_ids, present=True, error="", mig_state=MigState.SUCCESS
        ).values_list("pk", flat=True)
    )
    uuids: set[str] = set()
    for uuid, mig_enabled, layout in GpuCapacity.objects.filter(node_id__in=read, present=True).values_list(
        "uuid", "mig_enabled", "layout"
    ):
        if mig_enabled:
            uuids.update(i.get("uuid", "") for i in layout)
        else:
            uuids.add(uuid)
    return read, uuids - {""}


def record_vanished(*, cluster: Cluster, now: datetime) -> int:
    """Under DRA, mark the live claimed allocations whose device the driver no longer publishes, and unmark
    those whose device is back; returns how many are marked. Runs in the sync's transaction, once the nodes
    are written."""
    live = _live(cluster).exclude(instance_uuid="")
    if cluster.binding != DRA:  # nothing is claimed: no device can have vanished
        marked = list(live.filter(device_vanished_at__isnull=False).values_list("pk", flat=True))
        if marked:
            Allocation.objects.filter(pk__in=marked).update(device_vanished_at=None)
        return 0
    found = list(live.values_list("pk", "gpu__node_id", "profile", "instance_uuid", "device_vanished_at"))
    read, uuids = _published({node for _pk, node, *_rest in found})
    rows = [(pk, profile, uuid, at) for pk, node, profile, uuid, at in found if node in read]
    gone = {pk for pk, profile, uuid, _at in rows if kind_of(profile).own_device and uuid not in uuids}
    back = [pk for pk, _profile, _uuid, at in rows if at is not None and pk not in gone]
    newly = [pk for pk, _profile, _uuid, at in rows if at is None and pk in gone]
    if newly:
        Allocation.objects.filter(pk__in=newly).update(device_vanished_at=now)
    if back:
        Allocation.objects.filter(pk__in=back).update(device_vanished_at=None)
    return len(gone)
