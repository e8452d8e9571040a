"""The Kubernetes driver's configs in the device plugin's ConfigMap, over real HTTP: one key per share mode
that always means the same, written only when missing or different, read by the (emulated) device plugin as
that mode, beside the operator's own keys, which stay as they are."""

import pytest
import yaml
from kubernetes.client import CoreV1Api, V1ConfigMap, V1ObjectMeta
from kubernetes.config import new_client_from_config

from pools.drivers.base import driver_for
from pools.models import Cluster
from tests.factories import ClusterFactory
from tests.kube.device_plugin import read_sharing
from tests.kube.gpu_resources import Sharing
from tests.kube.server import KubeApiServer

OPERATOR_DEFAULT = "version: v1\nflags:\n  migStrategy: mixed\n"


@pytest.fixture
def kube(tmp_path):
    with KubeApiServer(mig_apply_seconds=0.02, device_plugin_config_map="nvidia/plugin-configs") as server:
        server.kubeconfig_path = server.write_kubeconfig(tmp_path / "kubeconfig")
        server.add_gpu_node("gpu-1")
        yield server


@pytest.fixture
def operator(kube) -> CoreV1Api:
    """The cluster's operator, at the API server with the admin's credentials."""
    return CoreV1Api(new_client_from_config(config_file=str(kube.kubeconfig_path)))


@pytest.fixture
def cluster(kube, db):
    return ClusterFactory(
        name="kube",
        driver=Cluster.Driver.KUBERNETES,
        kubeconfig=kube.kubeconfig_path.read_text(),
        device_plugin_config_map="nvidia/plugin-configs",
    )


def configs(kube) -> dict[str, str]:
    found = kube.get("ConfigMap", "plugin-configs", "nvidia")
    return None if found is None else found.get("data") or {}


@pytest.mark.parametrize(
    ("profile", "sharing"),
    [
        ("ts-4", Sharing(strategy="time-slicing", replicas=4, renamed=True)),
        ("mps-8", Sharing(strategy="mps", replicas=8, renamed=True)),
        ("", Sharing()),
    ],
    ids=["time-sliced", "mps", "none"],
)
def test_each_share_mode_is_a_config_the_device_plugin_reads_as_that_mode(profile, sharing, kube, cluster):
    assert configs(kube) is None
    key = driver_for(cluster).apply_sharing("gpu-1", profile)
    assert read_sharing(configs(kube)[key]) == sharing
    assert kube.get("Node", "gpu-1")["metadata"]["labels"]["nvidia.com/device-plugin.config"] == key
    if profile:
        block = next(iter(yaml.safe_load(configs(kube)[key])["sharing"].values()))
        assert block["failRequestsGreaterThanOne"] is True  # one share per container, never two


def test_the_operators_own_keys_stay_and_each_mode_keeps_its_key(kube, cluster, operator):
    operator.create_namespaced_config_map(
        "nvidia",
        V1ConfigMap(metadata=V1ObjectMeta(name="plugin-configs"), data={"default": OPERATOR_DEFAULT}),
    )
    driver = driver_for(cluster)
    driver.apply_sharing("gpu-1", "ts-4")
    first = configs(kube)
    driver.apply_sharing("gpu-1", "mps-2")
    driver.apply_sharing("gpu-1", "ts-4")
    assert set(configs(kube)) == {"default", "portal-ts-4", "portal-mps-2"}
    assert configs(kube)["default"] == OPERATOR_DEFAULT
    assert configs(kube)["portal-ts-4"] == first["portal-ts-4"]


def test_a_config_is_written_only_when_missing_or_different(kube, cluster, operator):
    driver = driver_for(cluster)
    driver.apply_sharing("gpu-1", "ts-4")
    written = kube.get("ConfigMap", "plugin-configs", "nvidia")["metadata"]["resourceVersion"]
    driver.apply_sharing("gpu-1", "ts-4")
    assert kube.get("ConfigMap", "plugin-configs", "nvidia")["metadata"]["resourceVersion"] == written

    right = configs(kube)["portal-ts-4"]
    # Someone changed what the key means.
    operator.patch_namespaced_config_map(
        "plugin-configs", "nvidia", {"data": {"portal-ts-4": "version: v1\n"}}
    )
    driver.apply_sharing("gpu-1", "ts-4")
    assert configs(kube)["portal-ts-4"] == right
