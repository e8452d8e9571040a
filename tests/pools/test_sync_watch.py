"""A cluster followed by list and watch: listed once page by page, then caught up by watch from where the
last sync stopped, writing only what changed; resumed after a dropped stream, listed again only on 410 or
when the safety net's interval has passed; beat's tick watching for a bounded time; and what is not one
object's (trespasses, vanished devices) recorded again when what they depend on changed."""

import threading
import time
from copy import deepcopy
from datetime import timedelta

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from pools import task_names
from pools.conf import settings as pools_settings
from pools.drivers import kubernetes as kubernetes_driver
from pools.drivers.simulated import SimulatedDriver
from pools.models import Cluster, NodeCapacity, Trespass, WorkloadProfile
from pools.services.inventory import sync_due_clusters, sync_inventory
from pools.services.provisioning import release_pool
from pools.tasks import sync_cluster_now
from portal import dispatch
from tests.factories import ClusterFactory
from tests.kube.server import KubeApiServer
from tests.pools.conftest import active_pool

WRITES = ("INSERT", "UPDATE", "DELETE")
GPU = {"nvidia.com/gpu": 1}


def writes(ctx) -> list[str]:
    return [q["sql"] for q in ctx.captured_queries if q["sql"].lstrip().upper().startswith(WRITES)]


@pytest.fixture
def kube(tmp_path):
    with KubeApiServer(mig_apply_seconds=0.02) as server:
        server.kubeconfig_path = server.write_kubeconfig(tmp_path / "kubeconfig")
        yield server


@pytest.fixture
def cluster(kube, db):
    return ClusterFactory(
        name="kube", driver=Cluster.Driver.KUBERNETES, kubeconfig=kube.kubeconfig_path.read_text()
    )


def lists(kube) -> list[str]:
    """The paged lists (not watches, nor the binding's look for one slice) the server answered so far."""
    return [path for method, path in kube.requests if method == "GET" and "limit=500" in path]


def cordon(kube, name: str) -> None:
    """The node's kubelet stops reporting Ready, as a node that goes down."""
    with kube.lock:
        node = deepcopy(kube.store.get("Node", name))
        node["status"]["conditions"] = [{"type": "Ready", "status": "False"}]
        kube.store.update(node)


def test_the_first_sync_lists_and_the_next_watches_writing_nothing_when_idle(kube, cluster):
    kube.add_gpu_nodes("gpu-", 20)
    kube.add_pod("team", "trainer", node="gpu-00", resources=GPU)
    first = sync_inventory(cluster=cluster)
    assert first.listed and first.created["nodes"] == 20 and first.created["workloads"] == 1
    cluster.refresh_from_db()
    assert cluster.listed_at is not None and set(cluster.watch_versions) >= {"nodes", "pods"}
    listed = len(lists(kube))

    with CaptureQueriesContext(connection) as ctx:
        again = sync_inventory(cluster=cluster)
    assert again.ok and not again.listed and not again.changed and again.watched == 0
    assert writes(ctx) == []
    assert len(lists(kube)) == listed  # followed by watch: nothing listed again


def test_a_change_applied_by_watch_writes_its_rows_only(kube, cluster):
    kube.add_gpu_nodes("gpu-", 20)
    sync_inventory(cluster=cluster)
    cordon(kube, "gpu-03")
    kube.add_gpu_node("gpu-new")
    kube.add_pod("team", "trainer", node="gpu-05", resources=GPU)

    with CaptureQueriesContext(connection) as ctx:
        report = sync_inventory(cluster=cluster)

    assert not report.listed and report.watched == 3
    assert (report.created["nodes"], report.updated["nodes"], report.created["workloads"]) == (1, 1, 1)
    assert report.updated["gpus"] == 8  # gpu-03's GPUs' health is unknown now
    assert not NodeCapacity.objects.get(name="gpu-03").ready
    assert WorkloadProfile.objects.get(pod_name="trainer").node_name == "gpu-05"
    assert len(writes(ctx)) <= 12  # a handful of bulk statements, whatever the fleet's size


def test_a_node_that_leaves_is_marked_absent_by_watch(kube, cluster):
    kube.add_gpu_nodes("gpu-", 3)
    sync_inventory(cluster=cluster)
    with kube.lock:
        kube.store.remove("Node", ("", "gpu-1"))
    report = sync_inventory(cluster=cluster)
    assert (report.vanished["nodes"], report.vanished["gpus"]) == (1, 8)
    assert not NodeCapacity.objects.get(name="gpu-1").present
    assert NodeCapacity.objects.filter(present=True).count() == 2


def test_a_dropped_stream_is_resumed_from_the_last_version_seen_without_listing_again(kube, cluster):
    kube.add_gpu_nodes("gpu-", 2)
    sync_inventory(cluster=cluster)
    listed = len(lists(kube))

    def meanwhile():
        deadline = time.monotonic() + 10
        while kube.open_watches < 2 and time.monotonic() < deadline:  # nodes and pods are being watched
            time.sleep(0.02)
        kube.add_gpu_node("gpu-before")
        time.sleep(0.3)
        assert kube.drop_watches() >= 2
        kube.add_gpu_node("gpu-after")

    other = threading.Thread(target=meanwhile)
    other.start()
    report = sync_inventory(cluster=cluster, watch_seconds=2)
    other.join()
    assert report.ok and not report.listed
    assert {"gpu-before", "gpu-after"} <= set(NodeCapacity.objects.values_list("name", flat=True))
    assert len(lists(kube)) == listed
    resumed = [path for method, path in kube.requests if "watch=true" in path and "/nodes?" in path]
    assert len(resumed) >= 2  # the first watch, then its resumption


