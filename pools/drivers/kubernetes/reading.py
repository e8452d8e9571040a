"""What the Kubernetes driver reads of nodes and pods, from their JSON as a list or a watch event brings it.

Inventory comes from the labels and resources that GPU feature discovery and the device plugin put on
nodes (mixed MIG strategy). Per-GPU layouts come from the mig-parted config the node's
`nvidia.com/mig.config` label names; starts are not visible through the Kubernetes API and are derived the
way mig-parted places profiles. Shares of MIG-off GPUs (time-sliced, MPS) show in the device plugin's labels.
The objects are read as plain JSON: the client's typed models are not needed for a few fields, and a fleet
of thousands of nodes reads several times faster without them.
"""

from __future__ import annotations

from collections.abc import Mapping

from pools import mig
from pools.drivers import device_plugin
from pools.drivers.base import GpuInfo, MigInstanceInfo, NodeInfo, PodInfo, ResourceCount
from pools.gpu_models import model_from_node_labels, model_info
from pools.mig import MigState

GPU_NODE_LABEL, GPU_NODE_SELECTOR = "nvidia.com/gpu.present", "nvidia.com/gpu.present=true"
RUNNING_PODS = "status.phase!=Succeeded,status.phase!=Failed"
MIG_CONFIG_LABEL = "nvidia.com/mig.config"
MIG_STATE_LABEL = "nvidia.com/mig.config.state"
ALL_DISABLED = "all-disabled"
FINISHED = ("Succeeded", "Failed")


def _quantity(value: object) -> int:
    return int(str(value))


def labels_of(obj: Mapping) -> dict[str, str]:
    return (obj.get("metadata") or {}).get("labels") or {}


def is_gpu_node(node: Mapping) -> bool:
    return labels_of(node).get(GPU_NODE_LABEL) == "true"


def per_device(entries: list, count: int) -> list[tuple[bool, dict[str, int]] | None]:
    """mig-parted entries → per device index: (MIG on, {profile: count}), or None where no entry covers it."""
    layouts: list[tuple[bool, dict[str, int]] | None] = [None] * count
    for entry in entries:
        devices = entry.get("devices", "all")
        indices = range(count) if devices == "all" else devices
        for index in indices:
            if (
                isinstance(index, int) and 0 <= index < count
            ):  # a later entry wins, as mig-parted applies them in order
                enabled = bool(entry.get("mig-enabled", False))
                layouts[index] = (enabled, dict(entry.get("mig-devices") or {}) if enabled else {})
    return layouts


def config_needed(node: Mapping, configs: Mapping) -> str:
    """The mig-parted config the node's GPUs are read from when `configs` lacks it ("" when none is)."""
    labels = labels_of(node)
    name = labels.get(MIG_CONFIG_LABEL, "")
    if labels.get(MIG_STATE_LABEL) != MigState.SUCCESS or name in configs or name in ("", ALL_DISABLED):
        return ""
    return name


def node_info(node: Mapping, configs: Mapping, config_map: str) -> NodeInfo:
    """The node as the portal reads it; `configs` is the mig-parted document's `mig-configs`, kept in the
    ConfigMap `config_map` (named in errors)."""
    metadata, status = node.get("metadata") or {}, node.get("status") or {}
    labels = metadata.get("labels") or {}
    ready = any(
        c.get("type") == "Ready" and c.get("status") == "True" for c in status.get("conditions") or []
    )
    capacity = status.get("capacity") or {}
    allocatable = status.get("allocatable") or {}
    base = {
        "name": metadata.get("name") or "",
        "ready": ready,
        "mig_strategy": labels.get("nvidia.com/mig.strategy", ""),
        "mig_config": labels.get(MIG_CONFIG_LABEL, ""),
        "mig_state": labels.get(MIG_STATE_LABEL, MigState.UNKNOWN.value),
        "sharing_config": labels.get(device_plugin.CONFIG_LABEL, ""),
    }
    try:
        base["sharing"] = device_plugin.profile_of_labels(labels)
        resources = {
            name: ResourceCount(_quantity(value), _quantity(allocatable.get(name, "0")))
            for name, value in capacity.items()
            if name.startswith("nvidia.com/")
        }
        count = int(labels.get("nvidia.com/gpu.count", "0"))
        memory_mib = int(labels.get("nvidia.com/gpu.memory", "0")) or None
        model = model_from_node_labels(labels.get("nvidia.com/gpu.product", ""), memory_mib)
        if base["mig_state"] == MigState.FAILED:
            return NodeInfo(
                **base,
                gpu_model=model,
                resources=resources,
                gpus_known=False,
                error=f"the GPU Operator failed to apply MIG config {base['mig_config']}",
            )
        if base["mig_state"] != MigState.SUCCESS:  # the label names a config not reached yet
            return NodeInfo(**base, gpu_model=model, resources=resources, gpus_known=False)
        gpus = _gpus(base["mig_config"], configs, config_map, model, count, memory_mib or 0, labels, ready)
    except (ValueError, TypeError) as error:
        return NodeInfo(**base, error=f"cannot read the node's GPUs: {error}")
    return NodeInfo(**base, gpu_model=model, gpus=gpus, resources=resources)


