"""Background sync: beat queues the clusters that are due, a real worker syncs them through Redis."""

import time
from datetime import timedelta

import pytest
from django.utils import timezone

from pools.models import NodeCapacity
from pools.sync import sync_lock
from pools.tasks import sync_all_clusters, sync_cluster_now
from tests.factories import ClusterFactory

from .conftest import SMALL_FLEET


@pytest.mark.celery
def test_beat_queues_due_clusters_and_the_worker_syncs_them(celery_worker, transactional_db):
    due = ClusterFactory(name="due", fleet=SMALL_FLEET)
    later = ClusterFactory(name="later", fleet=SMALL_FLEET)
    later.next_sync_at = timezone.now() + timedelta(hours=1)  # backing off after failures
    later.save()
    assert sync_all_clusters() == 1
    deadline = time.monotonic() + 30
    while NodeCapacity.objects.filter(cluster=due).count() < 3:
        assert time.monotonic() < deadline, "the worker did not sync the cluster"
        time.sleep(0.2)
    assert not NodeCapacity.objects.filter(cluster=later).exists()


def test_a_cluster_is_never_synced_twice_at_once(sim_cluster):
    with sync_lock(sim_cluster.pk) as held:
        assert held
        assert sync_cluster_now(sim_cluster.pk) == "another sync of this cluster is running"
        assert not NodeCapacity.objects.exists()
    assert "nodes new 3" in sync_cluster_now(sim_cluster.pk)
