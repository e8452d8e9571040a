"""Emulation of NVIDIA's DRA driver for GPUs (its kubelet plugin) in the test API server: a node's GPUs and
MIG devices, as the MIG manager emulation left them, published as one `resource.k8s.io/v1` ResourceSlice.

Words used here (as Kubernetes DRA and NVIDIA's driver use them):
- device: one allocatable thing in a slice, a whole GPU with MIG off or one MIG device; it has a name
  unique in its pool, typed attributes (`{"string": ...}`, `{"version": ...}`) and capacities (quantities);
- pool: the devices of one driver on one node, named after the node; `pool.generation` goes up whenever
  the pool's devices change, so that a consumer knows which slices are current;
- slice: the ResourceSlice that carries a pool (one per node here, as the driver publishes it);
- device class: the cluster-wide DeviceClass a claim names; the driver's Helm chart installs two.

What the driver publishes, read from NVIDIA/k8s-dra-driver-gpu (commit 22407113, May 2026):
- The driver is named `gpu.nvidia.com` (cmd/gpu-kubelet-plugin/main.go, DriverName); its kubelet plugin
  publishes one pool per node, named after the node, with a single slice of every allocatable device
  (driver.go, publishResources). The slice is named by the ResourceSlice controller of
  k8s.io/dynamic-resource-allocation: `<slice index in hex>-<driver>-<owner node>-<random suffix>`.
- A GPU with MIG off is one device named `gpu-<minor>` (deviceinfo.go, GpuInfo.CanonicalName); a GPU with
  MIG on is not published itself, only its existing MIG devices are (nvlib.go, static MIG).
- A whole GPU's attributes (deviceinfo.go, GpuInfo.Attributes): `type` = "gpu" (types.go, GpuDeviceType),
  `uuid`, `productName` (NVML's name, e.g. "NVIDIA H200"), `brand` (go-nvlib: "Nvidia" for data-centre
  parts), `architecture` (go-nvlib: "Ampere", "Hopper", "Blackwell"), and as versions
  `cudaComputeCapability`, `driverVersion`, `cudaDriverVersion`; plus the standard
  `resource.kubernetes.io/pciBusID` and `resource.kubernetes.io/pcieRoot` when known. Its capacity is
  `memory`, in bytes (partitions.go, fullGpuCapacity). There is no `index` or `minor` attribute: the minor
  is only in the device's name.
- A MIG device is named `gpu-<parent minor>-mig-<profile, dots dropped, RFC 1123>-<GI profile id>-
  <placement start>` (mig.go, ToCanonicalName); its attributes (mig.go, CommonAttributesMig, and
  deviceinfo.go, MigDeviceInfo.GetDevice) are `type` = "mig", `uuid` (its own MIG UUID), `parentUUID`,
  `profile` (e.g. "1g.18gb"), and the parent's `productName`, `brand`, `architecture`, versions and PCI
  attributes. Its capacities (mig.go, CommonCapacitiesMig) are `multiprocessors`, `copyEngines`,
  `decoders`, `encoders`, `jpegEngines`, `ofaEngines`, `memory` (bytes), plus `memorySlice<i>` = 1 for
  each memory slice it takes.
- The chart's device classes (deployments/helm/dra-driver-nvidia-gpu/templates/deviceclass-gpu.yaml and
  deviceclass-mig.yaml): `gpu.nvidia.com` selects `device.driver == 'gpu.nvidia.com' &&
  device.attributes['gpu.nvidia.com'].type == 'gpu'` (and names `extendedResourceName: nvidia.com/gpu`
  on resource.k8s.io/v1), `mig.nvidia.com` the same with type 'mig'.

Not imitated: the engine counts of a MIG device (NVML's numbers per profile), VFIO and dynamic-MIG
devices, ComputeDomain classes, device health and taints. UUIDs and PCI addresses are made up, stable per
node and GPU index; a MIG device keeps its UUID until its GPU's layout changes, as a real re-partition
destroys and creates the GPU's MIG devices.
"""

