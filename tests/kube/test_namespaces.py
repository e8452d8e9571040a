"""The test API server's namespaces, resource quotas and config maps, driven only through the official
client: created once, read, replaced, patched and deleted as a real API server does, stale writes refused."""

from __future__ import annotations

import json

import pytest
from kubernetes.client import (
    ApiException,
    V1ConfigMap,
    V1Namespace,
    V1ObjectMeta,
    V1ResourceQuota,
    V1ResourceQuotaSpec,
)

from tests.kube.client import reason


def test_a_namespace_is_created_once(core):
    created = core.create_namespace(
        V1Namespace(metadata=V1ObjectMeta(name="acme-vision", labels={"t": "acme"}))
    )

    with pytest.raises(ApiException) as raised:
        core.create_namespace(V1Namespace(metadata=V1ObjectMeta(name="acme-vision")))

    assert created.status.phase == "Active"
    assert created.metadata.labels == {"t": "acme", "kubernetes.io/metadata.name": "acme-vision"}
    assert raised.value.status == 409
    assert reason(raised.value) == "AlreadyExists"


def test_a_namespace_is_relabelled_listed_and_deleted(core):
    core.create_namespace(V1Namespace(metadata=V1ObjectMeta(name="acme-vision")))

    core.patch_namespace("acme-vision", {"metadata": {"labels": {"portal/tenant": "acme"}}})
    listed = core.list_namespace(label_selector="portal/tenant=acme")
    core.delete_namespace("acme-vision")

    assert [namespace.metadata.name for namespace in listed.items] == ["acme-vision"]
    with pytest.raises(ApiException) as raised:
        core.read_namespace("acme-vision")
    assert raised.value.status == 404


def test_gpu_operator_namespace_exists_from_the_start(core):
    assert core.read_namespace("gpu-operator").status.phase == "Active"


def test_a_namespace_made_before_the_portal_came_is_there_with_its_labels(kube, core):
    kube.add_namespace("monitoring", labels={"team": "observability"})

    read = core.read_namespace("monitoring")
    with pytest.raises(ApiException) as raised:
        core.create_namespace(V1Namespace(metadata=V1ObjectMeta(name="monitoring")))

    assert read.metadata.labels == {"team": "observability", "kubernetes.io/metadata.name": "monitoring"}
    assert raised.value.status == 409


def quota(name: str, gpus: str, resource_version: str | None = None) -> V1ResourceQuota:
    return V1ResourceQuota(
        metadata=V1ObjectMeta(name=name, resource_version=resource_version),
        spec=V1ResourceQuotaSpec(hard={"requests.nvidia.com/gpu": gpus, "pods": "10"}),
    )


def test_a_quota_is_created_read_replaced_and_deleted(kube, core):
    core.create_namespace(V1Namespace(metadata=V1ObjectMeta(name="acme-vision")))
    kube.add_gpu_node("gpu-a")
    kube.add_pod("acme-vision", "train-0", node="gpu-a", resources={"nvidia.com/gpu": 2})
    kube.add_pod("acme-vision", "done-0", node="gpu-a", resources={"nvidia.com/gpu": 4}, phase="Succeeded")

    created = core.create_namespaced_resource_quota("acme-vision", quota("gpus", "4"))
    read = core.read_namespaced_resource_quota("gpus", "acme-vision")
    replaced = core.replace_namespaced_resource_quota("gpus", "acme-vision", quota("gpus", "8"))
    core.delete_namespaced_resource_quota("gpus", "acme-vision")

    assert read.spec.hard == created.spec.hard == {"requests.nvidia.com/gpu": "4", "pods": "10"}
    assert read.status.used == {"requests.nvidia.com/gpu": "2", "pods": "1"}
    assert (
        replaced.spec.hard["requests.nvidia.com/gpu"]
        == replaced.status.hard["requests.nvidia.com/gpu"]
        == "8"
    )
    assert int(replaced.metadata.resource_version) > int(created.metadata.resource_version)
    assert replaced.metadata.uid == created.metadata.uid
    with pytest.raises(ApiException) as raised:
        core.read_namespaced_resource_quota("gpus", "acme-vision")
    assert raised.value.status == 404


def test_a_quota_in_a_missing_namespace_is_not_found(core):
    with pytest.raises(ApiException) as raised:
        core.create_namespaced_resource_quota("ghost", quota("gpus", "4"))

    body = json.loads(raised.value.body)
    assert raised.value.status == 404
    assert body["message"] == 'namespaces "ghost" not found'
    assert body["details"] == {"name": "ghost", "kind": "namespaces"}


def test_a_stale_resource_version_conflicts(core):
    core.create_namespace(V1Namespace(metadata=V1ObjectMeta(name="acme-vision")))
    first = core.create_namespaced_resource_quota("acme-vision", quota("gpus", "4"))
    core.replace_namespaced_resource_quota(
        "gpus", "acme-vision", quota("gpus", "6", resource_version=first.metadata.resource_version)
    )

    with pytest.raises(ApiException) as raised:
        core.replace_namespaced_resource_quota(
            "gpus", "acme-vision", quota("gpus", "8", resource_version=first.metadata.resource_version)
        )

    assert raised.value.status == 409
    assert reason(raised.value) == "Conflict"
    assert (
        core.read_namespaced_resource_quota("gpus", "acme-vision").spec.hard["requests.nvidia.com/gpu"] == "6"
    )


def test_a_config_map_is_created_replaced_and_patched(core):
    created = core.create_namespaced_config_map(
        "gpu-operator", V1ConfigMap(metadata=V1ObjectMeta(name="layouts"), data={"config.yaml": "a"})
    )
    created.data = {"config.yaml": "b"}

    replaced = core.replace_namespaced_config_map("layouts", "gpu-operator", created)
    patched = core.patch_namespaced_config_map("layouts", "gpu-operator", {"data": {"extra": "c"}})

    assert replaced.data == {"config.yaml": "b"}
    assert patched.data == {"config.yaml": "b", "extra": "c"}
    with pytest.raises(ApiException) as raised:
        core.replace_namespaced_config_map("layouts", "gpu-operator", created)  # created's version is stale
    assert raised.value.status == 409


def test_an_unchanged_write_keeps_its_resource_version(core):
    created = core.create_namespaced_config_map(
        "gpu-operator", V1ConfigMap(metadata=V1ObjectMeta(name="layouts"), data={"config.yaml": "a"})
    )

    patched = core.patch_namespaced_config_map("layouts", "gpu-operator", {"data": {"config.yaml": "a"}})

    assert patched.metadata.resource_version == created.metadata.resource_version
