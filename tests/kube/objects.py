"""Stored-object builders for the test API server: nodes as the GPU Operator labels them, pods, namespaces,
and the quota usage a real quota controller would report."""

from __future__ import annotations

import json
import uuid
from datetime import UTC, datetime
from decimal import Decimal, InvalidOperation
from typing import Any

from tests.kube.device_plugin import PRODUCT_LABEL, REPLICAS_LABEL, STRATEGY_LABEL
from tests.kube.gpu_resources import (
    GPU_COUNT_LABEL,
    GPU_RESOURCE,
    LAYOUT_ANNOTATION,
    NO_SHARING,
    disabled_layout,
)
from tests.kube.mig_manager import (
    ALL_DISABLED,
    CONFIG_LABEL,
    GPU_PRESENT_LABEL,
    MIG_CAPABLE_LABEL,
    STATE_LABEL,
)

# Resources every node reports, whether or not it has GPUs; values as a 2-socket GPU server would show.
NODE_RESOURCES = {"cpu": "192", "memory": "2113470464Ki", "pods": "110", "ephemeral-storage": "3750000000Ki"}
TERMINAL_PHASES = ("Succeeded", "Failed")


def now() -> str:
    """RFC 3339 with `Z`, second precision, as the API server writes timestamps."""
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def new_uid() -> str:
    return str(uuid.uuid4())


def node(name: str, *, labels: dict[str, str], capacity: dict[str, str], annotations: dict[str, str]) -> dict:
    """A Node as the kubelet reports it; the client requires every nodeInfo field, so all are filled."""
    stamp = now()
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": name,
            "labels": {
                "kubernetes.io/hostname": name,
                "kubernetes.io/os": "linux",
                "kubernetes.io/arch": "amd64",
                **labels,
            },
            "annotations": annotations,
        },
        "spec": {"providerID": f"test://{name}"},
        "status": {
            "capacity": dict(capacity),
            "allocatable": dict(capacity),
            "conditions": [
                {
                    "type": "Ready",
                    "status": "True",
                    "reason": "KubeletReady",
                    "message": "kubelet is posting ready status",
                    "lastHeartbeatTime": stamp,
                    "lastTransitionTime": stamp,
                }
            ],
            "addresses": [{"type": "Hostname", "address": name}],
            "daemonEndpoints": {"kubeletEndpoint": {"Port": 10250}},
            "nodeInfo": {
                "architecture": "amd64",
                "bootID": new_uid(),
                "containerRuntimeVersion": "containerd://1.7.20",
                "kernelVersion": "6.8.0-45-generic",
                "kubeProxyVersion": "v1.31.0",
                "kubeletVersion": "v1.31.0",
                "machineID": uuid.uuid5(uuid.NAMESPACE_DNS, name).hex,
                "operatingSystem": "linux",
                "osImage": "Ubuntu 24.04.1 LTS",
                "systemUUID": str(uuid.uuid5(uuid.NAMESPACE_URL, name)),
            },
        },
    }


def gpu_node(
    name: str,
    *,
    gpus: int = 8,
    product: str = "NVIDIA-H200",
    memory_mib: int = 143771,
    mig_capable: bool = True,
    labels: dict[str, str] | None = None,
) -> dict:
    """A GPU node right after the operator's first pass: feature-discovery labels, MIG off everywhere, no
    sharing."""
    gpu_labels = {
        GPU_PRESENT_LABEL: "true",
        PRODUCT_LABEL: product,
        GPU_COUNT_LABEL: str(gpus),
        REPLICAS_LABEL: str(NO_SHARING.replicas),
        STRATEGY_LABEL: NO_SHARING.strategy,
        "nvidia.com/gpu.memory": str(memory_mib),
        MIG_CAPABLE_LABEL: "true" if mig_capable else "false",
        "nvidia.com/mig.strategy": "mixed",
        CONFIG_LABEL: ALL_DISABLED,
        STATE_LABEL: "success",
        **(labels or {}),
    }
    return node(
        name,
        labels=gpu_labels,
        capacity={**NODE_RESOURCES, GPU_RESOURCE: str(gpus)},
        annotations={LAYOUT_ANNOTATION: json.dumps(disabled_layout(gpus))},
    )


