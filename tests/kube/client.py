"""The official Kubernetes client on the test API server, as the tests of tests/kube/ use it: a client
connected with a kubeconfig, the reason of a refusal, the MIG manager's and the device plugin's configs
written and asked for, and their labels and resources read back."""

from __future__ import annotations

import json
import time
from pathlib import Path

import yaml
from kubernetes.client import ApiException, CoreV1Api, V1ConfigMap, V1Node, V1ObjectMeta
from kubernetes.config import new_client_from_config

from tests.kube.server import KubeApiServer

STATE = "nvidia.com/mig.config.state"
CONFIG = "nvidia.com/mig.config"
LAYOUT = "test.kube/mig-layout"
MIG_CONFIG_MAP = ("gpu-operator", "custom-mig-parted-config")
DEVICE_PLUGIN_CONFIG = "nvidia.com/device-plugin.config"
DEVICE_PLUGIN_CONFIG_MAP = ("gpu-operator", "gpu-portal-device-plugin")
GPU_LABELS = (
    "nvidia.com/gpu.product",
    "nvidia.com/gpu.count",
    "nvidia.com/gpu.replicas",
    "nvidia.com/gpu.sharing-strategy",
)

# Per-GPU layouts on one 8-GPU H200 node, as the portal would write them.
MIG_PARTED_YAML = """
version: v1
mig-configs:
  vision-mixed:
    - devices: [0, 1]
      mig-enabled: true
      mig-devices: {"1g.18gb": 7}
    - devices: [2]
      mig-enabled: true
      mig-devices: {"3g.71gb": 2}
    - devices: [3]
      mig-enabled: true
      mig-devices: {"1g.18gb+me": 1, "2g.35gb": 1, "3g.71gb": 1}
    - devices: [4, 5, 6, 7]
      mig-enabled: false
  first-gpu-whole-slice:
    - devices: [0]
      mig-enabled: true
      mig-devices: {"7g.141gb": 1}
  every-gpu-halved:
    - devices: all
      mig-enabled: true
      mig-devices: {"3g.71gb": 2}
"""


def connect(server: KubeApiServer, directory: Path, *, token: str | None = None) -> CoreV1Api:
    kubeconfig = server.write_kubeconfig(directory / f"kubeconfig-{token or 'own'}", token=token)
    return CoreV1Api(new_client_from_config(config_file=str(kubeconfig)))


def reason(error: ApiException) -> str:
    return json.loads(error.body)["reason"]


def write_mig_config(core: CoreV1Api, text: str = MIG_PARTED_YAML) -> None:
    namespace, name = MIG_CONFIG_MAP
    core.create_namespaced_config_map(
        namespace, V1ConfigMap(metadata=V1ObjectMeta(name=name), data={"config.yaml": text})
    )


def ask_for_mig_config(core: CoreV1Api, node: str, config: str) -> V1Node:
    return core.patch_node(node, {"metadata": {"labels": {CONFIG: config}}})


def wait_for_state(core: CoreV1Api, node: str, states: set[str], timeout: float = 5.0) -> V1Node:
    deadline = time.monotonic() + timeout
    while True:
        current = core.read_node(node)
        if current.metadata.labels[STATE] in states:
            return current
        assert time.monotonic() < deadline, f"{node} stayed {current.metadata.labels[STATE]}, not {states}"
        time.sleep(0.01)


def mig_resources(node: V1Node, field: str = "allocatable") -> dict[str, str]:
    resources = getattr(node.status, field)
    return {name: value for name, value in resources.items() if name.startswith("nvidia.com/")}


def mig_count_labels(node: V1Node) -> dict[str, str]:
    return {key: value for key, value in node.metadata.labels.items() if key.startswith("nvidia.com/mig-")}


def sharing_config(replicas: int, *, strategy: str = "timeSlicing", rename_by_default: bool = False) -> str:
    """A device-plugin config file (YAML) sharing each full GPU among `replicas` pods; `strategy` is the
    block's key, `timeSlicing` or `mps`."""
    block = {
        "renameByDefault": rename_by_default,
        "resources": [{"name": "nvidia.com/gpu", "replicas": replicas}],
    }
    return yaml.safe_dump({"version": "v1", "sharing": {strategy: block}}, sort_keys=False)


def write_device_plugin_config(core: CoreV1Api, configs: dict[str, str]) -> None:
    """Create the device plugin's ConfigMap with these configs (key: YAML), or replace its data."""
    namespace, name = DEVICE_PLUGIN_CONFIG_MAP
    body = V1ConfigMap(metadata=V1ObjectMeta(name=name), data=configs)
    try:
        core.create_namespaced_config_map(namespace, body)
    except ApiException as error:
        if error.status != 409:
            raise
        core.replace_namespaced_config_map(name, namespace, body)


def ask_for_device_plugin_config(core: CoreV1Api, node: str, config: str | None) -> V1Node:
    """Label a node with a device-plugin config; None removes the label, back to the default (no sharing)."""
    return core.patch_node(node, {"metadata": {"labels": {DEVICE_PLUGIN_CONFIG: config}}})


def wait_for_write(core: CoreV1Api, before: V1Node, timeout: float = 5.0) -> V1Node:
    """The node once something wrote it after `before` was read: an emulated operand applied."""
    deadline = time.monotonic() + timeout
    while True:
        current = core.read_node(before.metadata.name)
        if current.metadata.resource_version != before.metadata.resource_version:
            return current
        assert time.monotonic() < deadline, f"nothing wrote {before.metadata.name} in {timeout} s"
        time.sleep(0.01)


def gpu_labels(node: V1Node) -> dict[str, str]:
    """Feature discovery's labels of the node's full GPUs: product, count, replicas, sharing strategy."""
    return {key: node.metadata.labels[key] for key in GPU_LABELS if key in node.metadata.labels}
