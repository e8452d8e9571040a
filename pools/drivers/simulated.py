"""SimulatedDriver: an embedded GPU fleet that behaves like a cluster with the GPU Operator.

Layout changes go `pending` → `success` after SIMULATED_MIG_APPLY_SECONDS (or end
`failed`, or wedge in `pending` with no GPUs advertised, when told to). A node's
sharing changes as its device plugin would: after the same delay its MIG-off GPUs
are advertised as nvidia.com/gpu.shared, N each (or, when told to, the plugin
fails and advertises none of them, or stalls and never applies). Quotas make pods
appear in their namespace. The state lives in one database row per
cluster, so the web, worker and beat processes all see the same fleet; time moves
on whenever the state is read.

It is followed as a Kubernetes cluster is, by list and watch (base.py): each time the state is read or
written, what changed of each node, pod and claim since the last time (the operator's doing, time moving
on, or a test editing the state) is logged under a new version, and a watch tells what the log holds after
the version it is given (pools/drivers/simulated_log.py).
"""

from __future__ import annotations

import hashlib
import json
import time
import uuid
from collections.abc import Collection, Iterator, Mapping, Sequence
from contextlib import contextmanager
from datetime import datetime, timedelta

from django.db import transaction
from django.utils import timezone
from django.utils.dateparse import parse_datetime
from django.utils.translation import gettext as _

from pools import kinds, mig
from pools.conf import settings
from pools.drivers import admission, device_plugin, simulated_log
from pools.drivers.base import (
    CLAIMS,
    DEVICE_PLUGIN,
    DRA,
    NODES,
    PODS,
    Binding,
    CaughtUp,
    ClaimChange,
    ClaimInfo,
    ClusterUnreachable,
    DeviceClaim,
    DriverError,
    GpuInfo,
    GpuLayout,
    MigInstanceInfo,
    MigStatus,
    NamespaceNotManaged,
    NodeChange,
    NodeInfo,
    Page,
    PodChange,
    PodInfo,
    Progress,
    ResourceCount,
    SharingStatus,
    Versions,
    WatchItem,
    list_key,
    portal_manages,
    register,
)
from pools.gpu_models import NoGeometry, model_info
from pools.mig import MigState
from pools.models import Cluster, SimulatedClusterState

OUTCOMES = ("success", "failed", "wedge")
SIMULATED_PORTAL_USER = "system:serviceaccount:gpu-portal:gpu-portal"
SHARING_OUTCOMES = ("success", "failed", "stall")  # as the test API server's device plugin

# The demo fleet: per cluster, (node name prefix, node count, GPU model, per-GPU layouts to start with).
# A layout is None for a MIG-disabled GPU, or a {profile: count} map.
H200_MIXED = [
    {"1g.18gb": 7},
    {"3g.71gb": 2},
    {"4g.71gb": 1, "2g.35gb": 1, "1g.18gb": 1},
    {"2g.35gb": 3, "1g.18gb": 1},
    None,
    None,
    None,
    None,
]
DEMO_FLEETS: dict[str, list[tuple[str, int, str, list[dict[str, int] | None]]]] = {
    "seoul-a": [
        ("h200-train", 3, "H200-141GB", [None] * 8),
        ("h200-serve", 3, "H200-141GB", H200_MIXED),
        ("l40s-serve", 1, "L40S-48GB", [None] * 4),
    ],
    "busan-b": [
        (
            "h100-dev",
            3,
            "H100-80GB",
            [{"1g.10gb": 7}, {"1g.10gb": 7}, {"2g.20gb": 3, "1g.10gb": 1}] + [None] * 5,
        ),
        ("a100-train", 3, "A100-80GB", [None] * 8),
        ("a100-share", 1, "A100-80GB", [None] * 4),
    ],
}
PRODUCT_LABELS = {
    "A100-40GB": ("NVIDIA-A100-SXM4-40GB", 40960),
    "A100-80GB": ("NVIDIA-A100-SXM4-80GB", 81920),
    "H100-80GB": ("NVIDIA-H100-80GB-HBM3", 81559),
    "H200-141GB": ("NVIDIA-H200", 143771),
    "B200-180GB": ("NVIDIA-B200", 183359),
    "L40S-48GB": ("NVIDIA-L40S", 46068),
}