from __future__ import annotations

import json
import random
import re
import string
import uuid
from copy import deepcopy

from tests.kube.device_plugin import PRODUCT_LABEL, SHARED_PRODUCT_SUFFIX
from tests.kube.gpu_resources import DeviceLayout, node_layout
from tests.kube.store import ClusterStore

DRIVER = "gpu.nvidia.com"
GPU_CLASS = "gpu.nvidia.com"
MIG_CLASS = "mig.nvidia.com"
API_VERSION = "resource.k8s.io/v1"
PCI_BUS_ID = "resource.kubernetes.io/pciBusID"
PCIE_ROOT = "resource.kubernetes.io/pcieRoot"
MEMORY_LABEL = "nvidia.com/gpu.memory"
MEMORY_SLICES = 8
# GPU product (NVML name) prefix: architecture, CUDA compute capability.
_ARCHITECTURES = {
    "NVIDIA A100": ("Ampere", "8.0.0"),
    "NVIDIA H100": ("Hopper", "9.0.0"),
    "NVIDIA H200": ("Hopper", "9.0.0"),
    "NVIDIA B200": ("Blackwell", "10.0.0"),
}
DRIVER_VERSION = "570.133.20"
CUDA_DRIVER_VERSION = "12.8.0"
# NVML's GPU-instance profile ids, by (compute slices, memory slices, media extension), as
# `nvidia-smi mig -lgip` lists them on A100, H100 and H200.
_GI_PROFILE_IDS = {
    (1, 1, False): 19,
    (1, 1, True): 20,
    (1, 2, False): 15,
    (2, 2, False): 14,
    (3, 4, False): 9,
    (4, 4, False): 5,
    (7, 8, False): 0,
}
_PROFILE = re.compile(r"(\d+)g\.(\d+)gb(\+me)?")
_BINARY_SUFFIXES = (("Ti", 2**40), ("Gi", 2**30), ("Mi", 2**20), ("Ki", 2**10))


def device_classes() -> list[dict]:
    """The DeviceClasses the driver's Helm chart installs, with its CEL selectors."""
    return [
        _device_class(GPU_CLASS, "gpu", {"extendedResourceName": "nvidia.com/gpu"}),
        _device_class(MIG_CLASS, "mig", {}),
    ]


def _device_class(name: str, device_type: str, extra: dict) -> dict:
    expression = f"device.driver == '{DRIVER}' && device.attributes['{DRIVER}'].type == '{device_type}'"
    return {
        "apiVersion": API_VERSION,
        "kind": "DeviceClass",
        "metadata": {"name": name},
        "spec": {"selectors": [{"cel": {"expression": expression}}], **extra},
    }


def gpu_uuid(node: str, index: int) -> str:
    """The made-up UUID of GPU `index` on `node`, the same every time."""
    return f"GPU-{uuid.uuid5(uuid.NAMESPACE_URL, f'gpu://{node}/{index}')}"


def quantity(amount: int) -> str:
    """Bytes as a BinarySI quantity in canonical form, as `resource.NewQuantity(n, BinarySI)` prints."""
    for suffix, scale in _BINARY_SUFFIXES:
        if amount and amount % scale == 0:
            return f"{amount // scale}{suffix}"
    return str(amount)


def string_attribute(device: dict, name: str) -> str | None:
    return (device.get("attributes", {}).get(name) or {}).get("string")


