"""The test Kubernetes API server, driven only through the official client: every reply must deserialize."""

from __future__ import annotations

import json

import pytest
from kubernetes.client import (
    ApiException,
)

from tests.kube.client import CONFIG, STATE, connect, reason
from tests.kube.server import KubeApiServer

# --- nodes -----------------------------------------------------------------------------------------------


@pytest.fixture
def three_nodes(kube: KubeApiServer) -> None:
    kube.add_gpu_node("gpu-a")
    kube.add_gpu_node(
        "gpu-b",
        product="NVIDIA-A100-SXM4-80GB",
        memory_mib=81920,
        mig_capable=False,
        labels={"team": "vision"},
    )
    kube.add_node("cpu-a", labels={"team": "recsys"})


@pytest.mark.parametrize(
    ("selector", "expected"),
    [
        ("", ["cpu-a", "gpu-a", "gpu-b"]),
        ("nvidia.com/gpu.present=true", ["gpu-a", "gpu-b"]),
        ("nvidia.com/gpu.product==NVIDIA-A100-SXM4-80GB", ["gpu-b"]),
        ("team!=vision", ["cpu-a", "gpu-a"]),
        ("team", ["cpu-a", "gpu-b"]),
        ("!team", ["gpu-a"]),
        ("team in (vision, recsys)", ["cpu-a", "gpu-b"]),
        ("team notin (vision)", ["cpu-a", "gpu-a"]),
        ("nvidia.com/gpu.present=true,team", ["gpu-b"]),
        ("nvidia.com/mig.capable=true,nvidia.com/mig.strategy=mixed", ["gpu-a"]),
    ],
)
def test_nodes_are_listed_by_label_selector(core, three_nodes, selector, expected):
    nodes = core.list_node(label_selector=selector)

    assert [node.metadata.name for node in nodes.items] == expected
    assert nodes.kind == "NodeList"
    assert int(nodes.metadata.resource_version) > 0


def test_a_malformed_label_selector_is_a_bad_request(core, three_nodes):
    with pytest.raises(ApiException) as raised:
        core.list_node(label_selector="team in vision")

    assert raised.value.status == 400
    assert reason(raised.value) == "BadRequest"


def test_nodes_page_with_limit_and_continue(kube, core):
    names = kube.add_gpu_nodes("gpu-", 25)

    pages = []
    token = None
    while True:
        page = core.list_node(limit=10, _continue=token)
        pages.append(page)
        token = page.metadata._continue
        if not token:
            break

    assert [len(page.items) for page in pages] == [10, 10, 5]
    assert [page.metadata.remaining_item_count for page in pages] == [15, 5, None]
    assert [node.metadata.name for page in pages for node in page.items] == names


def test_a_filtered_page_continues_from_where_it_stopped(kube, core):
    kube.add_gpu_nodes("gpu-", 6)
    kube.add_gpu_nodes("a100-", 6, product="NVIDIA-A100-SXM4-80GB")
    selector = "nvidia.com/gpu.product=NVIDIA-H200"

    first = core.list_node(label_selector=selector, limit=4)
    second = core.list_node(label_selector=selector, limit=4, _continue=first.metadata._continue)

    assert [node.metadata.name for node in first.items + second.items] == [f"gpu-{i}" for i in range(6)]
    assert not second.metadata._continue


def test_a_gpu_node_carries_feature_discovery_labels_and_capacity(kube, core):
    kube.add_gpu_node("gpu-a", gpus=4)

    node = core.read_node("gpu-a")

    assert node.kind == "Node"
    assert node.metadata.uid and node.metadata.creation_timestamp.tzinfo is not None
    assert node.metadata.labels["nvidia.com/gpu.present"] == "true"
    assert node.metadata.labels["nvidia.com/gpu.product"] == "NVIDIA-H200"
    assert node.metadata.labels["nvidia.com/gpu.count"] == "4"
    assert node.metadata.labels["nvidia.com/gpu.memory"] == "143771"
    assert node.metadata.labels[CONFIG] == "all-disabled"
    assert node.metadata.labels[STATE] == "success"
    assert node.status.capacity["nvidia.com/gpu"] == node.status.allocatable["nvidia.com/gpu"] == "4"
    assert [(c.type, c.status) for c in node.status.conditions] == [("Ready", "True")]
    assert node.status.node_info.kubelet_version.startswith("v1.")


