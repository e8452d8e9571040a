"""The portal's own collection: the simulated fleet read through the same ingest as an agent's batch, and a
cluster's Prometheus that fails, recorded where operators see it."""

import base64
from datetime import UTC, datetime, timedelta

import pytest

from monitoring.ingest import collection
from monitoring.models import CollectorStatus, Latest, Sample
from monitoring.tasks import collect
from pools.models import Cluster
from pools.services import ClusterSettings, register_cluster
from pools.services.inventory import sync_inventory
from tests.factories import AllocationFactory, ClusterFactory

pytestmark = pytest.mark.django_db

NOW = datetime.now(UTC).replace(microsecond=0)


@pytest.fixture
def sim():
    cluster = ClusterFactory(name="sim", fleet=[("gpu", 2, "H100-80GB", [{"3g.40gb": 2}, None])])
    sync_inventory(cluster=cluster)
    return cluster


def test_the_simulated_fleet_is_read_into_samples(sim):
    done = collection.collect(sim, now=NOW)

    # Two nodes, each a MIG GPU with two instances and a full GPU: 2 × (1 + 2 + 1) samples.
    assert (done.gpus, done.samples, done.error) == (4, 8, "")
    assert Sample.objects.filter(at=NOW).count() == 8
    status = CollectorStatus.objects.get(cluster=sim)
    assert (status.source, status.last_success_at, status.gpus) == ("simulated", NOW, 4)


def test_held_instances_read_as_the_pool_works_and_free_ones_idle(sim):
    gpu = sim.nodes.get(name="gpu-1").gpus.get(index=0)
    held = AllocationFactory(gpu=gpu, profile="3g.40gb")
    readings = collection.collector_for(sim, now=NOW).readings()

    assert collection.busy_instances(sim) == {(gpu.uuid, held.slices.lower): f"pool-{held.pool_id}"}
    [instances] = [g.instances for r in readings if r.host == "gpu-1" for g in r.gpus if g.uuid == gpu.uuid]
    by_start = {i.placement[0]: i for i in instances}
    free_start = next(start for start in by_start if start != held.slices.lower)
    assert by_start[free_start].sm_active_pct < 5


def test_a_failing_prometheus_is_recorded_and_stores_nothing(sim, private_networks_allowed):
    sim.prometheus_url = "http://127.0.0.1:9"  # nothing listens on the discard port
    sim.save()

    done = collection.collect(sim, now=NOW)

    assert done.samples == 0 and "127.0.0.1:9" in done.error
    status = CollectorStatus.objects.get(cluster=sim)
    assert status.source == "dcgm" and status.last_success_at is None and "127.0.0.1:9" in status.last_error
    assert not Latest.objects.exists()


def test_a_clusters_prometheus_is_read_with_its_stored_credential(
    sim, fake_prometheus, private_networks_allowed
):
    fake = fake_prometheus(200, {"status": "success", "data": {"resultType": "matrix", "result": []}})
    with_password = fake.url.replace("http://", "http://portal:hunter2@")
    register_cluster(ClusterSettings(name="sim", driver="simulated", prometheus_url=with_password))
    sim.refresh_from_db()

    done = collection.collect(sim, now=NOW)

    assert (done.source, done.error) == ("dcgm", "")
    ((_path, headers),) = fake.requests
    assert headers["Authorization"] == "Basic " + base64.b64encode(b"portal:hunter2").decode()
    assert CollectorStatus.objects.get(cluster=sim).last_success_at == NOW


def test_a_credential_that_cannot_be_decrypted_is_recorded_not_raised(sim, private_networks_allowed):
    Cluster.objects.filter(pk=sim.pk).update(
        prometheus_url="http://127.0.0.1:9", prometheus_credential_encrypted="sealed-with-another-key"
    )
    sim.refresh_from_db()

    done = collection.collect(sim, now=NOW)

    assert "The stored Prometheus credential cannot be decrypted" in done.error
    assert "cannot be decrypted" in CollectorStatus.objects.get(cluster=sim).last_error


def test_the_beat_task_collects_every_collectable_cluster(sim):
    ClusterFactory(name="real", driver="kubernetes")

    summary = collect()

    assert [c.name for c in collection.collectable()] == ["sim"]
    assert summary.startswith("sim: 4 GPUs")
    assert Latest.objects.filter(at__gte=NOW - timedelta(minutes=1)).count() == 8
