"""Dynamic Resource Allocation as the Kubernetes driver reads and writes it: the GPU driver's ResourceSlices
(each device's UUID), the portal's ResourceClaims (one per allocation, selecting its device by UUID), and
every claim's allocation.

Words used here (as `resource.k8s.io/v1` and NVIDIA's DRA driver for GPUs use them):
- slice: a ResourceSlice the GPU driver publishes, one per node, listing its devices;
- device: a whole GPU with MIG off, named `gpu-<minor>`, or one MIG device, named
  `gpu-<minor>-mig-<profile>-<GPU instance profile id>-<placement start>`; its `uuid` and (for MIG) its
  `profile` are string attributes. A GPU's minor number is taken as its index on the node, as the GPU
  Operator's containers see them on the nodes it supports;
- claim: a ResourceClaim; the portal's carry POOL_LABEL and ask for exactly one device of the class
  `gpu.nvidia.com` or `mig.nvidia.com` whose UUID is the allocation's.

The lists are read as JSON, page by page: the client's typed models are not needed to read a few fields.
"""

from __future__ import annotations

import json
import re
from collections import defaultdict
from collections.abc import Collection, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace

from kubernetes import client
from kubernetes.client.exceptions import ApiException

from pools.drivers.base import NAMESPACE_LABELS, ClaimInfo, DeviceClaim, GpuInfo, MigInstanceInfo, NodeInfo

GPU_DRA_DRIVER = "gpu.nvidia.com"
GPU_CLASS, MIG_CLASS = "gpu.nvidia.com", "mig.nvidia.com"
POOL_LABEL = "gpu-portal/pool"
PAGE = 500
_GPU_DEVICE = re.compile(r"gpu-(?P<minor>\d+)")
_MIG_DEVICE = re.compile(r"gpu-(?P<minor>\d+)-mig-.+-(?P<start>\d+)")
DeviceKey = tuple[str, str, str]  # driver, pool, device name: how a claim's allocation names a device


@dataclass
class NodeDevices:
    """A node's devices as the GPU driver publishes them, by what the portal knows of each."""

    gpus: dict[int, str] = field(default_factory=dict)  # GPU index: UUID, MIG off
    mig: dict[tuple[int, str], list[tuple[int, str]]] = field(
        default_factory=lambda: defaultdict(list)
    )  # (GPU index, profile): [(start, UUID)], by start


@dataclass
class Published:
    nodes: dict[str, NodeDevices] = field(default_factory=lambda: defaultdict(NodeDevices))
    uuids: dict[DeviceKey, str] = field(default_factory=dict)
    node_of: dict[DeviceKey, str] = field(default_factory=dict)


def _string(device: Mapping, name: str) -> str:
    return str(((device.get("attributes") or {}).get(name) or {}).get("string") or "")


def published(slices: Iterable[Mapping], wanted: Collection[DeviceKey] | None = None) -> Published:
    """What the GPU driver's slices say of each device; with `wanted`, of those devices only (by UUID and
    node, without each node's devices)."""
    found = Published()
    for slice_ in slices:
        spec = slice_.get("spec") or {}
        if spec.get("driver") != GPU_DRA_DRIVER:
            continue
        node, pool = spec.get("nodeName") or "", (spec.get("pool") or {}).get("name") or ""
        for device in spec.get("devices") or []:
            name, uuid = device.get("name") or "", _string(device, "uuid")
            key = (GPU_DRA_DRIVER, pool, name)
            if wanted is not None:
                if key in wanted:
                    found.uuids[key], found.node_of[key] = uuid, node
                continue
            found.uuids[key], found.node_of[key] = uuid, node
            if (whole := _GPU_DEVICE.fullmatch(name)) and _string(device, "type") == "gpu":
                found.nodes[node].gpus[int(whole["minor"])] = uuid
            elif (part := _MIG_DEVICE.fullmatch(name)) and _string(device, "type") == "mig":
                found.nodes[node].mig[(int(part["minor"]), _string(device, "profile"))].append(
                    (int(part["start"]), uuid)
                )
    for devices in found.nodes.values():
        for instances in devices.mig.values():
            instances.sort()
    return found


