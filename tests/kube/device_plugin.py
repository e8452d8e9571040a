"""Emulation of NVIDIA's device plugin for the test API server: sharing-config label in, shared GPUs out.

Words used here (as NVIDIA/k8s-device-plugin and its config API v1 use them):
- config: a key in the data of the device plugin's ConfigMap, whose value is a plugin config file in YAML;
  a node asks for one with the label `nvidia.com/device-plugin.config`, and no label (or an empty one)
  means the default, no sharing. The plugin reads a config when the label changes, never when the
  ConfigMap does;
- strategy block: `sharing.timeSlicing` or `sharing.mps`, the same shape; when `mps` is set it is the one
  used (both are validated);
- sharing: what the block says of `nvidia.com/gpu` (see gpu_resources.py); MIG devices are not shared here;
- outcome: what the next apply on a node does, forced by a test: `success`, `failed` (as a config the
  plugin cannot read: full GPUs gone, labels left) or `stall` (the plugin never applies).
"""

from __future__ import annotations

import re
from typing import Any

import yaml

from tests.kube.gpu_resources import (
    GPU_RESOURCE,
    NO_SHARING,
    Sharing,
    advertise,
    gpu_resources,
    node_layout,
    record_sharing,
)
from tests.kube.operand import Operand

CONFIG_LABEL = "nvidia.com/device-plugin.config"
PRODUCT_LABEL = "nvidia.com/gpu.product"
REPLICAS_LABEL = "nvidia.com/gpu.replicas"
STRATEGY_LABEL = "nvidia.com/gpu.sharing-strategy"
SHARED_PRODUCT_SUFFIX = "-SHARED"
VERSION = "v1"
OUTCOMES = ("success", "failed", "stall")
STRATEGIES = {"timeSlicing": "time-slicing", "mps": "mps"}
RESOURCE_NAME_PREFIX = "nvidia.com/"
MAX_RESOURCE_NAME_LENGTH = 63
_DNS_SUBDOMAIN = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")
_UUID = r"[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}"
# A device in a `devices` list: GPU index, MIG index (`gpu:instance`), GPU UUID or MIG UUID.
_DEVICE_REF = re.compile(rf"\d+|\d+:\d+|GPU-{_UUID}|MIG-{_UUID}|MIG-GPU-{_UUID}/\d+/\d+")


class SharingConfigError(ValueError):
    """The plugin cannot read the config: it keeps failing, and the node advertises no full GPUs."""


def _mapping(value: Any, where: str) -> dict:
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise SharingConfigError(f"{where} must be a mapping, not {value!r}")
    return value


def _flag(block: dict, key: str, where: str) -> bool:
    value = block.get(key)
    if value is not None and not isinstance(value, bool):
        raise SharingConfigError(f"{where}.{key} must be true or false, not {value!r}")
    return bool(value)


def resource_name(value: Any) -> str:
    """A resource name as the plugin reads one: `nvidia.com/` is added when missing."""
    if not isinstance(value, str):
        raise SharingConfigError(f"a resource name must be a string, not {value!r}")
    full = value if value.startswith(RESOURCE_NAME_PREFIX) else RESOURCE_NAME_PREFIX + value
    if len(full) > MAX_RESOURCE_NAME_LENGTH or not _DNS_SUBDOMAIN.fullmatch(
        full[len(RESOURCE_NAME_PREFIX) :]
    ):
        raise SharingConfigError(f"incorrect format for resource name {full!r}")
    return full


def _check_devices(devices: Any) -> None:
    """`all`, a count or a list of devices; the plugin then ignores all but `all`, so nothing is returned."""
    if devices == "all":
        return
    if isinstance(devices, int) and not isinstance(devices, bool) and devices > 0:
        return
    if isinstance(devices, list) and all(_is_device_ref(device) for device in devices):
        return
    raise SharingConfigError(f"devices must be 'all', a count > 0 or a list of devices, not {devices!r}")


def _is_device_ref(device: Any) -> bool:
    if isinstance(device, int) and not isinstance(device, bool):
        return device >= 0
    return isinstance(device, str) and _DEVICE_REF.fullmatch(device) is not None


def _replicas(resource: Any, where: str) -> tuple[str, int]:
    """(resource name, replicas) of one entry of a strategy block's `resources`."""
    if not isinstance(resource, dict):
        raise SharingConfigError(f"{where}.resources entries must be mappings, not {resource!r}")
    if "name" not in resource:
        raise SharingConfigError(f"{where}.resources: no resource name specified")
    name = resource_name(resource["name"])
    _check_devices(resource.get("devices", "all"))
    if "replicas" not in resource:
        raise SharingConfigError(f"{where}.resources {name}: no replicas specified")
    replicas = resource["replicas"]
    if isinstance(replicas, bool) or not isinstance(replicas, int):
        raise SharingConfigError(f"{where}.resources {name}: replicas must be an integer, not {replicas!r}")
    if replicas < 2:
        raise SharingConfigError(f"{where}.resources {name}: number of replicas must be >= 2")
    if "rename" in resource:
        resource_name(resource["rename"])  # validated, then ignored: only the default rename is supported
    return name, replicas