def test_a_missing_node_is_not_found(core):
    with pytest.raises(ApiException) as raised:
        core.read_node("nowhere")

    assert raised.value.status == 404
    assert json.loads(raised.value.body)["details"] == {"name": "nowhere", "kind": "nodes"}


def test_a_wrong_token_is_unauthorized(kube, tmp_path):
    kube.add_gpu_node("gpu-a")
    stranger = connect(kube, tmp_path, token="not-the-token")

    with pytest.raises(ApiException) as raised:
        stranger.list_node()

    assert raised.value.status == 401
    assert reason(raised.value) == "Unauthorized"


def test_the_client_sends_a_strategic_merge_patch_for_an_object_body(kube, core):
    kube.add_gpu_node("gpu-a", labels={"team": "vision", "stale": "yes"})

    patched = core.patch_node("gpu-a", {"metadata": {"labels": {"team": "recsys", "stale": None}}})

    assert kube.patch_content_types == ["application/strategic-merge-patch+json"]
    assert patched.metadata.labels["team"] == "recsys"
    assert "stale" not in patched.metadata.labels
    assert patched.metadata.labels["nvidia.com/gpu.present"] == "true"


def test_merge_and_json_patches_change_labels(kube, core):
    kube.add_gpu_node("gpu-a")

    core.patch_node(
        "gpu-a", {"metadata": {"labels": {"team": "vision"}}}, _content_type="application/merge-patch+json"
    )
    core.patch_node("gpu-a", [{"op": "replace", "path": "/metadata/labels/team", "value": "recsys"}])
    core.patch_node("gpu-a", [{"op": "remove", "path": "/metadata/labels/nvidia.com~1gpu.present"}])

    labels = kube.get("Node", "gpu-a")["metadata"]["labels"]
    assert kube.patch_content_types == [
        "application/merge-patch+json",
        "application/json-patch+json",
        "application/json-patch+json",
    ]
    assert labels["team"] == "recsys"
    assert "nvidia.com/gpu.present" not in labels


def test_a_json_patch_on_a_missing_path_is_invalid(kube, core):
    kube.add_gpu_node("gpu-a")

    with pytest.raises(ApiException) as raised:
        core.patch_node("gpu-a", [{"op": "remove", "path": "/metadata/labels/absent"}])

    assert raised.value.status == 422


def test_a_patch_does_not_touch_node_status(kube, core):
    """Status lives in a subresource; a real server ignores it on the main resource."""
    kube.add_gpu_node("gpu-a")

    core.patch_node("gpu-a", {"status": {"allocatable": {"nvidia.com/gpu": "99"}}})

    assert kube.get("Node", "gpu-a")["status"]["allocatable"]["nvidia.com/gpu"] == "8"


def test_nodes_cannot_be_deleted(kube, core):
    kube.add_gpu_node("gpu-a")

    with pytest.raises(ApiException) as raised:
        core.delete_node("gpu-a")

    assert raised.value.status == 405
    assert reason(raised.value) == "MethodNotAllowed"


def test_unknown_paths_and_malformed_bodies(kube, core):
    rest = core.api_client.rest_client
    headers = {"Authorization": f"Bearer {kube.token}", "Content-Type": "text/plain"}

    unknown = rest.request("GET", f"{kube.url}/api/v1/widgets", headers=headers)
    malformed = rest.request("POST", f"{kube.url}/api/v1/namespaces", headers=headers, body="{not json")

    assert (unknown.status, json.loads(unknown.read())["reason"]) == (404, "NotFound")
    assert (malformed.status, json.loads(malformed.read())["reason"]) == (400, "BadRequest")


# --- pods ------------------------------------------------------------------------------------------------


