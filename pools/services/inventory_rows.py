"""The rows of a cluster's inventory made to match what its driver reported: nodes (with their share mode),
GPUs, the resources each node advertises (SpecAndCount; shared GPUs under the node's share profile) and the
GPU pods running (WorkloadProfile), with the devices each uses through its claims.

Only the inventory service (pools/services/inventory.py) calls `write_inventory`, under the cluster's sync
lock and inside a transaction of its own, once per page of a list or batch of watched changes; the
cluster's own state (status, failures, back-off) is the service's to write. A write covers a scope of rows:
those a watch named, or those whose list keys fall in a page's range; a row in scope that the write does not
bring has left the cluster and is marked absent, never deleted. What did not change is not written, in a
number of queries that does not depend on the size of the fleet or the scope.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Collection, Iterable
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from django.db.models import QuerySet, Value
from django.db.models.functions import Collate, Concat

from pools.conf import settings
from pools.drivers.base import ClaimInfo, NodeInfo, Page, PodInfo, list_key
from pools.kinds import SHARED_RESOURCE, profile_of_resource
from pools.models import Cluster, GpuCapacity, Health, NodeCapacity, SpecAndCount, WorkloadProfile
from portal.models import Project

NODE_FIELDS = (
    "gpu_model",
    "gpu_count",
    "ready",
    "mig_strategy",
    "mig_config",
    "mig_state",
    "sharing",
    "sharing_config",
    "present",
    "error",
)
GPU_FIELDS = ("uuid", "model", "memory_mib", "mig_capable", "mig_enabled", "layout", "health", "present")
SPEC_FIELDS = ("profile", "capacity", "allocatable")
WORKLOAD_FIELDS = ("node_name", "count", "phase", "project_id", "devices", "present")
CLAIMS_ROW = ""  # the resource name of a pod's row for the devices of its claims
BATCH = 500


def _counts(*kinds: str) -> dict[str, int]:
    return dict.fromkeys(kinds, 0)


@dataclass
class SyncReport:
    """What one sync found: whether the cluster could be read (else why not), and how many rows of each kind
    were new, changed or gone; whether it listed the cluster (whole, or a stream whose version expired), and
    how many changes its watch brought."""

    cluster: str
    ok: bool = True
    error: str = ""
    created: dict[str, int] = field(default_factory=lambda: _counts("nodes", "gpus", "specs", "workloads"))
    updated: dict[str, int] = field(default_factory=lambda: _counts("nodes", "gpus", "specs", "workloads"))
    vanished: dict[str, int] = field(default_factory=lambda: _counts("nodes", "gpus", "workloads"))
    listed: bool = False
    watched: int = 0
    # (node, namespace) of each GPU pod row written: where the pods' trespasses may have changed.
    pods_at: set[tuple[str, str]] = field(default_factory=set)

    @property
    def rows(self) -> int:
        """How many rows were new, changed or gone."""
        return sum(self.created.values()) + sum(self.updated.values()) + sum(self.vanished.values())

    @property
    def changed(self) -> bool:
        return self.rows > 0

    def summary(self) -> str:
        if not self.ok:
            return f"{self.cluster}: failed: {self.error}"
        parts = [
            f"{what} {verb} {count}"
            for verb, counts in (("new", self.created), ("changed", self.updated), ("gone", self.vanished))
            for what, count in counts.items()
            if count
        ]
        return f"{self.cluster}: " + (", ".join(parts) if parts else "no change")


@dataclass(frozen=True)
class Scope:
    """The rows a write covers: those of the list keys a watch brought (`keys`), or those whose list keys
    fall after `after` up to `upto` (a page of a list; None: from the start, to the end)."""

    keys: frozenset[str] | None = None
    after: str | None = None
    upto: str | None = None

    @classmethod
    def of_page(cls, page: Page) -> Scope:
        return cls(after=page.after, upto=page.upto)

    @classmethod
    def of_keys(cls, keys: Collection[str]) -> Scope:
        return cls(keys=frozenset(keys))

    def _in_range(self, rows: QuerySet, key) -> QuerySet:
        # Compared byte by byte, as the API server orders its lists.
        rows = rows.annotate(list_key=Collate(key, "C"))
        if self.after is not None:
            rows = rows.filter(list_key__gt=self.after)
        if self.upto is not None:
            rows = rows.filter(list_key__lte=self.upto)
        return rows

    def nodes(self, cluster: Cluster) -> QuerySet[NodeCapacity]:
        rows = NodeCapacity.objects.filter(cluster=cluster)
        return rows.filter(name__in=self.keys) if self.keys is not None else self._in_range(rows, "name")

    def workloads(self, cluster: Cluster) -> list[WorkloadProfile]:
        rows = WorkloadProfile.objects.filter(cluster=cluster)
        if self.keys is None:
            return list(self._in_range(rows, Concat("namespace", Value("/"), "pod_name")))
        names = {key.rpartition("/")[2] for key in self.keys}
        return [w for w in rows.filter(pod_name__in=names) if list_key(w.namespace, w.pod_name) in self.keys]


def write_inventory(
    *,
    cluster: Cluster,
    now: datetime,
    report: SyncReport,
    nodes: Iterable[NodeInfo] = (),
    node_scope: Scope | None = None,
    pods: Iterable[PodInfo] = (),
    pod_scope: Scope | None = None,
    claims: Iterable[ClaimInfo] = (),
) -> None:
    """Write what changed of the nodes (with their GPUs and specs) in `node_scope` and the GPU pods in
    `pod_scope` (`claims`: the cluster's, for the devices of the pods' claims), counting it in `report`."""
    if node_scope is not None:
        _sync_nodes(cluster, list(nodes), node_scope, now, report)
    if pod_scope is not None:
        _sync_workloads(cluster, list(pods), pod_scope, list(claims), now, report)


def pod_uses(
    pods: list[PodInfo], claims: list[ClaimInfo]
) -> dict[tuple[str, str], dict[str, list[str] | int]]:
    """Per pod (namespace, name), what it uses: {resource: count}, and under CLAIMS_ROW the UUIDs of the
    devices allocated to its claims (a claim not allocated yet adds none)."""
    devices = {(claim.namespace, claim.name): claim.devices for claim in claims}
    uses: dict[tuple[str, str], dict] = {}
    for pod in pods:
        found = dict(pod.resources)
        if pod.claims:
            found[CLAIMS_ROW] = [d for name in pod.claims for d in devices.get((pod.namespace, name), ())]
        uses[(pod.namespace, pod.name)] = found
    return uses


def heartbeat_due(last: datetime | None, now: datetime) -> bool:
    """Whether a "last seen" time is old enough to be written again although nothing changed."""
    return last is None or now - last >= timedelta(seconds=settings.SYNC_HEARTBEAT_SECONDS)


# --- nodes, GPUs, specs ------------------------------------------------------------------


def _apply(
    model,
    rows: dict,
    wanted: dict,
    fields: tuple[str, ...],
    now: datetime,
    make,
    unique_fields: tuple[str, ...] = (),
) -> tuple[int, int]:
    """Create missing rows and update changed ones; returns (created, updated).

    With `unique_fields`, a row that another transaction inserted meanwhile (it committed after
    this sync read the table) is updated instead of failing on the unique constraint.
    """
    to_create, to_update = {}, defaultdict(list)
    for key, values in wanted.items():
        row = rows.get(key)
        if row is None:
            row = make(key, values)
            to_create[key] = row
            rows[key] = row
        elif changed := tuple(name for name, value in values.items() if getattr(row, name) != value):
            for name in changed:
                setattr(row, name, values[name])
            row.last_change_at = now
            to_update[changed].append(row)
    if unique_fields and to_create:
        # INSERT … ON CONFLICT DO UPDATE of the synced fields only: what the other writer owns
        # (the allocated count, recounted under the capacity lock) stays as it wrote it. Rows go
        # in key order so that two such inserts wait for each other instead of deadlocking.
        model.objects.bulk_create(
            [to_create[key] for key in sorted(to_create)],
            batch_size=BATCH,
            update_conflicts=True,
            unique_fields=unique_fields,
            update_fields=[*fields, "last_change_at"],
        )
    else:
        model.objects.bulk_create(to_create.values(), batch_size=BATCH)
    # One statement per set of fields that changed: a statement's size grows with rows × fields.
    for changed, updated in to_update.items():
        model.objects.bulk_update(updated, [*changed, "last_change_at"], batch_size=BATCH)
    return len(to_create), sum(len(updated) for updated in to_update.values())


def _mark_absent(model, rows: Iterable, now: datetime) -> int:
    gone = [row for row in rows if row.present]
    for row in gone:
        row.present = False
        row.last_change_at = now
    if gone:
        model.objects.bulk_update(gone, ["present", "last_change_at"], batch_size=BATCH)
    return len(gone)


def _clear_reached_plans(gpus: dict, wanted: dict, sharing: dict[int, str]) -> None:
    """A layout the queue planned is forgotten once the cluster reports it: the same MIG mode and profiles,
    or for a GPU planned MIG-off, its node in the planned share mode (`sharing`: per node id, as read)."""
    reached = [
        gpu.pk
        for key, gpu in gpus.items()
        if gpu.planned_layout is not None
        and key in wanted
        and _reached(gpu.planned_layout, wanted[key], sharing.get(key[0]))
    ]
    if reached:
        GpuCapacity.objects.filter(pk__in=reached).update(planned_layout=None)


def _reached(planned: dict, reported: dict, sharing: str | None) -> bool:
    if reported["mig_enabled"] != planned["mig"]:
        return False
    if not planned["mig"]:
        return sharing == planned.get("sharing", "")
    return sorted(i["profile"] for i in reported["layout"]) == sorted(
        i["profile"] for i in planned["instances"]
    )


def _node_values(info: NodeInfo, previous: NodeCapacity | None, now: datetime) -> dict:
    """The node row as the cluster reports it; what it cannot tell now is kept as last known."""
    readable = info.gpus_known and not info.error
    return {
        "gpu_model": info.gpu_model or (previous.gpu_model if previous else ""),
        "gpu_count": len(info.gpus) if readable or previous is None else previous.gpu_count,
        "ready": info.ready,
        "mig_strategy": info.mig_strategy,
        "mig_config": info.mig_config,
        "mig_state": info.mig_state,
        "mig_state_since": (
            previous.mig_state_since if previous and previous.mig_state == info.mig_state else now
        ),
        # A node that cannot be read keeps the share mode last read, as it keeps its GPUs.
        "sharing": previous.sharing if info.error and previous else info.sharing,
        "sharing_config": info.sharing_config,
        "present": True,
        "error": info.error,
    }


def _spec_profile(resource: str, info: NodeInfo) -> str:
    """The profile a node's resource gives out: the resource says which, but for shared GPUs, whose
    profile (how many shares per GPU) the node's share mode says."""
    if resource == SHARED_RESOURCE and info.sharing:
        return info.sharing
    return profile_of_resource(resource) or resource