def _gpus(
    config_name: str,
    configs: Mapping,
    config_map: str,
    model_name: str,
    count: int,
    memory_mib: int,
    labels: Mapping[str, str],
    ready: bool,
) -> tuple[GpuInfo, ...]:
    if config_name in ("", ALL_DISABLED) and config_name not in configs:
        layouts: list[tuple[bool, dict[str, int]] | None] = [(False, {})] * count
    elif config_name in configs:
        layouts = per_device(configs[config_name], count)
    else:
        raise ValueError(f"MIG config {config_name!r} is not in {config_map}")
    model = model_info(model_name)
    mig_capable = labels.get("nvidia.com/mig.capable", "false") == "true"
    gpus = []
    for index, layout in enumerate(layouts):
        enabled, counts = layout if layout is not None else (False, {})
        instances: tuple[MigInstanceInfo, ...] = ()
        if enabled:
            placed = mig.place_profiles(model.geometry(), counts)
            if placed is None:
                raise ValueError(f"GPU {index}: {counts} does not fit on a {model_name}")
            instances = tuple(MigInstanceInfo(i.profile, i.start) for i in placed)
        gpus.append(
            GpuInfo(
                index=index,
                model=model_name,
                memory_mib=memory_mib,
                mig_capable=mig_capable,
                mig_enabled=enabled,
                instances=instances,
                health="ok" if ready else "unknown",
            )
        )
    return tuple(gpus)


def pod_claims(pod: Mapping) -> tuple[str, ...]:
    """The names of the ResourceClaims a pod uses: named in its spec, or made for it from a template."""
    made = {
        status.get("name"): status.get("resourceClaimName")
        for status in (pod.get("status") or {}).get("resourceClaimStatuses") or []
    }
    names = (
        claim.get("resourceClaimName") or made.get(claim.get("name"))
        for claim in (pod.get("spec") or {}).get("resourceClaims") or []
    )
    return tuple(name for name in names if name)


def pod_info(pod: Mapping) -> PodInfo | None:
    """The pod as the portal follows it; None when it holds no GPU (no nvidia.com/* resource, no claim) or
    has finished."""
    metadata, spec, status = pod.get("metadata") or {}, pod.get("spec") or {}, pod.get("status") or {}
    if status.get("phase") in FINISHED:
        return None
    wanted: dict[str, int] = {}
    for container in spec.get("containers") or []:
        resources = container.get("resources") or {}
        asked = {**(resources.get("limits") or {}), **(resources.get("requests") or {})}
        for name, value in asked.items():
            if name.startswith("nvidia.com/"):
                wanted[name] = wanted.get(name, 0) + _quantity(value)
    claims = pod_claims(pod)
    if not wanted and not claims:
        return None
    return PodInfo(
        namespace=metadata.get("namespace") or "",
        name=metadata.get("name") or "",
        node=spec.get("nodeName") or "",
        phase=status.get("phase") or "",
        resources=wanted,
        claims=claims,
    )
