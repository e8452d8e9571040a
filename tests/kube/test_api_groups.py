"""The test API server's API groups (apps, batch, networking.k8s.io, policy, rbac.authorization.k8s.io,
admissionregistration.k8s.io, authentication.k8s.io) and the core kinds a deployment uses, driven through the
official client's typed APIs and discovery."""

from __future__ import annotations

import base64
import json
from collections.abc import Iterator
from pathlib import Path

import pytest
from kubernetes import client
from kubernetes.client import ApiClient, ApiException
from kubernetes.config import new_client_from_config
from kubernetes.dynamic import DynamicClient

from tests.kube.server import KubeApiServer

LABELS = {"app.kubernetes.io/name": "shop"}


@pytest.fixture
def kube() -> Iterator[KubeApiServer]:
    with KubeApiServer() as server:
        server.add_namespace("shop")
        yield server


@pytest.fixture
def api(kube: KubeApiServer, tmp_path: Path) -> Iterator[ApiClient]:
    api_client = new_client_from_config(config_file=str(kube.write_kubeconfig(tmp_path / "kubeconfig")))
    yield api_client
    api_client.close()


def deployment(name: str = "web", *, labels: dict[str, str] | None = None, image: str = "shop:1.2") -> dict:
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": name},
        "spec": {
            "replicas": 2,
            "selector": {"matchLabels": LABELS},
            "template": {
                "metadata": {"labels": LABELS if labels is None else labels},
                "spec": {"containers": [{"name": "web", "image": image}]},
            },
        },
    }


def problem(error: ApiException) -> tuple[int, str, str]:
    body = json.loads(error.body)
    return error.status, body["reason"], body["message"]


def test_a_deployment_is_created_read_listed_scaled_and_deleted(kube, api):
    apps = client.AppsV1Api(api)

    created = apps.create_namespaced_deployment("shop", deployment())
    listed = apps.list_namespaced_deployment("shop")
    scaled = apps.patch_namespaced_deployment("web", "shop", {"spec": {"replicas": 5}})
    deleted = apps.delete_namespaced_deployment("web", "shop")

    assert (created.api_version, created.kind, created.metadata.generation) == ("apps/v1", "Deployment", 1)
    assert created.spec.strategy.type == "RollingUpdate"  # a real server's defaults
    assert created.spec.template.spec.containers[0].image_pull_policy == "IfNotPresent"
    assert (listed.api_version, listed.kind) == ("apps/v1", "DeploymentList")
    assert [item.metadata.name for item in listed.items] == ["web"]
    assert (scaled.spec.replicas, scaled.metadata.generation) == (5, 2)
    assert (deleted["status"], deleted["details"]["group"], deleted["details"]["kind"]) == (
        "Success",
        "apps",
        "deployments",
    )
    assert kube.objects("Deployment") == []


def test_a_write_that_leaves_the_spec_alone_keeps_the_generation(api):
    apps = client.AppsV1Api(api)
    apps.create_namespaced_deployment("shop", deployment())

    relabelled = apps.patch_namespaced_deployment("web", "shop", {"metadata": {"labels": {"tier": "front"}}})
    with_status = apps.patch_namespaced_deployment("web", "shop", {"status": {"replicas": 9}})

    assert relabelled.metadata.generation == with_status.metadata.generation == 1
    assert not with_status.status.replicas  # status belongs to its subresource


@pytest.mark.parametrize(
    ("body", "field"),
    [
        (deployment(labels={"app.kubernetes.io/name": "other"}), "spec.template.metadata.labels"),
        (deployment(image=""), "spec.template.spec.containers[0].image"),
        (
            {
                **deployment(),
                "spec": {**deployment()["spec"], "strategy": {"type": "Recreate", "rollingUpdate": {}}},
            },
            "spec.strategy.rollingUpdate",
        ),
    ],
    ids=["selector-does-not-match", "no-image", "recreate-with-rolling-update"],
)
def test_an_invalid_deployment_is_refused(api, body, field):
    with pytest.raises(ApiException) as raised:
        client.AppsV1Api(api).create_namespaced_deployment("shop", body)

    code, reason, message = problem(raised.value)
    assert (code, reason) == (422, "Invalid")
    assert message.startswith(f'Deployment.apps "web" is invalid: {field}: ')


