"""Inventory as one service: the cluster's lock, the sync, the queue run when capacity may have
appeared; the admin asks a worker instead of syncing inside the web request."""

from django.urls import reverse

from pools import task_names
from pools.models import NodeCapacity
from pools.services import sync_inventory
from pools.services.inventory import sync_lock
from portal import dispatch


def sends(callbacks) -> list[tuple[str, tuple]]:
    return [(c.task, c.args) for c in callbacks if isinstance(c, dispatch.Send)]


def test_a_sync_that_finds_capacity_runs_the_queue_and_one_that_does_not_stays_quiet(
    sim_cluster, django_capture_on_commit_callbacks
):
    with django_capture_on_commit_callbacks() as first:
        report = sync_inventory(cluster=sim_cluster)
    assert report.changed and NodeCapacity.objects.filter(cluster=sim_cluster).count() == 3
    assert sends(first) == [(task_names.ADMIT, ())]
    with django_capture_on_commit_callbacks() as again:
        assert not sync_inventory(cluster=sim_cluster).changed
    assert sends(again) == []


def test_a_running_sync_holds_others_off_except_provisioning(sim_cluster):
    with sync_lock(sim_cluster.pk) as held:
        assert held
        assert sync_inventory(cluster=sim_cluster) is None
        assert not NodeCapacity.objects.exists()
        assert sync_inventory(cluster=sim_cluster, even_if_running=True).changed
    assert NodeCapacity.objects.filter(cluster=sim_cluster).count() == 3


def test_the_admin_has_a_worker_sync(sim_cluster, staff_user, client, django_capture_on_commit_callbacks):
    client.force_login(staff_user("operator"))
    with django_capture_on_commit_callbacks() as callbacks:
        response = client.post(
            reverse("admin:pools_cluster_changelist"),
            {"action": "sync_now", "_selected_action": [sim_cluster.pk]},
            follow=True,
        )
    assert "on its way" in response.content.decode()
    assert sends(callbacks) == [(task_names.SYNC, (sim_cluster.pk,))]
    assert not NodeCapacity.objects.exists()  # nothing synced inside the web request