def _new_uuid(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4()}"


def _instances(model: str, counts: Mapping[str, int] | None) -> list[dict]:
    if counts is None:
        return []
    placed = mig.place_profiles(mig.gpu_model(model), counts)
    if placed is None:
        raise DriverError(f"{dict(counts)} does not fit on one {model}.")
    return [{"profile": i.profile, "start": i.start, "uuid": _new_uuid("MIG")} for i in placed]


def node_state(model: str, layouts: Sequence[Mapping[str, int] | None]) -> dict:
    """A simulated node with one GPU per layout (None: MIG off, else {profile: count})."""
    return {
        "model": model,
        "ready": True,
        "mig_config": "all-disabled",
        "mig_state": MigState.SUCCESS.value,
        "pending": None,
        "next_outcome": "success",
        "sharing": "",  # the share profile its MIG-off GPUs are advertised as, as applied
        "sharing_config": "",  # the device plugin config its label asks for
        "sharing_pending": None,
        "next_sharing_outcome": "success",
        "gpus": [
            {
                "uuid": _new_uuid("GPU"),
                "mig": layout is not None,
                "instances": _instances(model, layout),
                "health": "ok",
            }
            for layout in layouts
        ],
    }


def fleet_state(nodes: Sequence[tuple[str, int, str, Sequence[Mapping[str, int] | None]]]) -> dict:
    """A fresh simulated cluster from (name prefix, node count, GPU model, per-GPU layouts)."""
    state: dict = {"reachable": True, "nodes": {}, "namespaces": {}, "quotas": {}, "pods": []}
    for prefix, count, model, layouts in nodes:
        for n in range(1, count + 1):
            state["nodes"][f"{prefix}-{n}"] = node_state(model, layouts)
    return state


