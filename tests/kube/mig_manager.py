"""Emulation of the GPU Operator's MIG manager for the test API server: config label in, node capacity out.

Words used here (as the GPU Operator's MIG manager and mig-parted documentation use them):
- config: a key of `mig-configs` in the mig-parted YAML held by a ConfigMap; a node asks for one with the
  label `nvidia.com/mig.config` and the manager reports progress in `nvidia.com/mig.config.state`;
- layout: per GPU index, whether MIG is on and how many instances of each profile it holds;
- outcome: what the next apply on a node does, forced by a test: `success`, `failed` or `wedge`.
"""

from __future__ import annotations

import json
from copy import deepcopy
from typing import Any

import yaml

from tests.kube.gpu_resources import (
    GPU_RESOURCE,
    LAYOUT_ANNOTATION,
    MIG_RESOURCE_PREFIX,
    DeviceLayout,
    advertise,
    disabled_layout,
    gpu_resources,
    mig_totals,
    node_layout,
    node_sharing,
)
from tests.kube.operand import Operand

CONFIG_LABEL = "nvidia.com/mig.config"
STATE_LABEL = "nvidia.com/mig.config.state"
GPU_PRESENT_LABEL = "nvidia.com/gpu.present"
MIG_CAPABLE_LABEL = "nvidia.com/mig.capable"
ALL_DISABLED = "all-disabled"
OUTCOMES = ("success", "failed", "wedge")


class MigConfigError(ValueError):
    """The manager cannot apply the config: the node ends in state `failed` with capacity unchanged."""


def _covered_indices(devices: Any, gpus: int) -> set[int]:
    if devices == "all":
        return set(range(gpus))
    if isinstance(devices, list) and all(isinstance(i, int) and not isinstance(i, bool) for i in devices):
        # mig-parted selects among the devices present, so an index past the last GPU selects nothing.
        return {i for i in devices if 0 <= i < gpus}
    raise MigConfigError(f"devices must be 'all' or a list of GPU indices, not {devices!r}")


def _entry_layout(entry: Any) -> DeviceLayout:
    if not isinstance(entry, dict):
        raise MigConfigError(f"a config entry must be a mapping, not {entry!r}")
    enabled = entry.get("mig-enabled", False)
    if not isinstance(enabled, bool):
        raise MigConfigError(f"mig-enabled must be true or false, not {enabled!r}")
    devices = entry.get("mig-devices") or {}
    if not isinstance(devices, dict):
        raise MigConfigError(f"mig-devices must be a mapping, not {devices!r}")
    for profile, count in devices.items():
        if not isinstance(profile, str) or isinstance(count, bool) or not isinstance(count, int) or count < 0:
            raise MigConfigError(f"mig-devices {profile!r}: {count!r} is not a non-negative count")
    if not enabled:
        return {"mig": False, "devices": {}}
    return {"mig": True, "devices": {profile: count for profile, count in devices.items() if count > 0}}


def resolve_layout(
    config_yaml: str | None, name: str, previous: list[DeviceLayout], *, mig_capable: bool = True
) -> list[DeviceLayout]:
    """The layout a node has after applying config `name`; GPUs no entry covers keep their previous layout.

    Geometry (whether the profiles fit a GPU) is deliberately not checked: that is the portal's job, and
    a server that checked it would hide the portal's mistakes instead of letting tests catch them.
    """
    gpus = len(previous)
    configs: dict = {}
    if config_yaml is not None:
        try:
            document = yaml.safe_load(config_yaml)
        except yaml.YAMLError as error:
            raise MigConfigError(f"config.yaml does not parse: {error}") from error
        if not isinstance(document, dict) or not isinstance(document.get("mig-configs"), dict):
            raise MigConfigError("config.yaml has no mig-configs mapping")
        configs = document["mig-configs"]
    if name not in configs:
        if name == ALL_DISABLED:
            return disabled_layout(gpus)
        raise MigConfigError(f"unknown MIG config {name!r}")
    entries = configs[name]
    if not isinstance(entries, list):
        raise MigConfigError(f"MIG config {name!r} must be a list of entries")
    layout = deepcopy(previous)
    # mig-parted applies entries in order, so where two entries cover a GPU the later one wins.
    for entry in entries:
        device_layout = _entry_layout(entry)
        for index in _covered_indices(entry.get("devices"), gpus):
            layout[index] = deepcopy(device_layout)
    if not mig_capable and any(device["mig"] for device in layout):
        raise MigConfigError("the node's GPUs are not MIG-capable")
    return layout


def apply_layout(node: dict, layout: list[DeviceLayout]) -> None:
    """Advertise a layout on a node (in place), its MIG-disabled GPUs shared as the device plugin last
    applied: device-plugin resources, feature-discovery count labels, the state label and the layout
    annotation."""
    advertise(node, gpu_resources(layout, node_sharing(node)))
    labels = {
        key: value
        for key, value in node["metadata"]["labels"].items()
        if not key.startswith(MIG_RESOURCE_PREFIX)
    }
    labels.update({f"{name}.count": str(count) for name, count in mig_totals(layout).items()})
    labels[STATE_LABEL] = "success"
    node["metadata"]["labels"] = labels
    node["metadata"].setdefault("annotations", {})[LAYOUT_ANNOTATION] = json.dumps(layout, sort_keys=True)


def wedge(node: dict) -> None:
    """The known wedge (in place): stuck `pending` with nothing advertised, until someone intervenes."""
    advertise(node, {GPU_RESOURCE: "0"})
    node["metadata"]["labels"][STATE_LABEL] = "pending"


class MigManager(Operand):
    """Reacts to config-label changes the way the real manager does: late, on its own thread, and only for
    the latest change (a newer change makes the timers of an older one do nothing)."""

    outcomes = OUTCOMES

    def config_changed(self, node: dict) -> None:
        """Called under the server lock with the patched node before it is stored (so the PATCH response
        already shows `pending` when there is no stale window)."""
        name = node["metadata"]["name"]
        generation = self._next_generation(name)
        stale = self._server.stale_success_seconds
        if stale > 0:
            self._schedule(stale, self._mark_pending, name, generation)
        else:
            node["metadata"]["labels"][STATE_LABEL] = "pending"
            self._schedule(self._server.mig_apply_seconds, self._apply, name, generation)

    def _mark_pending(self, node: dict, generation: int) -> None:
        node["metadata"]["labels"][STATE_LABEL] = "pending"
        self._server.store.update(node)
        self._schedule(self._server.mig_apply_seconds, self._apply, node["metadata"]["name"], generation)

    def _apply(self, node: dict, generation: int) -> None:
        name = node["metadata"]["name"]
        outcome = self._take_outcome(name)
        if outcome == "wedge":
            wedge(node)
        elif outcome == "failed":
            node["metadata"]["labels"][STATE_LABEL] = "failed"
        else:
            try:
                layout = resolve_layout(
                    self._config_yaml(),
                    node["metadata"]["labels"].get(CONFIG_LABEL, ALL_DISABLED),
                    node_layout(node),
                    mig_capable=node["metadata"]["labels"].get(MIG_CAPABLE_LABEL) == "true",
                )
            except MigConfigError:
                node["metadata"]["labels"][STATE_LABEL] = "failed"
            else:
                apply_layout(node, layout)
        self._server.store.update(node)

    def _config_yaml(self) -> str | None:
        namespace, _, name = self._server.mig_config_map.partition("/")
        config_map = self._server.store.get("ConfigMap", name, namespace)
        if config_map is None:
            return None
        return config_map.get("data", {}).get("config.yaml")
