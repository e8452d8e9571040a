"""Pods created, changed and deleted over HTTP in the test API server, through the official client: a real
server's defaults and validation, ResourceClaims named in `spec.resourceClaims` and used by containers, a
spec fixed once created, and the quota usage that follows; and `add_pod` arranging the same."""

from __future__ import annotations

import json

import pytest
from kubernetes import client
from kubernetes.client import ApiException

from tests.kube.server import KubeApiServer

TEAM = "team-a"


@pytest.fixture
def kube() -> KubeApiServer:
    with KubeApiServer() as server:
        server.add_namespace(TEAM)
        yield server


def pod(name: str = "trainer", *, pod_claims=None, container_claims=None, **container) -> dict:
    resources = {"claims": [{"name": claim} for claim in container_claims]} if container_claims else {}
    spec = {
        "containers": [
            {"name": "main", "image": "registry.example/train:1", "resources": resources, **container}
        ]
    }
    if pod_claims is not None:
        spec["resourceClaims"] = pod_claims
    return {"metadata": {"name": name, "labels": {"app": "train"}}, "spec": spec}


GPU_CLAIMS = [{"name": "gpu", "resourceClaimName": "pool-gpu-0"}]


def refusal(call) -> tuple[int, str]:
    with pytest.raises(ApiException) as raised:
        call()
    return raised.value.status, json.loads(raised.value.body)["message"]


def post(kube: KubeApiServer, core, body: dict) -> tuple[int, str]:
    """Sent as it is: the client's own models refuse some invalid pods before sending them."""
    headers = {"Authorization": f"Bearer {kube.token}", "Content-Type": "application/json"}
    url = f"{kube.url}/api/v1/namespaces/{TEAM}/pods"
    response = core.api_client.rest_client.request("POST", url, headers=headers, body=body)
    return response.status, json.loads(response.read())["message"]


def test_a_pod_naming_its_claims_is_created_read_and_deleted(kube, core):
    created = core.create_namespaced_pod(TEAM, pod(pod_claims=GPU_CLAIMS, container_claims=["gpu"]))
    listed = core.list_namespaced_pod(TEAM)
    deleted = core.delete_namespaced_pod("trainer", TEAM)

    assert created.spec.resource_claims[0].resource_claim_name == "pool-gpu-0"
    assert created.spec.containers[0].resources.claims[0].name == "gpu"
    assert (created.status.phase, created.spec.dns_policy, created.spec.restart_policy) == (
        "Pending",
        "ClusterFirst",
        "Always",
    )
    assert [p.metadata.name for p in listed.items] == ["trainer"]
    assert deleted.metadata.name == "trainer" and kube.objects("Pod") == []


@pytest.mark.parametrize(
    ("body", "problem"),
    [
        (
            pod(pod_claims=GPU_CLAIMS, container_claims=["gpus"]),
            'spec.containers[0].resources.claims[0]: Not found: "gpus": must be one of the names in '
            "pod.spec.resourceClaims: gpu",
        ),
        (
            pod(container_claims=["gpu"]),
            'spec.containers[0].resources.claims[0]: Not found: "gpu": must be one of the names in '
            "pod.spec.resourceClaims which is empty",
        ),
        (pod(pod_claims=[{"resourceClaimName": "c"}]), "spec.resourceClaims[0].name: Required value"),
        (
            pod(pod_claims=[{"name": "gpu"}]),
            "spec.resourceClaims[0]: Invalid value: must specify one of: `resourceClaimName`, "
            "`resourceClaimTemplateName`",
        ),
        (
            pod(pod_claims=[{"name": "gpu", "resourceClaimName": "c", "resourceClaimTemplateName": "t"}]),
            "spec.resourceClaims[0]: Invalid value: at most one of",
        ),
        (pod(pod_claims=GPU_CLAIMS * 2), 'spec.resourceClaims[1].name: Duplicate value: "gpu"'),
        (pod(image=""), "spec.containers[0].image: Required value"),
        ({"metadata": {"name": "trainer"}, "spec": {"containers": []}}, "spec.containers: Required value"),
    ],
    ids=[
        "unknown-claim",
        "no-pod-claims",
        "claim-without-name",
        "claim-without-source",
        "claim-with-two-sources",
        "duplicate-claim",
        "no-image",
        "no-containers",
    ],
)
def test_an_invalid_pod_is_refused_naming_the_field(kube, core, body, problem):
    code, message = post(kube, core, body)

    assert code == 422
    assert message.startswith(f'Pod "trainer" is invalid: {problem}')
    assert kube.objects("Pod") == []


