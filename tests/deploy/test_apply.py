"""The manifests applied to the project's Kubernetes API server through the official client, in the
kustomization's order, and read back: what a first `kubectl apply -k deploy/kubernetes` would store."""

import base64
import json
from collections.abc import Iterator

import pytest
from kubernetes.client import ApiClient
from kubernetes.config import new_client_from_config
from kubernetes.utils import FailToCreateError

from tests.deploy.manifests import apply, manifests, read_back
from tests.kube.server import KubeApiServer

SERVER_OWNED = {"uid", "resourceVersion", "creationTimestamp", "generation"}


@pytest.fixture
def kube() -> Iterator[KubeApiServer]:
    with KubeApiServer() as server:
        yield server


@pytest.fixture
def admin(kube, tmp_path) -> Iterator[ApiClient]:
    api_client = new_client_from_config(config_file=str(kube.write_kubeconfig(tmp_path / "kubeconfig")))
    yield api_client
    api_client.close()


def is_subset(expected, actual) -> bool:
    """Whether everything the manifest says is in what the server answers, which may add its defaults."""
    if isinstance(expected, dict):
        return isinstance(actual, dict) and all(
            k in actual and is_subset(v, actual[k]) for k, v in expected.items()
        )
    if isinstance(expected, list):
        return (
            isinstance(actual, list)
            and len(expected) == len(actual)
            and all(is_subset(e, a) for e, a in zip(expected, actual, strict=True))
        )
    return expected == actual


def test_the_subset_rule_sees_a_changed_or_missing_field():
    assert is_subset({"a": [{"b": 1}]}, {"a": [{"b": 1, "c": 2}], "d": 3})
    assert not is_subset({"a": [{"b": 1}]}, {"a": [{"b": 2}]})
    assert not is_subset({"a": [1, 2]}, {"a": [1]})
    assert not is_subset({"a": 1}, {})


def test_every_manifest_is_stored_as_written(kube, admin):
    objects = [manifest.obj for manifest in manifests()]

    apply(admin, objects)

    assert not kube.errors
    for obj in objects:
        stored = read_back(admin, obj)
        where = f"{obj['kind']} {obj['metadata']['name']}"
        assert (stored["apiVersion"], stored["kind"]) == (obj["apiVersion"], obj["kind"]), where
        metadata = {k: v for k, v in obj["metadata"].items() if k not in SERVER_OWNED}
        assert is_subset(metadata, stored["metadata"]), where
        for field, value in obj.items():
            if field in ("apiVersion", "kind", "metadata", "stringData"):
                continue
            assert is_subset(value, stored.get(field)), f"{where}: {field} differs"


def test_the_secret_is_stored_as_base64_data(kube, admin):
    objects = [manifest.obj for manifest in manifests()]
    apply(admin, objects)
    (secret,) = [obj for obj in objects if obj["kind"] == "Secret"]

    stored = read_back(admin, secret)

    assert "stringData" not in stored
    decoded = {key: base64.b64decode(value).decode() for key, value in stored["data"].items()}
    assert decoded == secret["stringData"]


def test_the_server_fills_in_what_a_real_one_would(kube, admin):
    apply(admin, [manifest.obj for manifest in manifests()])

    web = kube.get("Deployment", "gpu-portal-web", "gpu-portal")
    beat = kube.get("Deployment", "gpu-portal-beat", "gpu-portal")
    job = kube.get("Job", "gpu-portal-migrate", "gpu-portal")
    service = kube.get("Service", "gpu-portal-web", "gpu-portal")
    assert web["metadata"]["generation"] == 1
    assert beat["spec"]["strategy"] == {"type": "Recreate"}  # no rollingUpdate added to a Recreate
    assert job["spec"]["selector"]["matchLabels"] == {
        "batch.kubernetes.io/controller-uid": job["metadata"]["uid"]
    }
    assert service["spec"]["clusterIP"].startswith("10.96.")


def test_applying_in_the_wrong_order_fails_as_it_would_on_a_cluster(kube, admin):
    """Everything lives in the namespace the first file makes: without it nothing namespaced is stored."""
    objects = [manifest.obj for manifest in manifests() if manifest.kind != "Namespace"]
    account = next(obj for obj in objects if obj["kind"] == "ServiceAccount")

    with pytest.raises(FailToCreateError) as raised:
        apply(admin, [account])

    (error,) = raised.value.api_exceptions
    assert (error.status, json.loads(error.body)["message"]) == (404, 'namespaces "gpu-portal" not found')
    assert kube.get("ServiceAccount", "gpu-portal", "gpu-portal") is None
