"""Watches on the test API server, through the official client's watch.Watch and over raw HTTP: events after
a list's resourceVersion as newline-delimited JSON, bookmarks, selectors, the timeout, 410 Expired once the
history is compacted (for a watch and for a list's continue token), streams a test drops, and RBAC's watch
verb."""

from __future__ import annotations

import http.client
import json
import threading
import time
from copy import deepcopy
from pathlib import Path
from urllib.parse import urlencode, urlsplit

import pytest
import urllib3
from kubernetes import client, watch
from kubernetes.client import ApiException, CoreV1Api, ResourceV1Api

from tests.kube.client import connect
from tests.kube.server import KubeApiServer

GPU_NODES = "nvidia.com/gpu.present=true"


def until_bookmark(api_call, *, return_type=None, **kwargs) -> list[tuple[str, dict]]:
    """(type, raw object) of each event of a watch, up to and with its first bookmark."""
    stream = watch.Watch(return_type=return_type)
    found = []
    for event in stream.stream(api_call, allow_watch_bookmarks=True, timeout_seconds=10, **kwargs):
        found.append((event["type"], event["raw_object"]))
        if event["type"] == "BOOKMARK":
            stream.stop()
    return found


def named(events: list[tuple[str, dict]]) -> list[tuple[str, str]]:
    return [(kind, obj["metadata"].get("name", "")) for kind, obj in events]


def raw_watch(kube: KubeApiServer, path: str, **query: str) -> http.client.HTTPResponse:
    host = urlsplit(kube.url).netloc
    connection = http.client.HTTPConnection(host, timeout=10)
    connection.request(
        "GET",
        f"{path}?{urlencode({'watch': 'true', **query})}",
        headers={"Authorization": f"Bearer {kube.token}"},
    )
    return connection.getresponse()


def finish(kube: KubeApiServer, namespace: str, name: str) -> None:
    """The pod's containers end: its phase becomes Succeeded, as its kubelet would report."""
    with kube.lock:
        pod = deepcopy(kube.store.get("Pod", name, namespace))
        pod["status"]["phase"] = "Succeeded"
        kube.store.update(pod)


def remove_node(kube: KubeApiServer, name: str) -> None:
    with kube.lock:
        kube.store.remove("Node", ("", name))


def test_a_watch_from_a_lists_version_sends_each_change_after_it_in_order(kube, core):
    kube.add_gpu_node("gpu-a")
    listed = core.list_node(label_selector=GPU_NODES)
    version = listed.metadata.resource_version
    kube.add_gpu_node("gpu-b")
    core.patch_node("gpu-a", {"metadata": {"labels": {"team": "vision"}}})
    remove_node(kube, "gpu-b")

    events = until_bookmark(core.list_node, resource_version=version, label_selector=GPU_NODES)

    assert named(events) == [
        ("ADDED", "gpu-b"),
        ("MODIFIED", "gpu-a"),
        ("DELETED", "gpu-b"),
        ("BOOKMARK", ""),
    ]
    versions = [int(obj["metadata"]["resourceVersion"]) for _, obj in events]
    assert versions == sorted(versions) and versions[0] > int(version)
    assert events[1][1]["metadata"]["labels"]["team"] == "vision"
    assert versions[-1] == kube.store.resource_version  # the bookmark: everything up to now was sent
    assert set(events[-1][1]) == {"apiVersion", "kind", "metadata"}


def test_a_watch_without_a_version_starts_with_what_there_is(kube, core):
    kube.add_gpu_node("gpu-a")
    kube.add_node("cpu-a")
    assert named(until_bookmark(core.list_node, label_selector=GPU_NODES)) == [
        ("ADDED", "gpu-a"),
        ("BOOKMARK", ""),
    ]


def test_changes_made_while_watching_come_as_they_happen(kube, core):
    version = core.list_node().metadata.resource_version
    stream = watch.Watch()
    seen = []
    for event in stream.stream(
        core.list_node, resource_version=version, timeout_seconds=10, allow_watch_bookmarks=True
    ):
        seen.append((event["type"], event["raw_object"]["metadata"].get("name", "")))
        if event["type"] == "BOOKMARK":  # caught up: now the cluster changes
            kube.add_gpu_node("gpu-late")
        if event["type"] == "ADDED":
            stream.stop()
    assert seen == [("BOOKMARK", ""), ("ADDED", "gpu-late")]


def test_an_object_leaving_or_entering_the_selectors_is_deleted_or_added_for_the_watch(kube, core):
    kube.add_gpu_node("gpu-a")
    kube.add_pod("team", "trainer", node="gpu-a", resources={"nvidia.com/gpu": 1})
    nodes = core.list_node(label_selector=GPU_NODES).metadata.resource_version
    core.patch_node("gpu-a", {"metadata": {"labels": {"nvidia.com/gpu.present": "false"}}})
    core.patch_node("gpu-a", {"metadata": {"labels": {"nvidia.com/gpu.present": "true"}}})
    assert named(until_bookmark(core.list_node, resource_version=nodes, label_selector=GPU_NODES)) == [
        ("DELETED", "gpu-a"),
        ("ADDED", "gpu-a"),
        ("BOOKMARK", ""),
    ]

    running = "status.phase!=Succeeded,status.phase!=Failed"
    pods = core.list_pod_for_all_namespaces(field_selector=running).metadata.resource_version
    finish(kube, "team", "trainer")
    events = until_bookmark(core.list_pod_for_all_namespaces, resource_version=pods, field_selector=running)
    assert named(events) == [("DELETED", "trainer"), ("BOOKMARK", "")]
    assert events[0][1]["status"]["phase"] == "Running"  # the object as it last passed
    assert int(events[0][1]["metadata"]["resourceVersion"]) > int(pods)