def test_an_expired_version_is_listed_again(kube, cluster):
    kube.add_gpu_nodes("gpu-", 3)
    sync_inventory(cluster=cluster)
    with kube.lock:
        kube.store.remove("Node", ("", "gpu-2"))
    kube.add_gpu_node("gpu-3")
    kube.compact()  # the server no longer keeps what changed since the last sync
    cluster.refresh_from_db()
    listed_at = cluster.listed_at
    report = sync_inventory(cluster=cluster)
    assert report.ok and report.listed and report.watched == 0  # the streams listed again, not watched
    cluster.refresh_from_db()
    assert cluster.listed_at == listed_at  # the safety net's interval goes on
    assert set(NodeCapacity.objects.filter(present=True).values_list("name", flat=True)) == {
        "gpu-0",
        "gpu-1",
        "gpu-3",
    }
    assert not sync_inventory(cluster=cluster).listed  # and followed by watch from there


def test_the_full_list_is_the_safety_net_at_its_interval(kube, cluster):
    kube.add_gpu_nodes("gpu-", 2)
    sync_inventory(cluster=cluster)
    cluster.refresh_from_db()
    listed_at = cluster.listed_at
    Cluster.objects.filter(pk=cluster.pk).update(
        listed_at=timezone.now() - timedelta(seconds=pools_settings.CAPACITY_RELIST_SECONDS + 1)
    )
    cluster.refresh_from_db()
    with CaptureQueriesContext(connection) as ctx:
        report = sync_inventory(cluster=cluster)
    assert report.listed and not report.changed
    assert [sql for sql in writes(ctx) if "pools_cluster" not in sql] == []  # nothing new: only when listed
    cluster.refresh_from_db()
    assert cluster.listed_at > listed_at
    assert not sync_inventory(cluster=cluster).listed


def test_pages_mark_absent_only_what_left_their_range(kube, cluster, monkeypatch):
    """Listed a page at a time (two objects here), in the API server's order: `a-b/…` before `a/…`."""
    monkeypatch.setattr(kubernetes_driver, "PAGE", 2)
    kube.add_gpu_nodes("gpu-", 5)
    for namespace, name in [("a", "p0"), ("a", "p1"), ("a-b", "p0"), ("a-b", "p1"), ("b", "p0")]:
        kube.add_pod(namespace, name, node="gpu-0", resources=GPU)
    sync_inventory(cluster=cluster)
    assert WorkloadProfile.objects.filter(present=True).count() == 5
    with kube.lock:
        kube.store.remove("Node", ("", "gpu-3"))
        kube.store.remove("Pod", ("a-b", "p1"))
    Cluster.objects.filter(pk=cluster.pk).update(listed_at=timezone.now() - timedelta(days=1))
    cluster.refresh_from_db()
    report = sync_inventory(cluster=cluster)
    assert report.listed and (report.vanished["nodes"], report.vanished["workloads"]) == (1, 1)
    assert not NodeCapacity.objects.get(name="gpu-3").present
    gone = WorkloadProfile.objects.filter(present=False).values_list("namespace", "pod_name")
    assert list(gone) == [("a-b", "p1")]


def test_beats_tick_watches_for_a_bounded_time_applying_changes_as_they_come(
    kube, cluster, settings, django_capture_on_commit_callbacks
):
    settings.CAPACITY_WATCH_SECONDS = 2
    with django_capture_on_commit_callbacks() as callbacks:
        assert sync_due_clusters() == 1
    assert [(c.task, c.args) for c in callbacks if isinstance(c, dispatch.Send)] == [
        (task_names.SYNC, (cluster.pk, 2))
    ]
    kube.add_gpu_node("gpu-0")
    sync_inventory(cluster=cluster)

    def later():
        time.sleep(0.5)
        kube.add_gpu_node("gpu-late")

    other = threading.Thread(target=later)
    other.start()
    summary = sync_cluster_now(cluster.pk, 2)
    other.join()
    assert "nodes new 1" in summary
    assert NodeCapacity.objects.filter(name="gpu-late").exists()
    assert kube.open_watches == 0  # the task let go of its watches


def test_what_the_pools_hold_changing_alone_records_the_trespasses_again(fleet, tenancy, approver):
    pool = active_pool(tenancy.vision, tenancy.acme_member, approver, [("h200-141gb.mig-1g.18gb", 2)])
    sync_inventory(cluster=fleet)
    assert not Trespass.objects.exists()
    # Released: the capacity is free at once, while the cluster still runs the pool's pods until the quota
    # shrinks; nothing changed in the cluster, but those pods now hold what no pool does.
    release_pool(pool_id=pool.pk, user=tenancy.acme_member)
    report = sync_inventory(cluster=fleet)
    assert not report.changed
    (found,) = Trespass.objects.filter(ended_at__isnull=True)
    assert (found.namespace, found.count) == (tenancy.vision.namespace, 2)


def test_the_simulated_cluster_is_followed_the_same_way(sim_cluster):
    first = sync_inventory(cluster=sim_cluster)
    assert first.listed
    SimulatedDriver(sim_cluster).set_gpu_health("h100-1", 0, "failed")
    report = sync_inventory(cluster=sim_cluster)
    assert not report.listed and report.watched == 1 and report.updated["gpus"] == 1
    SimulatedDriver(sim_cluster).set_gpu_health("h100-1", 1, "failed")
    SimulatedDriver(sim_cluster).compact()
    report = sync_inventory(cluster=sim_cluster)
    assert report.listed and report.updated["gpus"] == 1
