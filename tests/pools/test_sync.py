"""Inventory sync: idempotent, constant in queries, marks what vanished, survives broken clusters."""

from datetime import timedelta

import pytest
from django.core.management import call_command
from django.db import connection, transaction
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from pools.drivers.simulated import SimulatedDriver
from pools.models import Cluster, GpuCapacity, NodeCapacity, SpecAndCount, WorkloadProfile
from pools.services.inventory import sync_inventory
from tests.factories import ClusterFactory, ProjectFactory

from .conftest import FULL, SMALL_FLEET

WRITES = ("INSERT", "UPDATE", "DELETE")


def writes(ctx) -> list[str]:
    """Statements that wrote to portal tables (the simulated cluster's own row is the cluster, not us)."""
    return [
        q["sql"]
        for q in ctx.captured_queries
        if q["sql"].lstrip().upper().startswith(WRITES) and "pools_simulatedclusterstate" not in q["sql"]
    ]


def test_first_sync_builds_the_picture(sim_cluster):
    report = sync_inventory(cluster=sim_cluster)
    assert report.ok
    assert NodeCapacity.objects.filter(cluster=sim_cluster).count() == 3
    gpus = GpuCapacity.objects.filter(node__cluster=sim_cluster)
    assert gpus.count() == 24
    mig_gpu = gpus.get(node__name="h200-1", index=0)
    assert mig_gpu.mig_enabled and mig_gpu.model == "H200-141GB"
    assert [i["start"] for i in mig_gpu.layout] == list(range(7))
    assert all(i["uuid"].startswith("MIG-") for i in mig_gpu.layout)
    specs = dict(
        SpecAndCount.objects.filter(node__name="h200-1", node__cluster=sim_cluster).values_list(
            "resource_name", "capacity"
        )
    )
    assert specs == {"nvidia.com/gpu": 6, "nvidia.com/mig-1g.18gb": 7, "nvidia.com/mig-3g.71gb": 2}
    sim_cluster.refresh_from_db()
    assert sim_cluster.status == Cluster.Status.READY and sim_cluster.last_sync_at


def test_a_sync_that_finds_nothing_new_writes_nothing(sim_cluster):
    sync_inventory(cluster=sim_cluster)
    with CaptureQueriesContext(connection) as ctx:
        report = sync_inventory(cluster=sim_cluster)
    assert not report.changed
    assert writes(ctx) == []


def test_resync_queries_do_not_grow_with_the_fleet(db):
    small = ClusterFactory(name="small", fleet=[("n", 2, "H100-80GB", FULL)])
    large = ClusterFactory(name="large", fleet=[("n", 20, "H100-80GB", FULL)])
    counts = []
    for cluster in (small, large):
        sync_inventory(cluster=cluster)
        with CaptureQueriesContext(connection) as ctx:
            sync_inventory(cluster=cluster)
        counts.append(len(ctx))
    assert counts[0] == counts[1]


def test_changes_are_written_and_only_they(sim_cluster):
    sync_inventory(cluster=sim_cluster)
    driver = SimulatedDriver(sim_cluster)
    driver.set_gpu_health("h100-1", 3, "failed")
    with CaptureQueriesContext(connection) as ctx:
        report = sync_inventory(cluster=sim_cluster)
    assert report.updated["gpus"] == 1 and report.updated["specs"] == 1 and report.updated["nodes"] == 0
    assert GpuCapacity.objects.get(node__name="h100-1", index=3).health == "failed"
    assert SpecAndCount.objects.get(node__name="h100-1", resource_name="nvidia.com/gpu").allocatable == 7
    assert len(writes(ctx)) == 3  # GPUs, specs, and the cluster's last change