def test_a_namespaced_watch_sees_its_namespace_only(kube, core):
    kube.add_gpu_node("gpu-a")
    version = core.list_pod_for_all_namespaces().metadata.resource_version
    kube.add_pod("team", "mine", node="gpu-a", resources={"nvidia.com/gpu": 1})
    kube.add_pod("others", "theirs", node="gpu-a", resources={"nvidia.com/gpu": 1})
    assert named(until_bookmark(core.list_namespaced_pod, namespace="team", resource_version=version)) == [
        ("ADDED", "mine"),
        ("BOOKMARK", ""),
    ]


def test_without_bookmarks_asked_none_are_sent_and_the_timeout_ends_the_stream(kube, core):
    kube.add_gpu_node("gpu-a")
    version = core.list_node().metadata.resource_version
    kube.add_gpu_node("gpu-b")
    events = [
        e["type"] for e in watch.Watch().stream(core.list_node, resource_version=version, timeout_seconds=1)
    ]
    assert events == ["ADDED"]
    assert kube.open_watches == 0


def test_a_bookmark_closes_a_stream_ended_by_its_timeout(kube, core):
    version = core.list_node().metadata.resource_version
    events = [
        e["type"]
        for e in watch.Watch().stream(
            core.list_node, resource_version=version, timeout_seconds=1, allow_watch_bookmarks=True
        )
    ]
    assert events == ["BOOKMARK", "BOOKMARK"]  # caught up, then before the timeout


def test_the_stream_is_chunked_newline_delimited_json(kube, core):
    kube.add_gpu_node("gpu-a")
    version = core.list_node().metadata.resource_version
    kube.add_gpu_node("gpu-b")
    response = raw_watch(
        kube, "/api/v1/nodes", resourceVersion=version, timeoutSeconds="1", allowWatchBookmarks="true"
    )
    assert response.status == 200
    assert response.getheader("Transfer-Encoding") == "chunked"
    assert response.getheader("Content-Type") == "application/json"
    lines = response.read().decode().splitlines()
    events = [json.loads(line) for line in lines]
    assert [(e["type"], e["object"]["metadata"].get("name")) for e in events] == [
        ("ADDED", "gpu-b"),
        ("BOOKMARK", None),
        ("BOOKMARK", None),
    ]


def test_a_version_older_than_the_history_is_a_410_expired_error_event(kube, core):
    version = core.list_node().metadata.resource_version
    kube.add_gpu_node("gpu-a")
    kube.compact()
    response = raw_watch(kube, "/api/v1/nodes", resourceVersion=version, timeoutSeconds="5")
    assert response.status == 200
    (line,) = response.read().decode().splitlines()  # the stream ends after the error
    event = json.loads(line)
    assert event["type"] == "ERROR"
    status = event["object"]
    assert (status["kind"], status["status"], status["code"], status["reason"]) == (
        "Status",
        "Failure",
        410,
        "Expired",
    )
    assert status["message"].startswith(f"too old resource version: {version} (")

    with pytest.raises(ApiException) as expired:
        list(watch.Watch().stream(core.list_node, resource_version=version, timeout_seconds=5))
    assert expired.value.status == 410 and expired.value.reason.startswith("Expired")
    # From the version of a new list, the watch works again.
    fresh = core.list_node().metadata.resource_version
    assert named(until_bookmark(core.list_node, resource_version=fresh)) == [("BOOKMARK", "")]


def test_the_history_is_bounded_per_kind(tmp_path):
    with KubeApiServer(watch_history=3) as kube:
        core = connect(kube, tmp_path)
        version = core.list_node().metadata.resource_version
        for n in range(4):
            kube.add_gpu_node(f"gpu-{n}")
        recent = kube.get("Node", "gpu-1")["metadata"]["resourceVersion"]
        kube.add_pod(
            "team", "trainer", node="gpu-0", resources={"nvidia.com/gpu": 1}
        )  # another kind's history
        with pytest.raises(ApiException) as expired:
            list(watch.Watch().stream(core.list_node, resource_version=version, timeout_seconds=5))
        assert expired.value.status == 410
        assert named(until_bookmark(core.list_node, resource_version=recent)) == [
            ("ADDED", "gpu-2"),
            ("ADDED", "gpu-3"),
            ("BOOKMARK", ""),
        ]
        core.api_client.close()