def with_uuids(node: NodeInfo, devices: NodeDevices | None) -> NodeInfo:
    """The node with each GPU's and MIG instance's UUID as its slice lists them: the instances of one
    profile on a GPU in the order of their starts (the driver places them as NVML does, which may differ
    from the starts the portal derives, never in their order)."""
    if devices is None or not node.gpus:
        return node
    return replace(node, gpus=tuple(_gpu_with_uuids(gpu, devices) for gpu in node.gpus))


def _gpu_with_uuids(gpu: GpuInfo, devices: NodeDevices) -> GpuInfo:
    if not gpu.mig_enabled:
        return replace(gpu, uuid=devices.gpus.get(gpu.index, gpu.uuid))
    by_profile: dict[str, list[MigInstanceInfo]] = defaultdict(list)
    for instance in sorted(gpu.instances, key=lambda i: i.start):
        by_profile[instance.profile].append(instance)
    named = {}
    for profile, instances in by_profile.items():
        listed = devices.mig.get((gpu.index, profile), [])
        for n, instance in enumerate(instances):
            named[instance.start] = listed[n][1] if n < len(listed) else ""
    return replace(gpu, instances=tuple(replace(i, uuid=named[i.start]) for i in gpu.instances))


def claim_body(pool: str, claim: DeviceClaim) -> dict:
    selector = f'device.attributes["{GPU_DRA_DRIVER}"].uuid == {json.dumps(claim.uuid)}'
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": claim.name, "labels": {**NAMESPACE_LABELS, POOL_LABEL: pool}},
        "spec": {
            "devices": {
                "requests": [
                    {
                        "name": "gpu",
                        "exactly": {
                            "deviceClassName": GPU_CLASS if claim.whole_gpu else MIG_CLASS,
                            "selectors": [{"cel": {"expression": selector}}],
                        },
                    }
                ]
            }
        },
    }


def _selected_uuid(claim: Mapping) -> str | None:
    requests = ((claim.get("spec") or {}).get("devices") or {}).get("requests") or []
    expressions = [
        (selector.get("cel") or {}).get("expression") or ""
        for request in requests
        for selector in (request.get("exactly") or {}).get("selectors") or []
    ]
    found = [re.search(r'\.uuid == "([^"]+)"', expression) for expression in expressions]
    return found[0][1] if len(found) == 1 and found[0] else None


def _asks_gpu(claim: Mapping) -> bool:
    requests = ((claim.get("spec") or {}).get("devices") or {}).get("requests") or []
    return any(
        (request.get("exactly") or {}).get("deviceClassName") in (GPU_CLASS, MIG_CLASS)
        for request in requests
    )


def allocated(claim: Mapping) -> list[DeviceKey]:
    """The GPU driver's devices allocated to a claim."""
    results = (((claim.get("status") or {}).get("allocation") or {}).get("devices") or {}).get(
        "results"
    ) or []
    return [
        (result.get("driver"), result.get("pool"), result.get("device"))
        for result in results
        if result.get("driver") == GPU_DRA_DRIVER
    ]


def claim_info(claim: Mapping, devices: Published) -> ClaimInfo | None:
    """The claim as the portal reads it, when it asks for or holds a GPU driver's device; None otherwise."""
    keys = allocated(claim)
    if not keys and not _asks_gpu(claim):
        return None
    metadata = claim.get("metadata") or {}
    return ClaimInfo(
        namespace=metadata.get("namespace") or "",
        name=metadata.get("name") or "",
        pool=(metadata.get("labels") or {}).get(POOL_LABEL, ""),
        devices=tuple(devices.uuids.get(key, "") for key in keys),
        node=next((devices.node_of[key] for key in keys if key in devices.node_of), ""),
    )