def test_vanished_nodes_are_marked_not_deleted_and_come_back(sim_cluster):
    sync_inventory(cluster=sim_cluster)
    driver = SimulatedDriver(sim_cluster)
    state = sim_cluster.simulation.state
    kept = state["nodes"]["h100-1"]
    driver.remove_node("h100-1")
    report = sync_inventory(cluster=sim_cluster)
    assert report.vanished == {"nodes": 1, "gpus": 8, "workloads": 0}
    node = NodeCapacity.objects.get(name="h100-1")
    assert not node.present and node.gpus.filter(present=True).count() == 0
    sim_cluster.simulation.refresh_from_db()
    sim_cluster.simulation.state["nodes"]["h100-1"] = kept
    sim_cluster.simulation.save()
    sync_inventory(cluster=sim_cluster)
    node.refresh_from_db()
    assert node.present and node.gpus.filter(present=True).count() == 8


def test_an_unreachable_cluster_keeps_its_picture_and_backs_off(sim_cluster):
    sync_inventory(cluster=sim_cluster)
    SimulatedDriver(sim_cluster).set_reachable(False)
    before = timezone.now()
    for failures in (1, 2, 3):
        sim_cluster.refresh_from_db()
        report = sync_inventory(cluster=sim_cluster)
        assert not report.ok
        sim_cluster.refresh_from_db()
        assert sim_cluster.status == Cluster.Status.UNREACHABLE
        assert sim_cluster.failures == failures
        assert "does not answer" in sim_cluster.last_error
    # back-off doubles: 60 s, 120 s, 240 s with the default period
    assert sim_cluster.next_sync_at - before >= timedelta(seconds=240)
    assert GpuCapacity.objects.filter(node__cluster=sim_cluster, present=True).count() == 24
    SimulatedDriver(sim_cluster).set_reachable(True)
    assert sync_inventory(cluster=sim_cluster).ok
    sim_cluster.refresh_from_db()
    assert (sim_cluster.status, sim_cluster.failures, sim_cluster.last_error, sim_cluster.next_sync_at) == (
        Cluster.Status.READY,
        0,
        "",
        None,
    )


def test_one_broken_cluster_does_not_stop_the_others(db, capsys):
    broken = ClusterFactory(name="a-broken", fleet=SMALL_FLEET)
    SimulatedDriver(broken).set_reachable(False)
    healthy = ClusterFactory(name="b-healthy", fleet=SMALL_FLEET)
    with pytest.raises(Exception, match="1 cluster"):
        call_command("sync_clusters")
    assert NodeCapacity.objects.filter(cluster=healthy).count() == 3
    assert "a-broken: failed" in capsys.readouterr().out


def test_a_node_with_unreadable_gpus_keeps_its_last_good_picture(sim_cluster):
    sync_inventory(cluster=sim_cluster)
    state = sim_cluster.simulation.state
    state["nodes"]["h200-2"]["model"] = "T4-16GB"  # a model the catalogue does not know
    sim_cluster.simulation.save()
    report = sync_inventory(cluster=sim_cluster)
    assert report.ok
    node = NodeCapacity.objects.get(name="h200-2")
    assert "T4-16GB" in node.error
    assert node.gpus.filter(present=True, model="H200-141GB").count() == 8  # untouched


def test_workloads_are_tracked_with_their_project(sim_cluster):
    project = ProjectFactory(slug="vision", namespace="acme-vision")
    driver = SimulatedDriver(sim_cluster)
    driver.ensure_namespace("acme-vision", {})
    driver.apply_quota("acme-vision", {"nvidia.com/mig-1g.18gb": 2, "nvidia.com/gpu": 1})
    sync_inventory(cluster=sim_cluster)
    workloads = WorkloadProfile.objects.filter(cluster=sim_cluster, present=True)
    assert workloads.count() == 3
    assert {w.project_id for w in workloads} == {project.pk}
    assert {w.phase for w in workloads} == {"Running"}
    driver.remove_quota("acme-vision")
    report = sync_inventory(cluster=sim_cluster)
    assert report.vanished["workloads"] == 3
    assert WorkloadProfile.objects.filter(present=False).count() == 3


# --- SpecAndCount rows written by two connections at once ---------------------------------