@register("simulated")
class SimulatedDriver:
    def __init__(self, cluster: Cluster):
        self.cluster = cluster

    # --- reading -------------------------------------------------------------

    def inventory(self, names: Collection[str] | None = None) -> list[NodeInfo]:
        """Every node, or those named (that the cluster has)."""
        with self._state() as state:
            return [
                self._node_info(name, node)
                for name, node in sorted(state["nodes"].items())
                if names is None or name in names
            ]

    def workloads(self, keys: Collection[str] | None = None) -> list[PodInfo]:
        """The GPU pods, or those of these list keys."""
        with self._state() as state:
            return [
                PodInfo(
                    p["namespace"],
                    p["name"],
                    p["node"],
                    p["phase"],
                    dict(p["resources"]),
                    tuple(p.get("claims", ())),
                )
                for p in state["pods"]
                if simulated_log.holds_gpu(p) and (keys is None or simulated_log.pod_key(p) in keys)
            ]

    def list_nodes(self) -> Iterator[Page[NodeInfo]]:
        version = self._version()
        yield from simulated_log.paged(self.inventory(), lambda node: node.name, {NODES: version})

    def list_pods(self) -> Iterator[Page[PodInfo]]:
        version = self._version()
        yield from simulated_log.paged(
            self.workloads(), lambda pod: list_key(pod.namespace, pod.name), {PODS: version}
        )

    def list_claims(self) -> Iterator[Page[ClaimInfo]]:
        version = self._version()
        yield Page(tuple(self.claims()), None, None, {CLAIMS: version})

    def watch(self, since: Versions, *, seconds: float) -> Iterator[WatchItem]:
        """What the log holds after each stream's version. The simulated cluster changes only as it is read
        or written, so the watch ends once caught up, well within `seconds`."""
        since = {stream: version for stream, version in since.items() if stream in (NODES, PODS, CLAIMS)}
        if not since:
            return
        with self._state() as state:
            changed, version = simulated_log.logged(state["watch"], since)
        nodes = {node.name: node for node in self.inventory(changed[NODES])} if changed[NODES] else {}
        pods = (
            {list_key(pod.namespace, pod.name): pod for pod in self.workloads(changed[PODS])}
            if changed[PODS]
            else {}
        )
        for name in changed[NODES]:
            yield NodeChange(NODES, version, name, nodes.get(name))
        for key in changed[PODS]:
            namespace, _slash, name = key.partition("/")
            yield PodChange(PODS, version, namespace, name, pods.get(key))
        for key in changed[CLAIMS]:
            namespace, _slash, name = key.partition("/")
            yield ClaimChange(CLAIMS, version, namespace, name)
        for stream in since:
            yield Progress(stream, version)
        yield CaughtUp()

    def _version(self) -> str:
        with self._state() as state:
            return simulated_log.version_of(state["watch"])

    def binding(self) -> Binding:
        with self._state() as state:
            if state.get("dra"):
                return Binding(DRA)
        return Binding(
            DEVICE_PLUGIN, _("This simulated cluster binds through the device plugin's resources.")
        )

    def claims(self) -> list[ClaimInfo]:
        with self._state() as state:
            nodes = self._device_nodes(state)
            return [
                ClaimInfo(
                    c["namespace"],
                    c["name"],
                    c.get("pool", ""),
                    (c["uuid"],) if c["uuid"] in nodes else ("",),
                    nodes.get(c["uuid"], ""),
                )
                for c in state.get("claims", [])
            ]

    @staticmethod
    def _device_nodes(state: dict) -> dict[str, str]:
        """The node of every device by UUID: MIG-off GPUs and MIG instances."""
        found = {}
        for name, node in state["nodes"].items():
            for gpu in node["gpus"]:
                if gpu["mig"]:
                    found.update({i["uuid"]: name for i in gpu["instances"]})
                else:
                    found[gpu["uuid"]] = name
        return found

    def mig_state(self, node: str) -> MigStatus:
        with self._state() as state:
            found = self._node(state, node)
            return MigStatus(config=found["mig_config"], state=MigState(found["mig_state"]))

    def sharing_state(self, node: str) -> SharingStatus:
        with self._state() as state:
            found = self._node(state, node)
            return SharingStatus(config=found.get("sharing_config", ""), sharing=found.get("sharing", ""))

    # --- changing --------------------------------------------------------------

    def apply_mig_layout(self, node: str, layout: Sequence[GpuLayout]) -> str:
        with self._state(write=True) as state:
            found = self._node(state, node)
            model = model_info(found["model"])
            for gpu in layout:
                if not 0 <= gpu.index < len(found["gpus"]):
                    raise DriverError(f"{node} has no GPU {gpu.index}.")
                if gpu.mig_enabled:
                    try:
                        mig.validate_layout(
                            model.geometry(), [mig.Instance(i.start, i.profile) for i in gpu.instances]
                        )
                    except (mig.LayoutError, NoGeometry) as error:
                        raise DriverError(f"{node} GPU {gpu.index}: {error}") from None
            # A change still pending keeps its layouts for the GPUs not listed here, as the GPU Operator's
            # config does (the driver protocol's rule).
            earlier = (found.get("pending") or {}).get("layout") or {}
            wanted = {int(index): value for index, value in earlier.items()}
            wanted.update(
                {
                    g.index: {"mig": g.mig_enabled, "instances": [[i.profile, i.start] for i in g.instances]}
                    for g in layout
                }
            )
            digest = hashlib.sha256(json.dumps(sorted(wanted.items())).encode()).hexdigest()[:10]
            config = f"portal-{node}-{digest}"
            due = timezone.now() + timedelta(seconds=settings.SIMULATED_MIG_APPLY_SECONDS)
            found["mig_config"] = config
            found["mig_state"] = MigState.PENDING.value
            found["pending"] = {"layout": {str(k): v for k, v in wanted.items()}, "due": due.isoformat()}
            return config

    def apply_sharing(self, node: str, profile: str) -> str:
        device_plugin.check_profile(profile)
        with self._state(write=True) as state:
            found = state["nodes"].get(node)
            if found is None:
                raise device_plugin.no_such_node(node)
            if found.get("pending") is not None or found["mig_state"] in mig.MIG_CHANGING:
                raise device_plugin.mig_change_pending(node)
            config = device_plugin.config_key(profile)
            if found.get("sharing_config", "") != config:  # the plugin follows a label change only
                due = timezone.now() + timedelta(seconds=settings.SIMULATED_MIG_APPLY_SECONDS)
                found["sharing_config"] = config
                found["sharing_pending"] = {"sharing": profile, "due": due.isoformat()}
            return config

    def ensure_namespace(self, namespace: str, labels: Mapping[str, str]) -> None:
        with self._state(write=True) as state:
            existing = state["namespaces"].get(namespace)
            if existing is None:
                state["namespaces"][namespace] = {"labels": dict(labels)}
            elif portal_manages(existing["labels"]):
                existing["labels"].update(labels)
            else:  # the same contract as a real cluster: someone else's namespace is never taken over
                raise NamespaceNotManaged(namespace)

    def ensure_admission_policy(self) -> str:
        """The policy kept in the state, as a cluster keeps it; the portal's user there is the service
        account the manifests make. The state is written only when one of the two drifted."""
        wanted = [admission.portal_policy(SIMULATED_PORTAL_USER), admission.portal_policy_binding()]
        with self._state() as state:
            found = state.get("admission", {})
            drifts = [(obj, admission.drift(obj, found.get(obj["kind"]))) for obj in wanted]
        drifted = [(obj, drift) for obj, drift in drifts if drift]
        if drifted:
            with self._state(write=True) as state:
                state.setdefault("admission", {}).update({obj["kind"]: obj for obj, _drift in drifted})
        return " ".join(admission.restored_text(obj, drift) for obj, drift in drifted)

    def bind_namespace(self, namespace: str, binding: str, nodes: Sequence[str]) -> None:
        with self._state(write=True) as state:
            found = state["namespaces"].get(namespace)
            if found is None:
                raise DriverError(f"namespace {namespace} does not exist")
            if not portal_manages(found["labels"]):
                raise NamespaceNotManaged(namespace)
            found["annotations"] = admission.namespace_annotations(binding, nodes)

    def apply_claims(self, namespace: str, pool: str, claims: Sequence[DeviceClaim]) -> None:
        with self._state(write=True) as state:
            if namespace not in state["namespaces"]:
                raise DriverError(f"namespace {namespace} does not exist")
            kept = [
                c for c in state.get("claims", []) if (c["namespace"], c.get("pool")) != (namespace, pool)
            ]
            state["claims"] = kept + [
                {
                    "namespace": namespace,
                    "name": c.name,
                    "pool": pool,
                    "uuid": c.uuid,
                    "whole_gpu": c.whole_gpu,
                }
                for c in claims
            ]

    def apply_quota(self, namespace: str, resources: Mapping[str, int]) -> None:
        with self._state(write=True) as state:
            if namespace not in state["namespaces"]:
                raise DriverError(f"namespace {namespace} does not exist")
            state["quotas"][namespace] = {r: n for r, n in resources.items() if n > 0}
            self._run_pods(state, namespace)

    def remove_quota(self, namespace: str) -> None:
        with self._state(write=True) as state:
            state["quotas"].pop(namespace, None)
            self._run_pods(state, namespace)

    # --- failure injection, for the demo and the tests -------------------------------

    def set_next_outcome(self, node: str, outcome: str) -> None:
        if outcome not in OUTCOMES:
            raise ValueError(f"outcome must be one of {', '.join(OUTCOMES)}")
        with self._state(write=True) as state:
            self._node(state, node)["next_outcome"] = outcome

    def set_next_sharing_outcome(self, node: str, outcome: str) -> None:
        """What the node's device plugin does with its next config: apply it, fail (advertising none of
        the MIG-off GPUs), or stall (never apply it)."""
        if outcome not in SHARING_OUTCOMES:
            raise ValueError(f"outcome must be one of {', '.join(SHARING_OUTCOMES)}")
        with self._state(write=True) as state:
            self._node(state, node)["next_sharing_outcome"] = outcome

    def set_gpu_health(self, node: str, index: int, health: str) -> None:
        with self._state(write=True) as state:
            self._node(state, node)["gpus"][index]["health"] = health

    def set_latency(self, seconds: float) -> None:
        """Make every call of this cluster take this long, like a slow or distant API server."""
        with self._state(write=True) as state:
            state["latency_seconds"] = seconds

    def set_reachable(self, reachable: bool) -> None:
        with self._state(write=True, check_reachable=False) as state:
            state["reachable"] = reachable

    def add_node(self, name: str, model: str, layouts: Sequence[Mapping[str, int] | None]) -> None:
        with self._state(write=True) as state:
            state["nodes"][name] = node_state(model, layouts)

    def remove_node(self, name: str) -> None:
        with self._state(write=True) as state:
            state["nodes"].pop(name)

    def compact(self) -> None:
        """Forget the watch log: a watch from any version before now is Expired."""
        with self._state(write=True) as state:
            simulated_log.compact(state["watch"])

    # --- inside ------------------------------------------------------------------------

    @contextmanager
    def _state(self, write: bool = False, check_reachable: bool = True) -> Iterator[dict]:
        """The cluster's state, with time moved on; saved when it changed."""
        with transaction.atomic():
            row = SimulatedClusterState.objects.select_for_update().filter(cluster_id=self.cluster.pk).first()
            if row is None:
                raise ClusterUnreachable(f"simulated cluster {self.cluster.name} has no fleet")
            state = row.state
            if check_reachable and not state.get("reachable", True):
                raise ClusterUnreachable(f"simulated cluster {self.cluster.name} does not answer")
            if state.get("latency_seconds"):  # a slow API server
                time.sleep(state["latency_seconds"])
            moved = self._advance(state, timezone.now())
            # Logged before it is read too: time moved on, or a test edited the state.
            moved = simulated_log.log_changes(state, self._device_nodes(state)) or moved
            yield state
            if write:
                simulated_log.log_changes(state, self._device_nodes(state))
            if write or moved:
                row.save(update_fields=["state", "updated_at"])

    @staticmethod
    def _node(state: dict, name: str) -> dict:
        try:
            return state["nodes"][name]
        except KeyError:
            raise DriverError(f"node {name} not found") from None

    @staticmethod
    def _advance(state: dict, now: datetime) -> bool:
        moved = False
        for node in state["nodes"].values():
            moved = SimulatedDriver._advance_sharing(node, now) or moved
            pending = node.get("pending")
            if not pending or parse_datetime(pending["due"]) > now:
                continue
            outcome = node.get("next_outcome", "success")
            if outcome == "wedge":
                continue  # stays pending with nothing advertised; see _node_info
            moved = True
            node["pending"] = None
            node["next_outcome"] = "success"
            if outcome == "failed":
                node["mig_state"] = MigState.FAILED.value
                continue
            for index, wanted in pending["layout"].items():
                gpu = node["gpus"][int(index)]
                gpu["mig"] = wanted["mig"]
                gpu["instances"] = [
                    {"profile": profile, "start": start, "uuid": _new_uuid("MIG")}
                    for profile, start in wanted["instances"]
                ]
            node["mig_state"] = MigState.SUCCESS.value
        return moved

    @staticmethod
    def _advance_sharing(node: dict, now: datetime) -> bool:
        pending = node.get("sharing_pending")
        if not pending or pending.get("stalled") or parse_datetime(pending["due"]) > now:
            return False
        outcome = node.get("next_sharing_outcome", "success")
        node["next_sharing_outcome"] = "success"
        if outcome == "stall":  # never applied: the old sharing stays, the label asks for the new one
            pending["stalled"] = True
            return True
        node["sharing_pending"] = None
        node["sharing_failed"] = outcome == "failed"  # labels left as they were, no MIG-off GPU advertised
        if outcome == "success":
            node["sharing"] = pending["sharing"]
        return True

    def _node_info(self, name: str, node: dict) -> NodeInfo:
        model = node["model"]
        if model not in PRODUCT_LABELS:
            return NodeInfo(name=name, ready=node["ready"], error=f"unknown GPU model {model!r}")
        memory_mib = PRODUCT_LABELS[model][1]
        gpus = tuple(
            GpuInfo(
                index=index,
                uuid=gpu["uuid"],
                model=model,
                memory_mib=memory_mib,
                mig_capable=True,
                mig_enabled=gpu["mig"],
                instances=tuple(
                    MigInstanceInfo(i["profile"], i["start"], i["uuid"]) for i in gpu["instances"]
                ),
                health=gpu["health"],
            )
            for index, gpu in enumerate(node["gpus"])
        )
        wedged = node.get("pending") is not None and node.get("next_outcome") == "wedge"
        return NodeInfo(
            name=name,
            ready=node["ready"],
            gpu_model=model,
            gpus=gpus,
            resources={} if wedged else self._resources(node),
            mig_strategy="mixed",
            mig_config=node["mig_config"],
            mig_state=node["mig_state"],
            sharing=node.get("sharing", ""),
            sharing_config=node.get("sharing_config", ""),
            error=(
                f"the GPU Operator failed to apply MIG config {node['mig_config']}"
                if node["mig_state"] == MigState.FAILED
                else ""
            ),
        )

    @staticmethod
    def _resources(node: dict) -> dict[str, ResourceCount]:
        sharing = node.get("sharing", "")
        whole = kinds.SHARED_RESOURCE if sharing else device_plugin.GPU_RESOURCE
        per_gpu = kinds.share_kind(sharing).replicas(sharing) if sharing else 1
        failed = node.get("sharing_failed", False)
        capacity: dict[str, int] = {}
        allocatable: dict[str, int] = {}
        for gpu in node["gpus"]:
            if gpu["mig"]:
                names = [(kinds.resource_name(i["profile"]), 1) for i in gpu["instances"]]
            else:
                names = [] if failed else [(whole, per_gpu)]
            for resource, count in names:
                capacity[resource] = capacity.get(resource, 0) + count
                if gpu["health"] == "ok":
                    allocatable[resource] = allocatable.get(resource, 0) + count
        if failed:
            capacity.setdefault(device_plugin.GPU_RESOURCE, 0)
        elif not node["gpus"] or all(g["mig"] for g in node["gpus"]):
            capacity.setdefault(whole, 0)
        return {r: ResourceCount(capacity[r], allocatable.get(r, 0)) for r in sorted(capacity)}

    def _run_pods(self, state: dict, namespace: str) -> None:
        """Replace the namespace's pods by one pod per unit of its quota, on nodes with room among those the
        admission policy lets it use (its annotation), as a real scheduler would."""
        state["pods"] = [p for p in state["pods"] if p["namespace"] != namespace]
        allowed = (state["namespaces"].get(namespace, {}).get("annotations") or {}).get(
            admission.NODES_ANNOTATION
        )
        used: dict[tuple[str, str], int] = {}
        for pod in state["pods"]:
            for resource, count in pod["resources"].items():
                used[(pod["node"], resource)] = used.get((pod["node"], resource), 0) + count
        free = {
            (name, resource): count.allocatable - used.get((name, resource), 0)
            for name, node in sorted(state["nodes"].items())
            for resource, count in self._resources(node).items()
        }
        for resource, count in sorted(state["quotas"].get(namespace, {}).items()):
            short = resource.removeprefix("nvidia.com/").replace(".", "-")
            for n in range(count):
                node = next(
                    (
                        key[0]
                        for key, left in free.items()
                        if key[1] == resource
                        and left > 0
                        and (allowed is None or key[0] in allowed.split(","))
                    ),
                    "",
                )
                if node:
                    free[(node, resource)] -= 1
                state["pods"].append(
                    {
                        "namespace": namespace,
                        "name": f"{short}-worker-{n}",
                        "node": node,
                        "phase": "Running" if node else "Pending",
                        "resources": {resource: 1},
                    }
                )


def seed(cluster: Cluster, state: dict) -> None:
    """Give a simulated cluster its fleet (replacing any previous one)."""
    SimulatedClusterState.objects.update_or_create(cluster=cluster, defaults={"state": state})