def _sync_nodes(
    cluster: Cluster, infos: list[NodeInfo], scope: Scope, now: datetime, report: SyncReport
) -> None:
    nodes = {n.name: n for n in scope.nodes(cluster)}
    wanted = {info.name: _node_values(info, nodes.get(info.name), now) for info in infos}
    created, updated = _apply(
        NodeCapacity,
        nodes,
        wanted,
        NODE_FIELDS,
        now,
        lambda name, values: NodeCapacity(cluster=cluster, name=name, **values),
    )
    report.created["nodes"] += created
    report.updated["nodes"] += updated
    gone = [node for name, node in nodes.items() if name not in wanted]
    report.vanished["nodes"] += _mark_absent(NodeCapacity, gone, now)

    ids = [node.pk for node in nodes.values()]
    gpus = {(g.node_id, g.index): g for g in GpuCapacity.objects.filter(node_id__in=ids)}
    specs = {(s.node_id, s.resource_name): s for s in SpecAndCount.objects.filter(node_id__in=ids)}
    specs_by_node = defaultdict(list)
    for key, spec in specs.items():
        specs_by_node[key[0]].append((key, spec))
    wanted_gpus, wanted_specs = {}, {}
    readable = set()
    for info in infos:
        if info.error:
            continue  # keep the node's last good picture; the error is shown on the node
        node_id = nodes[info.name].pk
        if info.gpus_known:  # else a MIG change is under way: keep the GPUs as last known
            readable.add(node_id)
        for gpu in info.gpus if info.gpus_known else ():
            wanted_gpus[(node_id, gpu.index)] = {
                "uuid": gpu.uuid,
                "model": gpu.model,
                "memory_mib": gpu.memory_mib,
                "mig_capable": gpu.mig_capable,
                "mig_enabled": gpu.mig_enabled,
                "layout": [{"profile": i.profile, "start": i.start, "uuid": i.uuid} for i in gpu.instances],
                "health": gpu.health if gpu.health in Health.values else Health.UNKNOWN,
                "present": True,
            }
        for resource, count in info.resources.items():
            wanted_specs[(node_id, resource)] = {
                "profile": _spec_profile(resource, info),
                "capacity": count.capacity,
                "allocatable": count.allocatable,
            }
        for key, spec in specs_by_node[node_id]:  # resources the node no longer advertises
            if key not in wanted_specs and (spec.capacity or spec.allocatable):
                wanted_specs[key] = {"profile": spec.profile, "capacity": 0, "allocatable": 0}

    _clear_reached_plans(gpus, wanted_gpus, {nodes[i.name].pk: i.sharing for i in infos if not i.error})
    created, updated = _apply(
        GpuCapacity,
        gpus,
        wanted_gpus,
        GPU_FIELDS,
        now,
        lambda key, values: GpuCapacity(node_id=key[0], index=key[1], **values),
    )
    report.created["gpus"] += created
    report.updated["gpus"] += updated
    gone_nodes = {node.pk for node in gone}
    report.vanished["gpus"] += _mark_absent(
        GpuCapacity,
        (
            g
            for key, g in gpus.items()
            if key not in wanted_gpus and (key[0] in readable or key[0] in gone_nodes)
        ),
        now,
    )
    created, updated = _apply(
        SpecAndCount,
        specs,
        wanted_specs,
        SPEC_FIELDS,
        now,
        lambda key, values: SpecAndCount(node_id=key[0], resource_name=key[1], **values),
        # Provisioning syncs too, and admission may insert a row for a profile not advertised yet.
        unique_fields=("node", "resource_name"),
    )
    report.created["specs"] += created
    report.updated["specs"] += updated


