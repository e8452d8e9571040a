"""The official Kubernetes client on the test API server, as the tests of tests/kube/ use it: a client
connected with a kubeconfig, the reason of a refusal, and the MIG manager's labels and resources read back."""

from __future__ import annotations

import json
import time
from pathlib import Path

from kubernetes.client import ApiException, CoreV1Api, V1ConfigMap, V1Node, V1ObjectMeta
from kubernetes.config import new_client_from_config

from tests.kube.server import KubeApiServer

STATE = "nvidia.com/mig.config.state"
CONFIG = "nvidia.com/mig.config"
LAYOUT = "test.kube/mig-layout"
MIG_CONFIG_MAP = ("gpu-operator", "custom-mig-parted-config")

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