def test_a_pods_spec_is_fixed_but_for_its_images(core):
    core.create_namespaced_pod(TEAM, pod(pod_claims=GPU_CLAIMS, container_claims=["gpu"]))

    relabelled = core.patch_namespaced_pod("trainer", TEAM, {"metadata": {"labels": {"app": "eval"}}})
    new_image = core.patch_namespaced_pod(
        "trainer",
        TEAM,
        [{"op": "replace", "path": "/spec/containers/0/image", "value": "registry.example/train:2"}],
    )
    code, message = refusal(
        lambda: core.patch_namespaced_pod("trainer", TEAM, {"spec": {"restartPolicy": "Never"}})
    )

    assert relabelled.metadata.labels == {"app": "eval"}
    assert new_image.spec.containers[0].image == "registry.example/train:2"
    assert code == 422 and message.startswith(
        'Pod "trainer" is invalid: spec: Forbidden: pod updates may not change'
    )


def test_add_pod_arranges_a_pod_with_claims_that_http_can_relabel(kube, core):
    kube.add_pod(TEAM, "arranged", node="gpu-a", resources={}, resource_claims=GPU_CLAIMS, claims=["gpu"])

    relabelled = core.patch_namespaced_pod("arranged", TEAM, {"metadata": {"labels": {"seen": "yes"}}})

    assert relabelled.spec.resource_claims[0].name == "gpu"
    assert relabelled.spec.containers[0].resources.claims[0].name == "gpu"
    assert relabelled.spec.node_name == "gpu-a" and relabelled.status.phase == "Running"


def test_pods_over_http_count_in_the_namespaces_quota(kube, core):
    core.create_namespaced_resource_quota(TEAM, {"metadata": {"name": "q"}, "spec": {"hard": {"pods": "5"}}})

    core.create_namespaced_pod(TEAM, pod("a"))
    core.create_namespaced_pod(TEAM, pod("b"))
    core.delete_namespaced_pod("a", TEAM)

    assert core.read_namespaced_resource_quota("q", TEAM).status.used == {"pods": "1"}


def test_a_policy_can_require_pods_to_name_claims(core):
    policies = client.AdmissionregistrationV1Api(core.api_client)
    rule = {"apiGroups": [""], "apiVersions": ["v1"], "operations": ["CREATE"], "resources": ["pods"]}
    policies.create_validating_admission_policy(
        {
            "metadata": {"name": "claims-only"},
            "spec": {
                "matchConstraints": {"resourceRules": [rule]},
                "validations": [
                    {
                        "expression": "object.spec.containers.all(c, has(c.resources.claims))",
                        "message": "name your pool's claims",
                        "reason": "Forbidden",
                    }
                ],
            },
        }
    )
    policies.create_validating_admission_policy_binding(
        {
            "metadata": {"name": "claims-only"},
            "spec": {"policyName": "claims-only", "validationActions": ["Deny"]},
        }
    )

    core.create_namespaced_pod(TEAM, pod("claimed", pod_claims=GPU_CLAIMS, container_claims=["gpu"]))
    code, message = refusal(lambda: core.create_namespaced_pod(TEAM, pod("bare")))

    assert code == 403 and message.endswith("denied request: name your pool's claims")
