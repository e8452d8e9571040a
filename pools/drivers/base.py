"""The ClusterDriver protocol: everything the portal needs from a cluster, in plain data.

Drivers are the only way out to a cluster. Two implement this protocol:
`KubernetesDriver` (the official client, GPU Operator) and `SimulatedDriver` (an
embedded fleet for the demo and the tests). `driver_for(cluster)` picks one from
the registry by the cluster's `driver` field.

A cluster is followed as Kubernetes controllers follow it, by list and watch. Words used here:
- stream: what a watch follows: NODES, PODS, CLAIMS, and SLICES (the GPU driver's ResourceSlices, whose
  changes are changes of their nodes' devices) where a driver has them;
- version: where a stream stands, an opaque string the driver gave (a list's or an event's
  resourceVersion); `Versions` maps each stream a driver follows to one;
- page: a slice of a list in list-key order (`list_key`), with the range of keys it covers, so that what
  is not on it within that range is known to be gone, and the versions to watch from once listed;
- change: one node, pod or claim added, changed or removed (None), with its stream's version after it;
- expired: a version older than the cluster keeps changes for (410 Gone): that stream is listed again.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Generic, Protocol, TypeVar

from django.utils.translation import gettext as _

from pools.mig import MigState

if TYPE_CHECKING:
    from pools.models import Cluster


class DriverError(Exception):
    """The cluster could not do what was asked; the message is safe to show to operators."""


class ClusterUnreachable(DriverError):
    pass


class ClusterUnauthorised(DriverError):
    pass


class NamespaceNotManaged(DriverError):
    """A namespace of that name exists and the portal did not create it; it is never taken over.

    Labelling it and putting a GPU quota on it would hand a tenant (or at least the tenant's
    quota) a namespace that belongs to someone else, e.g. `monitoring` or `kube-system`.
    """

    def __init__(self, namespace: str) -> None:
        super().__init__(
            _(
                "Namespace %(namespace)s already exists in the cluster and was not created by the "
                "portal, so the portal will not take it over. An operator must delete it, or the "
                "project must use another namespace."
            )
            % {"namespace": namespace}
        )


@dataclass(frozen=True)
class MigInstanceInfo:
    profile: str
    start: int
    uuid: str = ""


@dataclass(frozen=True)
class GpuInfo:
    index: int
    model: str  # catalogue name, e.g. H200-141GB
    memory_mib: int
    mig_capable: bool
    mig_enabled: bool
    instances: tuple[MigInstanceInfo, ...] = ()
    uuid: str = ""
    health: str = "ok"


@dataclass(frozen=True)
class ResourceCount:
    capacity: int
    allocatable: int


@dataclass(frozen=True)
class NodeInfo:
    name: str
    ready: bool
    gpu_model: str = ""
    gpus: tuple[GpuInfo, ...] = ()
    resources: Mapping[str, ResourceCount] = field(default_factory=dict)  # nvidia.com/* only
    mig_strategy: str = ""
    mig_config: str = ""
    mig_state: str = ""
    # False while a MIG change is not known to have succeeded (pending, rebooting, failed): the
    # cluster then cannot tell each GPU's layout, and the portal keeps its last known GPU rows.
    gpus_known: bool = True
    # Why this node's GPUs could not be read (malformed labels, unknown model, invalid layout, a
    # failed MIG change, a sharing the portal cannot give out). When set, the portal keeps the node's
    # previous GPU rows untouched.
    error: str = ""
    # The share profile its MIG-off GPUs are advertised as (pools/kinds/shares.py), as feature discovery
    # labels it: "" when they are not shared.
    sharing: str = ""
    sharing_config: str = ""  # the device plugin config its nvidia.com/device-plugin.config label asks for


@dataclass(frozen=True)
class PodInfo:
    namespace: str
    name: str
    node: str
    phase: str
    resources: Mapping[str, int]  # nvidia.com/* requests
    claims: tuple[str, ...] = ()  # the ResourceClaims it uses, in its namespace


@dataclass(frozen=True)
class DeviceClaim:
    """A claim the portal makes for one allocation: exactly the device with this UUID, a whole GPU or a MIG
    instance."""

    name: str
    uuid: str
    whole_gpu: bool


@dataclass(frozen=True)
class ClaimInfo:
    """A ResourceClaim as the cluster holds it: whose it is, and the devices allocated to it, by UUID (""
    for a device the driver's slices no longer list)."""

    namespace: str
    name: str
    pool: str  # the portal's pool label: "" on a claim the portal did not make
    devices: tuple[str, ...] = ()
    node: str = ""


@dataclass(frozen=True)
class GpuLayout:
    """The desired MIG state of one GPU: MIG off, or on with these instances."""

    index: int
    mig_enabled: bool
    instances: tuple[MigInstanceInfo, ...] = ()

    def profile_counts(self) -> dict[str, int]:
        counts: dict[str, int] = {}
        for instance in self.instances:
            counts[instance.profile] = counts.get(instance.profile, 0) + 1
        return counts


DRA, DEVICE_PLUGIN = "dra", "device-plugin"


@dataclass(frozen=True)
class Binding:
    """How a cluster can bind a pool's GPUs to its namespace: `DRA` (it serves resource.k8s.io/v1 and a GPU
    driver publishes ResourceSlices) or `DEVICE_PLUGIN`, with why not DRA."""

    mode: str
    why: str = ""


# --- following a cluster: list, then watch -----------------------------------------------------------

NODES, PODS, CLAIMS, SLICES = "nodes", "pods", "claims", "slices"
Versions = Mapping[str, str]
Item = TypeVar("Item", NodeInfo, PodInfo, ClaimInfo)


class Expired(DriverError):
    """The cluster no longer keeps the changes of `stream` since the version asked (410 Gone)."""

    def __init__(self, stream: str, why: str = "") -> None:
        super().__init__(f"{stream}: {why or 'the version to watch from has expired'}")
        self.stream = stream


def list_key(namespace: str, name: str) -> str:
    """An object's place in a list, as a Kubernetes API server orders lists (by etcd key, byte by byte):
    `<namespace>/<name>`, or the name of a cluster-wide object."""
    return f"{namespace}/{name}" if namespace else name


@dataclass(frozen=True)
class Page(Generic[Item]):
    """One page of a list. It covers the list keys after `after` up to `upto` (None: from the start, to the
    end), whether or not each object there is on it (a driver leaves out what the portal does not follow,
    such as pods that hold no GPU); `versions` are where to watch its streams from once the list is read."""

    items: tuple[Item, ...]
    after: str | None
    upto: str | None
    versions: Versions


@dataclass(frozen=True)
class NodeChange:
    stream: str
    version: str
    name: str
    node: NodeInfo | None  # None: it left the cluster, or is no GPU node any more


@dataclass(frozen=True)
class PodChange:
    stream: str
    version: str
    namespace: str
    name: str
    pod: PodInfo | None  # None: it is gone, has finished, or holds no GPU


@dataclass(frozen=True)
class ClaimChange:
    """A ResourceClaim changed; claims are read whole again when next needed (there are few), and the pods
    that use it come as changes of their own."""

    stream: str
    version: str
    namespace: str
    name: str


@dataclass(frozen=True)
class Progress:
    """Every change of `stream` up to `version` has come (a bookmark)."""

    stream: str
    version: str


@dataclass(frozen=True)
class CaughtUp:
    """Every stream has brought what was waiting when the watch began."""


@dataclass(frozen=True)
class Quiet:
    """Nothing has come for a moment: a good time to write what did."""


Change = NodeChange | PodChange | ClaimChange
WatchItem = NodeChange | PodChange | ClaimChange | Progress | CaughtUp | Quiet


@dataclass(frozen=True)
class MigStatus:
    config: str  # the config the node was last asked to apply
    state: MigState


@dataclass(frozen=True)
class SharingStatus:
    """What a node's labels say of its sharing now: the device plugin config asked for, and the share
    profile its MIG-off GPUs show ("" for none). The two disagree until the plugin has applied the config,
    and for good when it cannot (the node then advertises no MIG-off GPU at all)."""

    config: str
    sharing: str


class ClusterDriver(Protocol):
    def list_nodes(self) -> Iterator[Page[NodeInfo]]:
        """Every GPU node, with its GPUs, MIG layouts and nvidia.com/* resources, page by page."""

    def list_pods(self) -> Iterator[Page[PodInfo]]:
        """Pods that request nvidia.com/* resources or use claims and have not finished, page by page."""

    def list_claims(self) -> Iterator[Page[ClaimInfo]]:
        """Every ResourceClaim of the GPU driver's devices, the portal's and others' (none without DRA)."""

    def watch(self, since: Versions, *, seconds: float) -> Iterator[WatchItem]:
        """The changes of each stream after its version in `since`, as they come, for at most `seconds`.

        Yields CaughtUp once every stream has brought what was waiting, Progress as streams advance with
        nothing to tell, and Quiet when nothing has come for a moment; the caller may stop at any of them
        (closing the iterator ends the watch). A stream that breaks is resumed from the last version seen;
        one whose version has expired raises Expired, and the caller lists it again. Each item's stream is
        one of `since`'s; a watch of no stream ends at once."""

    def inventory(self) -> list[NodeInfo]:
        """Every node, with its GPUs, MIG layouts and nvidia.com/* resources (`list_nodes`, whole)."""

    def workloads(self) -> list[PodInfo]:
        """Pods that request nvidia.com/* resources and have not finished (`list_pods`, whole)."""

    def apply_mig_layout(self, node: str, layout: Sequence[GpuLayout]) -> str:
        """Ask the GPU Operator to re-partition the listed GPUs of a node (others are left as they are).

        Returns the name of the MIG config the node now has to reach; its state is
        `pending` from this call on, until the operator reports success or failure. A change asked
        while another is still pending on the node keeps that one's layouts for the GPUs this call
        does not list, so the new config reaches both (two pools re-partitioning GPUs of one node).
        """

    def mig_state(self, node: str) -> MigStatus: ...

    def binding(self) -> Binding:
        """Whether the cluster can bind exact devices through DRA, read at each sync."""

    def ensure_admission_policy(self) -> str:
        """Apply the portal's admission policy and its binding (pools/drivers/admission.py) where they are
        missing or differ; returns "" when both were in place as shipped, else what was missing or changed.
        A cluster that cannot take them (older than Kubernetes 1.30) raises DriverError saying so."""

    def bind_namespace(self, namespace: str, binding: str, nodes: Sequence[str]) -> None:
        """Tell the admission policy how the namespace's GPUs are bound and where its pools hold them."""

    def apply_claims(self, namespace: str, pool: str, claims: Sequence[DeviceClaim]) -> None:
        """Make the pool's ResourceClaims in the namespace exactly these: create the missing ones, delete
        the pool's others. Repeating the call is harmless."""

    def claims(self) -> list[ClaimInfo]:
        """Every ResourceClaim of the GPU driver's devices in the cluster (`list_claims`, whole)."""

    def apply_sharing(self, node: str, profile: str) -> str:
        """Put the node's MIG-off GPUs in a share mode: a share profile (`ts-4`, `mps-2`), or "" for none.

        Writes the portal's config for that mode into the cluster's device-plugin ConfigMap, under a key
        named after the mode (`portal-ts-4`, `portal-none`) that always means the same (the plugin reads a
        config again only when a node's label changes), and labels the node with it; returns that key.
        Refuses a profile that is no share's, a node the cluster does not have, and a node whose MIG
        change is still under way.
        """

    def sharing_state(self, node: str) -> SharingStatus: ...

    def ensure_namespace(self, namespace: str, labels: Mapping[str, str]) -> None:
        """Create the namespace with these labels, or re-label one the portal created before.

        A namespace the portal created carries NAMESPACE_LABELS (`portal_manages`); one that
        exists without them belongs to someone else and is refused with NamespaceNotManaged,
        leaving its labels and quotas as they are. Repeating the call is harmless.
        """

    def apply_quota(self, namespace: str, resources: Mapping[str, int]) -> None:
        """Set the GPU ResourceQuota of a namespace to exactly these counts."""

    def remove_quota(self, namespace: str) -> None: ...


QUOTA_NAME = "gpu-portal"
NAMESPACE_LABELS = {"app.kubernetes.io/managed-by": "gpu-portal"}


def portal_manages(labels: Mapping[str, str] | None) -> bool:
    """Whether a namespace with these labels was created by the portal (and so may be re-labelled)."""
    found = labels or {}
    return all(found.get(key) == value for key, value in NAMESPACE_LABELS.items())


def whole(pages: Iterator[Page[Item]]) -> list[Item]:
    """A paged list's objects, all of them: for a small cluster, a check or a test."""
    return [item for page in pages for item in page.items]


_REGISTRY: dict[str, Callable[[Cluster], ClusterDriver]] = {}


def register(kind: str):
    def decorate(factory):
        _REGISTRY[kind] = factory
        return factory

    return decorate


def driver_for(cluster: Cluster) -> ClusterDriver:
    """The driver of the cluster's kind; the drivers register themselves when the pools app is ready."""
    try:
        factory = _REGISTRY[cluster.driver]
    except KeyError:
        raise DriverError(f"Unknown cluster driver {cluster.driver!r}.") from None
    return factory(cluster)
