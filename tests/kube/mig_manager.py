"""Emulation of the GPU Operator's MIG manager for the test API server: config label in, node capacity out.

Words used here (as the GPU Operator's MIG manager and mig-parted documentation use them):
- config: a key of `mig-configs` in the mig-parted YAML held by a ConfigMap; a node asks for one with the
  label `nvidia.com/mig.config` and the manager reports progress in `nvidia.com/mig.config.state`;
- layout: per GPU index, whether MIG is on and how many instances of each profile it holds;
- outcome: what the next apply on a node does, forced by a test: `success`, `failed` or `wedge`.
"""

from __future__ import annotations

import json
import threading
from copy import deepcopy
from typing import TYPE_CHECKING, Any, TypedDict

import yaml

if TYPE_CHECKING:
    from tests.kube.server import KubeApiServer

CONFIG_LABEL = "nvidia.com/mig.config"
STATE_LABEL = "nvidia.com/mig.config.state"
GPU_PRESENT_LABEL = "nvidia.com/gpu.present"
GPU_COUNT_LABEL = "nvidia.com/gpu.count"
MIG_CAPABLE_LABEL = "nvidia.com/mig.capable"
LAYOUT_ANNOTATION = "test.kube/mig-layout"
ALL_DISABLED = "all-disabled"
GPU_RESOURCE = "nvidia.com/gpu"
MIG_RESOURCE_PREFIX = "nvidia.com/mig-"
OUTCOMES = ("success", "failed", "wedge")


class DeviceLayout(TypedDict):
    mig: bool
    devices: dict[str, int]


class MigConfigError(ValueError):
    """The manager cannot apply the config: the node ends in state `failed` with capacity unchanged."""


def disabled_layout(gpus: int) -> list[DeviceLayout]:
    return [{"mig": False, "devices": {}} for _ in range(gpus)]


def mig_resource_name(profile: str) -> str:
    """The mixed-strategy device-plugin resource for a profile; `+` is not allowed in resource names."""
    return MIG_RESOURCE_PREFIX + profile.replace("+", ".")


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


def node_layout(node: dict) -> list[DeviceLayout]:
    """The layout last applied to a node, from its annotation; all GPUs MIG-disabled if it has none."""
    raw = node["metadata"].get("annotations", {}).get(LAYOUT_ANNOTATION)
    if raw:
        return json.loads(raw)
    return disabled_layout(int(node["metadata"]["labels"].get(GPU_COUNT_LABEL, "0")))


def _without_mig_resources(resources: dict[str, str]) -> dict[str, str]:
    return {name: value for name, value in resources.items() if not name.startswith(MIG_RESOURCE_PREFIX)}


def apply_layout(node: dict, layout: list[DeviceLayout]) -> None:
    """Advertise a layout on a node (in place): device-plugin resources, feature-discovery count labels,
    the state label and the layout annotation."""
    totals: dict[str, int] = {}
    for device in layout:
        for profile, count in device["devices"].items():
            totals[profile] = totals.get(profile, 0) + count
    advertised = {mig_resource_name(profile): str(count) for profile, count in totals.items() if count}
    full_gpus = str(sum(1 for device in layout if not device["mig"]))
    for field in ("capacity", "allocatable"):
        resources = _without_mig_resources(node["status"].get(field, {}))
        node["status"][field] = {**resources, GPU_RESOURCE: full_gpus, **advertised}
    labels = {
        key: value
        for key, value in node["metadata"]["labels"].items()
        if not key.startswith(MIG_RESOURCE_PREFIX)
    }
    labels.update({f"{name}.count": count for name, count in advertised.items()})
    labels[STATE_LABEL] = "success"
    node["metadata"]["labels"] = labels
    node["metadata"].setdefault("annotations", {})[LAYOUT_ANNOTATION] = json.dumps(layout, sort_keys=True)


def wedge(node: dict) -> None:
    """The known wedge (in place): stuck `pending` with nothing advertised, until someone intervenes."""
    for field in ("capacity", "allocatable"):
        resources = _without_mig_resources(node["status"].get(field, {}))
        node["status"][field] = {**resources, GPU_RESOURCE: "0"}
    node["metadata"]["labels"][STATE_LABEL] = "pending"


class MigManager:
    """Reacts to config-label changes the way the real manager does: late, on its own thread, and only for
    the latest change (a newer change makes the timers of an older one do nothing)."""

    def __init__(self, server: KubeApiServer) -> None:
        self._server = server
        self._generations: dict[str, int] = {}
        self._outcomes: dict[str, tuple[str, int | None]] = {}
        self._timers: set[threading.Timer] = set()
        self._stopped = False

    def set_outcome(self, node: str, outcome: str, applies: int | None = 1) -> None:
        if outcome not in OUTCOMES:
            raise ValueError(f"outcome must be one of {OUTCOMES}, not {outcome!r}")
        if outcome == "success":
            self._outcomes.pop(node, None)
        else:
            self._outcomes[node] = (outcome, applies)

    def _take_outcome(self, node: str) -> str:
        outcome, applies = self._outcomes.get(node, ("success", None))
        if applies is not None:
            if applies <= 1:
                self._outcomes.pop(node, None)
            else:
                self._outcomes[node] = (outcome, applies - 1)
        return outcome

    def config_changed(self, node: dict) -> None:
        """Called under the server lock with the patched node before it is stored (so the PATCH response
        already shows `pending` when there is no stale window)."""
        name = node["metadata"]["name"]
        generation = self._generations.get(name, 0) + 1
        self._generations[name] = generation
        stale = self._server.stale_success_seconds
        if stale > 0:
            self._schedule(stale, self._mark_pending, name, generation)
        else:
            node["metadata"]["labels"][STATE_LABEL] = "pending"
            self._schedule(self._server.mig_apply_seconds, self._apply, name, generation)

    def stop(self) -> None:
        with self._server.lock:
            self._stopped = True
            timers, self._timers = self._timers, set()
        for timer in timers:
            timer.cancel()

    def _schedule(self, delay: float, action: Any, name: str, generation: int) -> None:
        if self._stopped:
            return
        timer = threading.Timer(delay, self._fire, args=(action, name, generation))
        timer.daemon = True
        self._timers.add(timer)
        timer.start()

    def _fire(self, action: Any, name: str, generation: int) -> None:
        with self._server.lock:
            self._timers = {timer for timer in self._timers if timer.is_alive()}
            if self._stopped or self._generations.get(name) != generation:
                return
            node = self._server.store.get("Node", name)
            if node is None:
                return
            action(deepcopy(node), generation)

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