def test_a_continue_token_older_than_the_history_is_410_expired(kube, core):
    kube.add_gpu_nodes("gpu-", 5)
    first = core.list_node(limit=2)
    assert core.list_node(limit=2, _continue=first.metadata._continue).metadata.resource_version == (
        first.metadata.resource_version
    )  # every page of one list carries its version
    kube.add_gpu_node("gpu-late")
    kube.compact("nodes")
    with pytest.raises(ApiException) as expired:
        core.list_node(limit=2, _continue=first.metadata._continue)
    body = json.loads(expired.value.body)
    assert (expired.value.status, body["reason"], body["code"]) == (410, "Expired", 410)
    # The fresh token it offers goes on from where the old one stopped.
    rest = core.list_node(_continue=body["metadata"]["continue"])
    assert [node.metadata.name for node in rest.items] == ["gpu-2", "gpu-3", "gpu-4", "gpu-late"]


def test_a_dropped_stream_breaks_and_the_client_resumes_from_the_last_version_seen(kube, core):
    version = core.list_node().metadata.resource_version
    kube.add_gpu_node("gpu-a")
    stream = watch.Watch()
    seen: list[str] = []
    failure: list[BaseException] = []

    def follow() -> None:
        try:
            for event in stream.stream(core.list_node, resource_version=version, timeout_seconds=30):
                seen.append(event["raw_object"]["metadata"]["resourceVersion"])
        except (urllib3.exceptions.HTTPError, OSError) as error:
            failure.append(error)

    reader = threading.Thread(target=follow)
    reader.start()
    deadline = time.monotonic() + 10
    while not seen and time.monotonic() < deadline:
        time.sleep(0.02)
    assert kube.drop_watches() == 1
    reader.join(10)
    assert not reader.is_alive() and failure  # the connection broke
    assert kube.open_watches == 0
    kube.add_gpu_node("gpu-b")
    assert named(until_bookmark(core.list_node, resource_version=seen[-1])) == [
        ("ADDED", "gpu-b"),
        ("BOOKMARK", ""),
    ]


def test_the_kinds_a_sync_reads_can_be_watched(kube, core, admin):
    kube.add_gpu_node("gpu-a")
    kube.add_gpu_device_classes()
    resource = ResourceV1Api(admin)
    slices = resource.list_resource_slice().metadata.resource_version
    claims = resource.list_resource_claim_for_all_namespaces().metadata.resource_version
    kube.publish_gpu_slices("gpu-a")
    kube.add_namespace("team")
    resource.create_namespaced_resource_claim(
        "team",
        {
            "metadata": {"name": "one"},
            "spec": {
                "devices": {"requests": [{"name": "gpu", "exactly": {"deviceClassName": "gpu.nvidia.com"}}]}
            },
        },
    )
    published = until_bookmark(resource.list_resource_slice, resource_version=slices)
    assert published[0][0] == "ADDED" and published[0][1]["spec"]["nodeName"] == "gpu-a"
    claimed = named(
        until_bookmark(
            resource.list_resource_claim_for_all_namespaces,
            resource_version=claims,
            return_type=client.ResourceV1ResourceClaim,  # the client names the list's items wrongly
        )
    )
    assert claimed[0] == ("ADDED", "one") and claimed[-1] == ("BOOKMARK", "")


def test_bad_watch_parameters_are_refused_with_400(kube):
    for query in ({"resourceVersion": "yesterday"}, {"timeoutSeconds": "-1"}, {"labelSelector": "a in (b"}):
        response = raw_watch(kube, "/api/v1/nodes", **query)
        assert response.status == 400, query
        assert json.loads(response.read())["reason"] == "BadRequest"


def test_rbac_checks_the_watch_verb(kube, admin, tmp_path: Path):
    CoreV1Api(admin).create_namespaced_service_account("default", {"metadata": {"name": "reader"}})
    rbac = client.RbacAuthorizationV1Api(admin)
    rbac.create_cluster_role(
        {
            "metadata": {"name": "reader"},
            "rules": [{"apiGroups": [""], "resources": ["nodes"], "verbs": ["list"]}],
        }
    )
    rbac.create_cluster_role_binding(
        {
            "metadata": {"name": "reader"},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "reader"},
            "subjects": [{"kind": "ServiceAccount", "name": "reader", "namespace": "default"}],
        }
    )
    reader = connect(kube, tmp_path, token=kube.service_account_token("default", "reader"))
    version = reader.list_node().metadata.resource_version
    with pytest.raises(ApiException) as refused:
        list(watch.Watch().stream(reader.list_node, resource_version=version, timeout_seconds=1))
    assert refused.value.status == 403
    assert 'cannot watch resource "nodes"' in json.loads(refused.value.body)["message"]

    rbac.patch_cluster_role(
        "reader", {"rules": [{"apiGroups": [""], "resources": ["nodes"], "verbs": ["list", "watch"]}]}
    )
    assert named(until_bookmark(reader.list_node, resource_version=version)) == [("BOOKMARK", "")]
    assert [g.request.verb for g in kube.grants if g.role[2] == "reader"][-1] == "watch"
    reader.api_client.close()