def _hold_uncommitted_spec(node_id: int, resource: str, inserted, outcome: dict) -> None:
    """Another writer, on its own connection: insert a SpecAndCount row and keep it uncommitted
    until some other connection waits for it, then commit."""
    import time

    try:
        with transaction.atomic():
            SpecAndCount.objects.create(
                node_id=node_id, resource_name=resource, profile="other", capacity=5, allocatable=5
            )
            inserted.set()
            deadline = time.monotonic() + 10
            while time.monotonic() < deadline and not outcome.get("waited"):
                with connection.cursor() as cursor:  # pg_locks is read live, not per transaction
                    cursor.execute(  # of this database's connections: others run tests beside this one
                        "SELECT count(*) FROM pg_locks WHERE NOT granted AND pid IN "
                        "(SELECT pid FROM pg_stat_activity WHERE datname = current_database())"
                    )
                    outcome["waited"] = cursor.fetchone()[0] > 0
                time.sleep(0.05)
    except Exception as error:  # reported by the test
        outcome["error"] = error
    finally:
        inserted.set()
        connection.close()


def _racing(node_id: int, resource: str, write) -> dict:
    import threading

    inserted, outcome = threading.Event(), {}
    other = threading.Thread(target=_hold_uncommitted_spec, args=(node_id, resource, inserted, outcome))
    other.start()
    inserted.wait(10)
    try:
        outcome["result"] = write()  # meets the other's insert, waits for its commit, then goes on
    finally:
        other.join()
    return outcome


@pytest.mark.django_db(transaction=True, serialized_rollback=True)
def test_a_sync_meeting_a_concurrent_insert_of_the_same_spec_row_does_not_raise():
    from pools.drivers.base import GpuLayout, MigInstanceInfo

    cluster = ClusterFactory(name="race", fleet=SMALL_FLEET)
    sync_inventory(cluster=cluster)
    SimulatedDriver(cluster).apply_mig_layout(
        "h100-1", [GpuLayout(0, True, (MigInstanceInfo("7g.80gb", 0),))]
    )
    node = NodeCapacity.objects.get(cluster=cluster, name="h100-1")
    outcome = _racing(node.pk, "nvidia.com/mig-7g.80gb", lambda: sync_inventory(cluster=cluster))
    assert outcome["waited"] and "error" not in outcome
    assert outcome["result"].ok
    spec = SpecAndCount.objects.get(node=node, resource_name="nvidia.com/mig-7g.80gb")
    assert (spec.profile, spec.capacity, spec.allocatable) == ("7g.80gb", 1, 1)  # what the cluster says
    with CaptureQueriesContext(connection) as ctx:
        assert not sync_inventory(cluster=cluster).changed
    assert writes(ctx) == []


@pytest.mark.django_db(transaction=True, serialized_rollback=True)
def test_admission_meeting_a_concurrent_insert_of_the_same_spec_row_does_not_raise(tenancy, staff_user):
    """Admission counts a profile the node does not advertise yet while a sync inserts its row."""
    from pools.models import Pool
    from pools.services import admit_waiting, approve_request, submit_request

    cluster = ClusterFactory(name="race", fleet=[("h200", 1, "H200-141GB", FULL)])
    sync_inventory(cluster=cluster)
    node = NodeCapacity.objects.get(cluster=cluster)
    request = submit_request(
        project=tenancy.vision, user=tenancy.acme_member, items=[("h200-141gb.mig-4g.71gb", 1)]
    )
    approve_request(request_id=request.pk, approver=staff_user("approver"))
    outcome = _racing(node.pk, "nvidia.com/mig-4g.71gb", admit_waiting)
    assert outcome["waited"] and "error" not in outcome
    assert [a.admitted for a in outcome["result"]] == [True]
    spec = SpecAndCount.objects.get(node=node, resource_name="nvidia.com/mig-4g.71gb")
    assert (spec.allocated, spec.capacity) == (1, 5)  # our count, the other writer's figures
    assert Pool.objects.get(request=request).state == "provisioning"