def test_a_body_of_another_api_version_is_refused(api):
    body = {**deployment(), "apiVersion": "apps/v1beta1"}

    with pytest.raises(ApiException) as raised:
        client.AppsV1Api(api).create_namespaced_deployment("shop", body)

    assert problem(raised.value)[:2] == (400, "BadRequest")


def test_a_latest_or_untagged_image_is_always_pulled(api):
    apps = client.AppsV1Api(api)

    latest = apps.create_namespaced_deployment("shop", deployment("a", image="registry:5000/shop"))
    pinned = apps.create_namespaced_deployment("shop", deployment("b", image="registry:5000/shop:1.2"))

    assert latest.spec.template.spec.containers[0].image_pull_policy == "Always"
    assert pinned.spec.template.spec.containers[0].image_pull_policy == "IfNotPresent"


def test_a_secret_folds_string_data_into_base64_data(api):
    core = client.CoreV1Api(api)
    body = {
        "metadata": {"name": "keys"},
        "data": {"a": base64.b64encode(b"1").decode()},
        "stringData": {"b": "2"},
    }

    created = core.create_namespaced_secret("shop", body)
    patched = core.patch_namespaced_secret("keys", "shop", {"stringData": {"a": "3"}})

    assert created.type == "Opaque"
    assert {k: base64.b64decode(v).decode() for k, v in created.data.items()} == {"a": "1", "b": "2"}
    assert {k: base64.b64decode(v).decode() for k, v in patched.data.items()} == {"a": "3", "b": "2"}
    assert patched.string_data is None


def test_a_service_gets_a_cluster_ip_that_stays(api):
    core = client.CoreV1Api(api)
    spec = {"selector": LABELS, "ports": [{"name": "http", "port": 80, "targetPort": "http"}]}

    created = core.create_namespaced_service("shop", {"metadata": {"name": "web"}, "spec": spec})
    headless = core.create_namespaced_service(
        "shop", {"metadata": {"name": "each"}, "spec": {**spec, "clusterIP": "None"}}
    )
    replaced = core.replace_namespaced_service("web", "shop", {"metadata": {"name": "web"}, "spec": spec})
    with pytest.raises(ApiException) as raised:
        core.patch_namespaced_service("web", "shop", {"spec": {"clusterIP": "10.96.9.9"}})

    assert created.spec.cluster_ip.startswith("10.96.") and created.spec.type == "ClusterIP"
    assert created.spec.ports[0].protocol == "TCP"
    assert headless.spec.cluster_ip == "None"
    assert replaced.spec.cluster_ip == created.spec.cluster_ip
    assert problem(raised.value)[:2] == (422, "Invalid")


def job(restart_policy: str = "Never") -> dict:
    container = {"name": "migrate", "image": "shop:1.2", "command": ["migrate"]}
    return {
        "metadata": {"name": "migrate"},
        "spec": {"template": {"spec": {"restartPolicy": restart_policy, "containers": [container]}}},
    }


def test_a_job_selects_its_pods_by_its_uid_and_keeps_its_pod_template(api):
    batch = client.BatchV1Api(api)

    created = batch.create_namespaced_job("shop", job())
    with pytest.raises(ApiException) as raised:
        batch.patch_namespaced_job(
            "migrate",
            "shop",
            {"spec": {"template": {"spec": {"containers": [{"name": "migrate", "image": "shop:1.3"}]}}}},
        )
    suspended = batch.patch_namespaced_job("migrate", "shop", {"spec": {"suspend": True}})

    uid = created.metadata.uid
    assert created.spec.selector.match_labels == {"batch.kubernetes.io/controller-uid": uid}
    assert created.spec.template.metadata.labels["job-name"] == "migrate"
    assert created.spec.backoff_limit == 6
    code, reason, message = problem(raised.value)
    assert (code, reason) == (
        422,
        "Invalid",
    ) and "spec.template: Invalid value: field is immutable" in message
    assert suspended.spec.suspend is True


def test_a_job_that_restarts_always_is_refused(api):
    with pytest.raises(ApiException) as raised:
        client.BatchV1Api(api).create_namespaced_job("shop", job("Always"))

    assert problem(raised.value)[:2] == (422, "Invalid")