class GpuNode:
    """What the driver reads of one node: its GPUs' product and memory, and each GPU's MIG layout."""

    def __init__(self, node: dict) -> None:
        labels = node["metadata"]["labels"]
        self.name = node["metadata"]["name"]
        self.product = labels.get(PRODUCT_LABEL, "").removesuffix(SHARED_PRODUCT_SUFFIX).replace("-", " ")
        self.memory_mib = int(labels.get(MEMORY_LABEL) or 0)
        self.layout: list[DeviceLayout] = node_layout(node)
        self.architecture, self.compute_capability = next(
            (facts for prefix, facts in _ARCHITECTURES.items() if self.product.startswith(prefix)),
            ("Unknown", "0.0.0"),
        )

    def gpu_uuid(self, index: int) -> str:
        return gpu_uuid(self.name, index)

    def common_attributes(self, index: int) -> dict[str, dict[str, str]]:
        bus = f"0000:{0x18 + 0x10 * index:02x}:00.0"
        return {
            "productName": {"string": self.product},
            "brand": {"string": "Nvidia"},
            "architecture": {"string": self.architecture},
            "cudaComputeCapability": {"version": self.compute_capability},
            "driverVersion": {"version": DRIVER_VERSION},
            "cudaDriverVersion": {"version": CUDA_DRIVER_VERSION},
            PCI_BUS_ID: {"string": bus},
            PCIE_ROOT: {"string": f"pci0000:{0x10 + 0x10 * index:02x}"},
        }

    def gpu_device(self, index: int) -> dict:
        attributes = {"type": {"string": "gpu"}, "uuid": {"string": self.gpu_uuid(index)}}
        return {
            "name": f"gpu-{index}",
            "attributes": {**attributes, **self.common_attributes(index)},
            "capacity": {"memory": {"value": quantity(self.memory_mib * 2**20)}},
        }

    def memory_slices(self, profile: str) -> tuple[int, int, bool]:
        """(compute slices, memory slices, media extension) of a profile, its memory rounded to slices of
        this GPU's memory."""
        match = _PROFILE.fullmatch(profile)
        if match is None or not self.memory_mib:
            return (0, 1, False)
        per_slice_gb = self.memory_mib / MEMORY_SLICES / 1024
        return int(match[1]), max(1, round(int(match[2]) / per_slice_gb)), bool(match[3])

    def mig_devices(self, index: int, generation: int) -> list[dict]:
        instances = [
            (profile, ordinal)
            for profile, count in self.layout[index]["devices"].items()
            for ordinal in range(count)
        ]
        instances.sort(key=lambda instance: -self.memory_slices(instance[0])[1])
        taken: set[int] = set()
        devices = []
        for profile, ordinal in instances:
            compute, size, media = self.memory_slices(profile)
            start = _placement(size, taken)
            taken.update(range(start, start + size))
            devices.append(self.mig_device(index, generation, profile, ordinal, start, size, media, compute))
        return sorted(devices, key=lambda device: device["name"])

    def mig_device(
        self,
        index: int,
        generation: int,
        profile: str,
        ordinal: int,
        start: int,
        size: int,
        media: bool,
        compute: int,
    ) -> dict:
        profile_id = _GI_PROFILE_IDS.get((compute, size, media), 99)
        seed = f"mig://{self.name}/{index}/{generation}/{profile}/{ordinal}"
        capacity = {"memory": {"value": quantity(size * (self.memory_mib // MEMORY_SLICES) * 2**20)}}
        capacity.update({f"memorySlice{i}": {"value": "1"} for i in range(start, start + size)})
        attributes = {
            "type": {"string": "mig"},
            "uuid": {"string": f"MIG-{uuid.uuid5(uuid.NAMESPACE_URL, seed)}"},
            "parentUUID": {"string": self.gpu_uuid(index)},
            "profile": {"string": profile},
        }
        return {
            "name": f"gpu-{index}-mig-{_rfc1123(profile.replace('.', ''))}-{profile_id}-{start}",
            "attributes": {**attributes, **self.common_attributes(index)},
            "capacity": capacity,
        }


def _placement(size: int, taken: set[int]) -> int:
    """The first start NVML allows for an instance of `size` memory slices that is still free; past the
    GPU's slices when none is (geometry is the portal's job, but device names must stay unique)."""
    for start in range(0, MEMORY_SLICES - size + 1 if size > 1 else MEMORY_SLICES - 1, size):
        if not taken & set(range(start, start + size)):
            return start
    return max(taken, default=MEMORY_SLICES - 1) + 1


def _rfc1123(name: str) -> str:
    return re.sub(r"[^a-z0-9-.]", "-", name.lower()).strip("-").removesuffix(".")


def _slice_name(node: str, driver: str) -> str:
    suffix = "".join(random.choices(string.ascii_lowercase + string.digits, k=5))
    return f"0-{driver}-{node}-{suffix}"


class GpuDraDriver:
    """The driver's kubelet plugin on each node it was started on: publishes the node's slice, and
    republishes it when the node's MIG layout changes. Callers hold the store's lock."""

    def __init__(self, store: ClusterStore) -> None:
        self._store = store
        self._drivers: dict[str, str] = {}  # node: driver name, for the nodes the plugin runs on
        self._slices: dict[str, str] = {}  # node: its slice's name
        # (node, GPU index): (the GPU's layout as last published, generation of its MIG devices)
        self._gpus: dict[tuple[str, int], tuple[str, int]] = {}
        store.observers.append(self._observe)

    def publish(self, node_name: str, driver: str = DRIVER) -> dict:
        node = self._store.get("Node", node_name)
        if node is None:
            raise KeyError(f"no node {node_name!r}")
        self._drivers[node_name] = driver
        return self._republish(node)

    def remove(self, node_name: str) -> None:
        self._drivers.pop(node_name, None)
        self._gpus = {key: value for key, value in self._gpus.items() if key[0] != node_name}
        name = self._slices.pop(node_name, None)
        if name is not None and self._store.get("ResourceSlice", name) is not None:
            self._store.remove("ResourceSlice", ("", name))

    def devices(self, node: dict) -> list[dict]:
        gpu_node = GpuNode(node)
        devices = []
        for index, layout in enumerate(gpu_node.layout):
            if layout["mig"]:
                devices.extend(
                    gpu_node.mig_devices(index, self._mig_generation(gpu_node.name, index, layout))
                )
            else:
                devices.append(gpu_node.gpu_device(index))
        return devices

    def _mig_generation(self, node: str, index: int, layout: DeviceLayout) -> int:
        recorded = json.dumps(layout, sort_keys=True)
        previous, generation = self._gpus.get((node, index), (recorded, 0))
        if previous != recorded:
            generation += 1
        self._gpus[(node, index)] = (recorded, generation)
        return generation

    def _observe(self, kind: str, obj: dict) -> None:
        if kind != "Node" or obj["metadata"]["name"] not in self._drivers:
            return
        if self._store.get("Node", obj["metadata"]["name"]) is obj:
            self._republish(obj)

    def _republish(self, node: dict) -> dict:
        name, driver = node["metadata"]["name"], self._drivers[node["metadata"]["name"]]
        devices = self.devices(node)
        current = self._store.get("ResourceSlice", self._slices.get(name, ""))
        if current is None:
            self._slices[name] = _slice_name(name, driver)
            return self._store.insert("ResourceSlice", self._slice(node, driver, devices, generation=1))
        if current["spec"]["devices"] == devices:
            return current
        generation = current["spec"]["pool"]["generation"] + 1
        replacement = self._slice(node, driver, devices, generation=generation)
        replacement["metadata"] = deepcopy(current["metadata"])
        return self._store.update(replacement)

    def _slice(self, node: dict, driver: str, devices: list[dict], *, generation: int) -> dict:
        name = node["metadata"]["name"]
        owner = {
            "apiVersion": "v1",
            "kind": "Node",
            "name": name,
            "uid": node["metadata"]["uid"],
            "controller": True,
        }
        return {
            "apiVersion": API_VERSION,
            "kind": "ResourceSlice",
            "metadata": {"name": self._slices[name], "ownerReferences": [owner]},
            "spec": {
                "driver": driver,
                "nodeName": name,
                "pool": {"name": name, "generation": generation, "resourceSliceCount": 1},
                "devices": devices,
            },
        }
