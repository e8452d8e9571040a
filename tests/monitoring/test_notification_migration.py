"""The move of fault e-mails onto the alerts' notifications (migrations 0006 and 0007) keeps who was told
of each fault, and leaves a fault whose e-mails had not gone out yet to the next alert evaluation."""

from datetime import UTC, datetime

import pytest
from django.db import connection
from django.db.migrations.executor import MigrationExecutor

from monitoring.models import Delivery, GpuFault
from tests.factories import ClusterFactory, GpuCapacityFactory, NodeCapacityFactory, PoolFactory

BEFORE = [("monitoring", "0005_outbound_address_checks")]
AFTER = [("monitoring", "0007_fault_notices_told")]
AT = datetime(2026, 3, 2, 9, 30, tzinfo=UTC)


def migrate(targets):
    executor = MigrationExecutor(connection)
    executor.migrate(targets)
    return executor.loader.project_state(targets).apps


@pytest.fixture(autouse=True)
def _latest_after():
    """The database goes back to every app's latest migration after the test, as the other tests of this
    process expect it, not left at the migration the test looks at."""
    yield
    executor = MigrationExecutor(connection)
    executor.migrate(executor.loader.graph.leaf_nodes())


@pytest.mark.django_db(transaction=True, serialized_rollback=True)
def test_faults_told_before_keep_who_was_told_and_one_waiting_is_told_next():
    node = NodeCapacityFactory(cluster=ClusterFactory(), gpu_model="H100-80GB")
    told_gpu, waiting_gpu = GpuCapacityFactory(node=node, index=0), GpuCapacityFactory(node=node, index=1)
    ours, theirs = PoolFactory(), PoolFactory()
    try:
        old = migrate(BEFORE)
        OldFault, OldNotice = (
            old.get_model("monitoring", "GpuFault"),
            old.get_model("monitoring", "FaultNotice"),
        )
        fault = dict(kind="ecc", code=1, at=AT, drained_by_portal=True)
        told = OldFault.objects.create(gpu_id=told_gpu.pk, **fault)
        OldNotice.objects.create(
            fault=told,
            pool_id=ours.pk,
            flagged_at=AT,
            recipients="ann@acme.example, apo@ops.example",
            sent_at=AT,
        )
        OldNotice.objects.create(
            fault=told, pool_id=theirs.pk, flagged_at=AT, recipients="apo@ops.example", sent_at=AT
        )
        waiting = OldFault.objects.create(gpu_id=waiting_gpu.pk, **fault)
        OldNotice.objects.create(fault=waiting, pool_id=ours.pk, flagged_at=AT)
    finally:
        migrate(AFTER)

    assert GpuFault.objects.get(pk=told.pk).notified_at == AT
    assert sorted(
        Delivery.objects.filter(fault_id=told.pk).values_list("target", "fault_pools", "sent_at", "alert")
    ) == [
        ("ann@acme.example", [ours.pk], AT, None),
        ("apo@ops.example", sorted([ours.pk, theirs.pk]), AT, None),
    ]
    assert GpuFault.objects.get(pk=waiting.pk).notified_at is None
    assert not Delivery.objects.filter(fault_id=waiting.pk).exists()