def test_an_ingress_and_a_disruption_budget(api):
    backend = {"service": {"name": "web", "port": {"name": "http"}}}
    rule = {
        "host": "shop.example.com",
        "http": {"paths": [{"path": "/", "pathType": "Prefix", "backend": backend}]},
    }
    ingress = {"metadata": {"name": "shop"}, "spec": {"ingressClassName": "nginx", "rules": [rule]}}
    budget = {"metadata": {"name": "web"}, "spec": {"minAvailable": 1, "selector": {"matchLabels": LABELS}}}

    created = client.NetworkingV1Api(api).create_namespaced_ingress("shop", ingress)
    protected = client.PolicyV1Api(api).create_namespaced_pod_disruption_budget("shop", budget)
    with pytest.raises(ApiException) as raised:
        client.PolicyV1Api(api).create_namespaced_pod_disruption_budget(
            "shop", {"metadata": {"name": "both"}, "spec": {**budget["spec"], "maxUnavailable": 1}}
        )

    assert created.spec.rules[0].http.paths[0].backend.service.port.name == "http"
    assert created.kind == "Ingress" and created.api_version == "networking.k8s.io/v1"
    assert (protected.spec.min_available, protected.status.disruptions_allowed) == (1, 0)
    assert problem(raised.value)[:2] == (422, "Invalid")


def test_rbac_objects_are_stored_and_a_binding_keeps_its_role(api):
    rbac = client.RbacAuthorizationV1Api(api)
    rule = {"apiGroups": [""], "resources": ["pods"], "verbs": ["list"]}
    ref = {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "reader"}
    subject = {"kind": "ServiceAccount", "name": "app", "namespace": "shop"}

    role = rbac.create_cluster_role({"metadata": {"name": "reader"}, "rules": [rule]})
    binding = rbac.create_namespaced_role_binding(
        "shop", {"metadata": {"name": "r"}, "roleRef": ref, "subjects": [subject]}
    )
    with pytest.raises(ApiException) as raised:
        rbac.patch_namespaced_role_binding("r", "shop", {"roleRef": {**ref, "name": "writer"}})
    with pytest.raises(ApiException) as no_verbs:
        rbac.create_namespaced_role("shop", {"metadata": {"name": "empty"}, "rules": [{**rule, "verbs": []}]})

    assert role.rules[0].resources == ["pods"] and role.kind == "ClusterRole"
    assert binding.role_ref.name == "reader" and binding.subjects[0].namespace == "shop"
    assert problem(raised.value)[:2] == problem(no_verbs.value)[:2] == (422, "Invalid")
    assert "system:discovery" in [r.metadata.name for r in rbac.list_cluster_role().items]  # bootstrap role


def test_deleting_a_namespace_takes_its_objects_along(kube, api):
    client.AppsV1Api(api).create_namespaced_deployment("shop", deployment())
    client.CoreV1Api(api).create_namespaced_service_account("shop", {"metadata": {"name": "app"}})

    client.CoreV1Api(api).delete_namespace("shop")

    assert kube.objects("Deployment") == [] and kube.objects("ServiceAccount") == []


def test_discovery_lists_the_groups_and_their_resources(kube, api):
    rest = api.rest_client
    headers = {"Authorization": f"Bearer {kube.token}"}

    groups = json.loads(rest.request("GET", f"{kube.url}/apis", headers=headers).read())
    apps = json.loads(rest.request("GET", f"{kube.url}/apis/apps/v1", headers=headers).read())
    core = json.loads(rest.request("GET", f"{kube.url}/api", headers=headers).read())

    assert [g["name"] for g in groups["groups"]] == [
        "admissionregistration.k8s.io",
        "apps",
        "authentication.k8s.io",
        "batch",
        "networking.k8s.io",
        "policy",
        "rbac.authorization.k8s.io",
        "resource.k8s.io",
    ]
    (deployments,) = apps["resources"]
    assert (deployments["name"], deployments["kind"], deployments["namespaced"]) == (
        "deployments",
        "Deployment",
        True,
    )
    assert core["versions"] == ["v1"]


def test_the_dynamic_client_finds_and_uses_the_groups(kube, api):
    dynamic = DynamicClient(api)
    deployments = dynamic.resources.get(api_version="apps/v1", kind="Deployment")

    deployments.create(body=deployment(), namespace="shop")
    found = deployments.get(namespace="shop")

    assert [item.metadata.name for item in found.items] == ["web"]