@pytest.fixture
def pods(kube: KubeApiServer) -> None:
    kube.add_pod(
        "acme-vision", "train-0", node="gpu-a", resources={"nvidia.com/gpu": 1}, labels={"app": "train"}
    )
    kube.add_pod("acme-vision", "train-1", node="gpu-b", resources={"nvidia.com/mig-1g.18gb": 2})
    kube.add_pod("globex-ml", "serve-0", node="gpu-a", resources={"nvidia.com/gpu": 2}, phase="Pending")
    kube.add_pod("globex-ml", "old-0", node="gpu-a", resources={"nvidia.com/gpu": 8}, phase="Succeeded")


@pytest.mark.parametrize(
    ("field_selector", "expected"),
    [
        ("", ["acme-vision/train-0", "acme-vision/train-1", "globex-ml/old-0", "globex-ml/serve-0"]),
        ("spec.nodeName=gpu-a", ["acme-vision/train-0", "globex-ml/old-0", "globex-ml/serve-0"]),
        ("spec.nodeName=gpu-a,status.phase!=Succeeded", ["acme-vision/train-0", "globex-ml/serve-0"]),
        ("status.phase=Running", ["acme-vision/train-0", "acme-vision/train-1"]),
        ("metadata.namespace=globex-ml,status.phase==Pending", ["globex-ml/serve-0"]),
    ],
)
def test_pods_are_listed_by_field_selector(core, pods, field_selector, expected):
    listed = core.list_pod_for_all_namespaces(field_selector=field_selector)

    assert [f"{pod.metadata.namespace}/{pod.metadata.name}" for pod in listed.items] == expected


def test_pods_of_one_namespace_with_label_selector(core, pods):
    listed = core.list_namespaced_pod("acme-vision", label_selector="app=train")

    assert [pod.metadata.name for pod in listed.items] == ["train-0"]
    resources = listed.items[0].spec.containers[0].resources
    assert resources.requests == resources.limits == {"nvidia.com/gpu": "1"}
    assert core.read_namespace("acme-vision").status.phase == "Active"  # add_pod made it


def test_an_unsupported_field_selector_is_a_bad_request(core, pods):
    with pytest.raises(ApiException) as raised:
        core.list_pod_for_all_namespaces(field_selector="spec.hostname=gpu-a")

    assert raised.value.status == 400


# --- failure injection and request log -------------------------------------------------------------------


def test_injected_failures_answer_their_status_then_stop(kube, core):
    kube.add_gpu_node("gpu-a")
    kube.fail_requests(503)
    kube.fail_requests(500, count=2)

    statuses = []
    for _ in range(4):
        try:
            core.read_node("gpu-a")
            statuses.append(200)
        except ApiException as error:
            statuses.append(error.status)

    assert statuses == [503, 500, 500, 200]


def test_every_request_is_logged_with_its_query(kube, core):
    core.list_node(label_selector="nvidia.com/gpu.present=true", limit=500)
    with pytest.raises(ApiException):
        core.read_node("gpu-a")

    assert kube.requests == [
        ("GET", "/api/v1/nodes?labelSelector=nvidia.com/gpu.present%3Dtrue&limit=500"),
        ("GET", "/api/v1/nodes/gpu-a"),
    ]


def test_a_thousand_gpu_nodes_list_in_two_pages(kube, core):
    kube.add_gpu_nodes("gpu-", 1000)
    with kube.lock:
        kube.add_gpu_node("gpu-late")  # the lock is reentrant: bulk loaders may call the control API under it

    first = core.list_node(limit=500, label_selector="nvidia.com/gpu.present=true")
    second = core.list_node(
        limit=500, label_selector="nvidia.com/gpu.present=true", _continue=first.metadata._continue
    )
    third = core.list_node(
        limit=500, label_selector="nvidia.com/gpu.present=true", _continue=second.metadata._continue
    )

    assert len(first.items) + len(second.items) + len(third.items) == 1001
    assert third.items[-1].metadata.name == "gpu-late"
    assert kube.errors == []