def _block_sharing(block: Any, key: str) -> Sharing:
    """What a strategy block says of `nvidia.com/gpu`; no sharing when it does not list it."""
    where = f"sharing.{key}"
    block = _mapping(block, where)
    renamed = _flag(block, "renameByDefault", where)
    _flag(block, "failRequestsGreaterThanOne", where)
    resources = block.get("resources")
    if resources is not None and not isinstance(resources, list):
        raise SharingConfigError(f"{where}.resources must be a list, not {resources!r}")
    if not resources:
        raise SharingConfigError(f"{where}: no resources specified")
    replicas: dict[str, int] = {}
    for resource in resources:
        name, count = _replicas(resource, where)
        replicas.setdefault(name, count)  # the plugin looks a resource up by name and takes the first
    if GPU_RESOURCE not in replicas:
        return NO_SHARING
    return Sharing(strategy=STRATEGIES[key], replicas=replicas[GPU_RESOURCE], renamed=renamed)


def read_sharing(config_yaml: str) -> Sharing:
    """The sharing a plugin config file asks for, validated as the plugin's config API v1 validates it."""
    try:
        document = _mapping(yaml.safe_load(config_yaml), "the config")
    except yaml.YAMLError as error:
        raise SharingConfigError(f"unmarshal error: {error}") from error
    version = document.get("version")
    if version not in (None, "", VERSION):
        raise SharingConfigError(f"unknown version: {version}")
    sharing = _mapping(document.get("sharing"), "sharing")
    # A null `mps` leaves the plugin's pointer unset; a null `timeSlicing` is an empty block.
    time_slicing = _block_sharing(sharing["timeSlicing"], "timeSlicing") if "timeSlicing" in sharing else None
    if sharing.get("mps") is not None:
        return _block_sharing(sharing["mps"], "mps")
    return time_slicing or NO_SHARING


def resolve_sharing(configs: dict[str, str] | None, name: str) -> Sharing:
    """The sharing of config `name` among the ConfigMap's `configs` (None: no ConfigMap)."""
    if not name:
        return NO_SHARING
    if configs is None:
        raise SharingConfigError("the device plugin's ConfigMap does not exist")
    if name not in configs:
        raise SharingConfigError(f"specified config {name} does not exist")
    return read_sharing(configs[name])


def config_name(node: dict) -> str:
    return (node["metadata"].get("labels") or {}).get(CONFIG_LABEL) or ""


def sharing_labels(labels: dict[str, str], sharing: Sharing) -> dict[str, str]:
    """Feature discovery's labels for the node's GPUs under a sharing: replicas, strategy, and the product
    marked `-SHARED` when shared without renaming."""
    updated = {REPLICAS_LABEL: str(sharing.replicas), STRATEGY_LABEL: sharing.strategy}
    if PRODUCT_LABEL in labels:
        product = labels[PRODUCT_LABEL].removesuffix(SHARED_PRODUCT_SUFFIX)
        shared_as_gpu = sharing.replicas > 1 and not sharing.renamed
        updated[PRODUCT_LABEL] = product + SHARED_PRODUCT_SUFFIX if shared_as_gpu else product
    return updated


def apply_sharing(node: dict, sharing: Sharing | None) -> None:
    """Advertise a node's MIG-disabled GPUs shared this way (in place), its MIG resources as they are, and
    label it; None (a config the plugin cannot read) takes the full GPUs away and leaves the labels."""
    advertise(node, gpu_resources(node_layout(node), sharing))
    record_sharing(node, sharing)
    if sharing is not None:
        labels = node["metadata"]["labels"]
        labels.update(sharing_labels(labels, sharing))


class DevicePlugin(Operand):
    """Reads a node's config again when its config label changes, late and only for the latest change."""

    outcomes = OUTCOMES

    def config_changed(self, node: dict) -> None:
        """Called under the server lock with the patched node before it is stored."""
        name = node["metadata"]["name"]
        self._schedule(self._server.mig_apply_seconds, self._apply, name, self._next_generation(name))

    def _apply(self, node: dict, generation: int) -> None:
        outcome = self._take_outcome(node["metadata"]["name"])
        if outcome == "stall":
            return
        apply_sharing(node, self._sharing(node) if outcome == "success" else None)
        self._server.store.update(node)

    def _sharing(self, node: dict) -> Sharing | None:
        try:
            return resolve_sharing(self._configs(), config_name(node))
        except SharingConfigError:
            return None

    def _configs(self) -> dict[str, str] | None:
        namespace, _, name = self._server.device_plugin_config_map.partition("/")
        config_map = self._server.store.get("ConfigMap", name, namespace)
        if config_map is None:
            return None
        return config_map.get("data") or {}