# --- workloads -------------------------------------------------------------------------------


def _sync_workloads(
    cluster: Cluster,
    pods: list[PodInfo],
    scope: Scope,
    claims: list[ClaimInfo],
    now: datetime,
    report: SyncReport,
) -> None:
    rows = {(w.namespace, w.pod_name, w.resource_name): w for w in scope.workloads(cluster)}
    namespaces = {pod.namespace for pod in pods}
    projects = dict(Project.objects.filter(namespace__in=namespaces).values_list("namespace", "id"))
    uses = pod_uses(pods, claims)
    wanted = {
        (pod.namespace, pod.name, resource): {
            "node_name": pod.node,
            "count": len(used) if resource == CLAIMS_ROW else used,
            "phase": pod.phase,
            "project_id": projects.get(pod.namespace),
            "devices": used if resource == CLAIMS_ROW else [],
            "present": True,
        }
        for pod in pods
        for resource, used in uses[(pod.namespace, pod.name)].items()
    }
    to_create, to_update = [], defaultdict(list)
    for key, values in wanted.items():
        row = rows.get(key)
        if row is None:
            namespace, pod_name, resource = key
            to_create.append(
                WorkloadProfile(
                    cluster=cluster,
                    namespace=namespace,
                    pod_name=pod_name,
                    resource_name=resource,
                    last_seen_at=now,
                    **values,
                )
            )
            report.pods_at.add((values["node_name"], namespace))
            continue
        changed = tuple(name for name, value in values.items() if getattr(row, name) != value)
        if changed or heartbeat_due(row.last_seen_at, now):
            report.pods_at.update({(row.node_name, row.namespace), (values["node_name"], row.namespace)})
            for name in changed:
                setattr(row, name, values[name])
            row.last_seen_at = now
            to_update[changed].append(row)
    WorkloadProfile.objects.bulk_create(to_create, batch_size=BATCH)
    for changed, updated in to_update.items():
        WorkloadProfile.objects.bulk_update(updated, [*changed, "last_seen_at"], batch_size=BATCH)
    gone = [row for key, row in rows.items() if key not in wanted and row.present]
    for row in gone:
        row.present = False
        report.pods_at.add((row.node_name, row.namespace))
    if gone:
        WorkloadProfile.objects.bulk_update(gone, ["present"], batch_size=BATCH)
    report.created["workloads"] += len(to_create)
    report.updated["workloads"] += sum(len(updated) for updated in to_update.values())
    report.vanished["workloads"] += len(gone)