class DraApi:
    """The driver's DRA calls, over its API client; ApiExceptions go to the driver's translation."""

    def __init__(self, api_client: client.ApiClient, timeout: tuple[int, int]) -> None:
        self.resource = client.ResourceV1Api(api_client)
        self.timeout = timeout

    def _pages(self, call, **kwargs) -> Iterator[dict]:
        yield from self.listed(call, **kwargs)[0]

    def listed(self, call, **kwargs) -> tuple[list[dict], str]:
        """Every object of a list, page by page, with the list's resourceVersion (its first page's)."""
        token, found, version = None, [], ""
        while True:
            response = call(
                limit=PAGE, _continue=token, _request_timeout=self.timeout, _preload_content=False, **kwargs
            )
            page = json.loads(response.data)
            found.extend(page.get("items") or [])
            version = version or (page.get("metadata") or {}).get("resourceVersion") or ""
            token = (page.get("metadata") or {}).get("continue")
            if not token:
                return found, version

    def published(self) -> Published:
        """The GPU driver's devices; none where the cluster does not serve DRA."""
        return self.published_listed()[0]

    def published_listed(self) -> tuple[Published, str]:
        """The GPU driver's devices and the version to watch its slices from; none, and "", where the
        cluster does not serve DRA."""
        try:
            slices, version = self.listed(
                self.resource.list_resource_slice, field_selector=f"spec.driver={GPU_DRA_DRIVER}"
            )
        except ApiException as error:
            if error.status == 404:
                return Published(), ""
            raise
        return published(slices), version

    def node_devices(self, node: str) -> NodeDevices | None:
        """What the GPU driver publishes of one node's devices (None: nothing)."""
        selector = f"spec.driver={GPU_DRA_DRIVER},spec.nodeName={node}"
        return published(self._pages(self.resource.list_resource_slice, field_selector=selector)).nodes.get(
            node
        )

    def claims(self, devices: Published | None = None) -> list[ClaimInfo]:
        return self.claims_listed(devices)[0]

    def claims_listed(self, devices: Published | None = None) -> tuple[list[ClaimInfo], str]:
        """Every claim of the GPU driver's devices with the version to watch claims from; the devices
        allocated are looked up in the slices (only those, when `devices` is not given)."""
        try:
            raw, version = self.listed(self.resource.list_resource_claim_for_all_namespaces)
        except ApiException as error:
            if error.status == 404:
                return [], ""
            raise
        if devices is None:
            wanted = {key for claim in raw for key in allocated(claim)}
            slices = self._pages(
                self.resource.list_resource_slice, field_selector=f"spec.driver={GPU_DRA_DRIVER}"
            )
            devices = published(slices, wanted) if wanted else Published()
        found = (claim_info(claim, devices) for claim in raw)
        return [claim for claim in found if claim is not None], version

    def apply_claims(self, namespace: str, pool: str, claims: Sequence[DeviceClaim]) -> None:
        wanted = {claim.name: claim for claim in claims}
        existing = {
            claim["metadata"]["name"]: _selected_uuid(claim)
            for claim in self._pages(
                self.resource.list_namespaced_resource_claim,
                namespace=namespace,
                label_selector=f"{POOL_LABEL}={pool}",
            )
        }
        for name, uuid in existing.items():
            if name not in wanted or wanted[name].uuid != uuid:  # a claim's devices cannot change: replace it
                self._delete(namespace, name)
        for name, claim in wanted.items():
            if existing.get(name) != claim.uuid:
                self._create(namespace, claim_body(pool, claim))

    def _create(self, namespace: str, body: dict) -> None:
        try:
            self.resource.create_namespaced_resource_claim(
                namespace, client.ResourceV1ResourceClaim.from_dict(body), _request_timeout=self.timeout
            )
        except ApiException as error:
            if error.status != 409:  # made by a concurrent run of the same step
                raise

    def _delete(self, namespace: str, name: str) -> None:
        try:
            self.resource.delete_namespaced_resource_claim(name, namespace, _request_timeout=self.timeout)
        except ApiException as error:
            if error.status != 404:
                raise
