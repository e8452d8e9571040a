"""The test Kubernetes API server, driven only through the official client: every reply must deserialize."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from kubernetes.client import (
    ApiException,
    CoreV1Api,
    V1ConfigMap,
    V1Namespace,
    V1Node,
    V1ObjectMeta,
    V1ResourceQuota,
    V1ResourceQuotaSpec,
)
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


@pytest.fixture
def kube() -> Iterator[KubeApiServer]:
    with KubeApiServer() as server:
        yield server


@pytest.fixture
def core(kube: KubeApiServer, tmp_path: Path) -> Iterator[CoreV1Api]:
    api = connect(kube, tmp_path)
    yield api
    api.api_client.close()


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


# --- namespaces, quotas, config maps ---------------------------------------------------------------------


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


# --- MIG manager emulation -------------------------------------------------------------------------------


def test_a_per_gpu_config_is_applied_to_capacity_labels_and_layout(kube, core):
    kube.add_gpu_node("gpu-a")
    write_mig_config(core)

    answer = ask_for_mig_config(core, "gpu-a", "vision-mixed")
    node = wait_for_state(core, "gpu-a", {"success"})

    assert answer.metadata.labels[STATE] == "pending"
    expected = {
        "nvidia.com/gpu": "4",
        "nvidia.com/mig-1g.18gb": "14",
        "nvidia.com/mig-3g.71gb": "3",
        "nvidia.com/mig-1g.18gb.me": "1",
        "nvidia.com/mig-2g.35gb": "1",
    }
    assert mig_resources(node, "allocatable") == mig_resources(node, "capacity") == expected
    assert mig_count_labels(node) == {
        "nvidia.com/mig-1g.18gb.count": "14",
        "nvidia.com/mig-3g.71gb.count": "3",
        "nvidia.com/mig-1g.18gb.me.count": "1",
        "nvidia.com/mig-2g.35gb.count": "1",
    }
    layout = json.loads(node.metadata.annotations[LAYOUT])
    assert layout[:4] == [
        {"mig": True, "devices": {"1g.18gb": 7}},
        {"mig": True, "devices": {"1g.18gb": 7}},
        {"mig": True, "devices": {"3g.71gb": 2}},
        {"mig": True, "devices": {"1g.18gb+me": 1, "2g.35gb": 1, "3g.71gb": 1}},
    ]
    assert layout[4:] == [{"mig": False, "devices": {}}] * 4


def test_gpus_a_config_does_not_name_keep_their_layout(kube, core):
    kube.add_gpu_node("gpu-a")
    write_mig_config(core)
    ask_for_mig_config(core, "gpu-a", "vision-mixed")
    wait_for_state(core, "gpu-a", {"success"})

    ask_for_mig_config(core, "gpu-a", "first-gpu-whole-slice")
    node = wait_for_state(core, "gpu-a", {"success"})

    assert mig_resources(node) == {
        "nvidia.com/gpu": "4",
        "nvidia.com/mig-7g.141gb": "1",
        "nvidia.com/mig-1g.18gb": "7",
        "nvidia.com/mig-3g.71gb": "3",
        "nvidia.com/mig-1g.18gb.me": "1",
        "nvidia.com/mig-2g.35gb": "1",
    }


def test_all_disabled_restores_full_gpus(kube, core):
    kube.add_gpu_node("gpu-a")
    write_mig_config(core)
    ask_for_mig_config(core, "gpu-a", "every-gpu-halved")
    halved = wait_for_state(core, "gpu-a", {"success"})

    ask_for_mig_config(core, "gpu-a", "all-disabled")
    node = wait_for_state(core, "gpu-a", {"success"})

    assert mig_resources(halved) == {"nvidia.com/gpu": "0", "nvidia.com/mig-3g.71gb": "16"}
    assert mig_resources(node, "capacity") == mig_resources(node) == {"nvidia.com/gpu": "8"}
    assert mig_count_labels(node) == {}
    assert json.loads(node.metadata.annotations[LAYOUT]) == [{"mig": False, "devices": {}}] * 8


def test_the_previous_success_lingers_before_pending(tmp_path):
    with KubeApiServer(stale_success_seconds=0.4, mig_apply_seconds=0.2) as server:
        core = connect(server, tmp_path)
        server.add_gpu_node("gpu-a")
        write_mig_config(core)

        answer = ask_for_mig_config(core, "gpu-a", "every-gpu-halved")
        right_after = core.read_node("gpu-a")
        seen = wait_for_state(core, "gpu-a", {"pending", "failed"})
        done = wait_for_state(core, "gpu-a", {"success"})

    assert answer.metadata.labels[STATE] == right_after.metadata.labels[STATE] == "success"
    assert mig_resources(right_after) == {
        "nvidia.com/gpu": "8"
    }  # the old config's success, not the new one's
    assert seen.metadata.labels[STATE] == "pending"
    assert mig_resources(done) == {"nvidia.com/gpu": "0", "nvidia.com/mig-3g.71gb": "16"}


def test_a_forced_failure_leaves_capacity_and_lasts_one_apply(kube, core):
    kube.add_gpu_node("gpu-a")
    write_mig_config(core)
    kube.set_mig_outcome("gpu-a", "failed")

    ask_for_mig_config(core, "gpu-a", "every-gpu-halved")
    failed = wait_for_state(core, "gpu-a", {"success", "failed"})
    ask_for_mig_config(core, "gpu-a", "vision-mixed")
    retried = wait_for_state(core, "gpu-a", {"success", "failed"})

    assert failed.metadata.labels[STATE] == "failed"
    assert mig_resources(failed) == {"nvidia.com/gpu": "8"}
    assert retried.metadata.labels[STATE] == "success"


def test_a_wedged_node_stays_pending_with_nothing_advertised(kube, core):
    kube.add_gpu_node("gpu-a")
    write_mig_config(core)
    kube.set_mig_outcome("gpu-a", "wedge")

    ask_for_mig_config(core, "gpu-a", "every-gpu-halved")
    deadline = time.monotonic() + 5
    while core.read_node("gpu-a").status.allocatable["nvidia.com/gpu"] != "0":
        assert time.monotonic() < deadline, "the wedge never took the GPUs away"
        time.sleep(0.01)
    time.sleep(10 * kube.mig_apply_seconds)
    wedged = core.read_node("gpu-a")

    assert wedged.metadata.labels[STATE] == "pending"
    assert mig_resources(wedged) == mig_resources(wedged, "capacity") == {"nvidia.com/gpu": "0"}
    # The recovery path a provisioner takes: ask again, and this time the manager finishes.
    ask_for_mig_config(core, "gpu-a", "all-disabled")
    assert mig_resources(wait_for_state(core, "gpu-a", {"success"})) == {"nvidia.com/gpu": "8"}


def single_config(name: str, entry: str) -> str:
    return f"version: v1\nmig-configs:\n  {name}:\n    - {entry}\n"


@pytest.mark.parametrize(
    ("config_yaml", "config"),
    [
        (MIG_PARTED_YAML, "no-such-config"),
        ("version: v1\nmig-configs: [not, a, mapping", "broken"),
        (single_config("minus", '{devices: all, mig-enabled: true, mig-devices: {"1g.18gb": -1}}'), "minus"),
        (single_config("text", '{devices: all, mig-enabled: true, mig-devices: {"1g.18gb": "7"}}'), "text"),
        (single_config("odd", "{devices: some, mig-enabled: true}"), "odd"),
        (single_config("flag", '{devices: all, mig-enabled: "yes please"}'), "flag"),
    ],
)
def test_a_config_the_manager_cannot_apply_fails(kube, core, config_yaml, config):
    kube.add_gpu_node("gpu-a")
    write_mig_config(core, config_yaml)

    ask_for_mig_config(core, "gpu-a", config)
    node = wait_for_state(core, "gpu-a", {"success", "failed"})

    assert node.metadata.labels[STATE] == "failed"
    assert mig_resources(node, "capacity") == {"nvidia.com/gpu": "8"}


def test_all_disabled_is_known_without_a_config_map(kube, core):
    kube.add_gpu_node("gpu-a")
    ask_for_mig_config(core, "gpu-a", "something")
    assert wait_for_state(core, "gpu-a", {"success", "failed"}).metadata.labels[STATE] == "failed"

    ask_for_mig_config(core, "gpu-a", "all-disabled")

    assert mig_resources(wait_for_state(core, "gpu-a", {"success", "failed"})) == {"nvidia.com/gpu": "8"}


def test_gpus_without_mig_cannot_enable_it(kube, core):
    kube.add_gpu_node("a100-pcie", product="NVIDIA-A10", mig_capable=False)
    write_mig_config(core)

    ask_for_mig_config(core, "a100-pcie", "every-gpu-halved")

    assert wait_for_state(core, "a100-pcie", {"success", "failed"}).metadata.labels[STATE] == "failed"


def test_a_newer_change_restarts_the_apply(tmp_path):
    """The first change's timer must not finish the second change early."""
    with KubeApiServer(mig_apply_seconds=0.3) as server:
        core = connect(server, tmp_path)
        server.add_gpu_node("gpu-a")
        write_mig_config(core)

        ask_for_mig_config(core, "gpu-a", "every-gpu-halved")
        time.sleep(0.2)
        asked = time.monotonic()
        ask_for_mig_config(core, "gpu-a", "first-gpu-whole-slice")
        node = wait_for_state(core, "gpu-a", {"success", "failed"})
        finished = time.monotonic()

    assert finished - asked >= server.mig_apply_seconds
    assert mig_resources(node) == {"nvidia.com/gpu": "7", "nvidia.com/mig-7g.141gb": "1"}


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