def plain_node(name: str, *, labels: dict[str, str] | None) -> dict:
    return node(name, labels=dict(labels or {}), capacity=dict(NODE_RESOURCES), annotations={})


def namespace(name: str, labels: dict[str, str] | None = None) -> dict:
    return {
        "apiVersion": "v1",
        "kind": "Namespace",
        "metadata": {"name": name, "labels": dict(labels or {})},
        "spec": {"finalizers": ["kubernetes"]},
        "status": {"phase": "Active"},
    }


def pod(
    namespace_name: str,
    name: str,
    *,
    node_name: str,
    resources: dict[str, int],
    phase: str,
    labels: dict[str, str] | None,
    resource_claims: list[dict] | None = None,
    claims: list[str] | None = None,
) -> dict:
    """One container asking for `resources`; with `resource_claims`, the pod's `spec.resourceClaims`, of
    which its container uses those named in `claims`."""
    quantities = {resource: str(amount) for resource, amount in resources.items()}
    container_resources: dict[str, Any] = {"requests": dict(quantities), "limits": dict(quantities)}
    if claims:
        container_resources["claims"] = [{"name": claim} for claim in claims]
    spec: dict[str, Any] = {
        "nodeName": node_name,
        "restartPolicy": "Never",
        "containers": [
            {"name": "main", "image": "registry.example/workload:latest", "resources": container_resources}
        ],
    }
    if resource_claims:
        spec["resourceClaims"] = [dict(claim) for claim in resource_claims]
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": namespace_name, "labels": dict(labels or {})},
        "spec": spec,
        "status": {"phase": phase},
    }


_SUFFIXES = {
    "m": Decimal("0.001"),
    "k": Decimal(10**3),
    "M": Decimal(10**6),
    "G": Decimal(10**9),
    "T": Decimal(10**12),
    "Ki": Decimal(2**10),
    "Mi": Decimal(2**20),
    "Gi": Decimal(2**30),
    "Ti": Decimal(2**40),
}


def quantity(value: str) -> Decimal:
    """A Kubernetes quantity ("500m", "4Gi", "2") as a number; unparsable ones count as zero."""
    for suffix in sorted(_SUFFIXES, key=len, reverse=True):
        if value.endswith(suffix):
            number, scale = value[: -len(suffix)], _SUFFIXES[suffix]
            break
    else:
        number, scale = value, Decimal(1)
    try:
        return Decimal(number) * scale
    except InvalidOperation:
        return Decimal(0)


def format_quantity(amount: Decimal) -> str:
    if amount == amount.to_integral_value():
        return str(int(amount))
    return f"{int(amount * 1000)}m"


def quota_usage(hard: dict[str, str], pods: list[dict]) -> dict[str, str]:
    """`status.used` for the keys of `spec.hard`, over the non-terminal pods of the quota's namespace."""
    running = [p for p in pods if p.get("status", {}).get("phase") not in TERMINAL_PHASES]
    used: dict[str, str] = {}
    for key in hard:
        if key == "pods":
            used[key] = str(len(running))
            continue
        section, _, resource = (
            key.partition(".") if key.startswith(("requests.", "limits.")) else ("", "", key)
        )
        field = "limits" if section == "limits" else "requests"
        total = Decimal(0)
        for p in running:
            for container in p.get("spec", {}).get("containers", []):
                amount = container.get("resources", {}).get(field, {}).get(resource)
                if amount is not None:
                    total += quantity(str(amount))
        used[key] = format_quantity(total)
    return used


def quota_status(quota: dict, pods: list[dict]) -> dict[str, Any]:
    hard = dict(quota.get("spec", {}).get("hard") or {})
    return {"hard": hard, "used": quota_usage(hard, pods)}
