"""Several real workers on one queue, and workers stopped mid-task: every task is done once, whole.

Each test starts its own prefork workers (tests/ops/workers.py) on a queue of its own, as
several worker pods of one deployment consume one queue. Tasks are sent twice at once, as two beat
ticks or a sweeper's re-drive would send them; where a test must be sure that the two runs meet, it
holds the lock they start on until both workers have taken their task.
"""

import signal
import time
import uuid
from types import SimpleNamespace

import pytest
from django.db import transaction
from django.db.models import Count

from pools.drivers.simulated import SimulatedDriver
from pools.models import (
    Allocation,
    Pool,
    PoolEvent,
    PoolRequest,
    PoolState,
    RequestState,
    SimulatedClusterState,
    SpecAndCount,
)
from pools.services import admit_waiting, approve_request, submit_request
from pools.services import queue as queue_service
from pools.services.inventory import sync_inventory
from pools.services.provisioning import layouts_to_apply
from pools.services.reservations import lock_capacity
from pools.tasks import admit_waiting_requests, provision_pool
from tests.factories import ClusterFactory, PoolRequestFactory
from tests.ops.workers import TWO_MIG, failures, finished, took, wait_for, workers

pytestmark = [pytest.mark.celery, pytest.mark.django_db(transaction=True, serialized_rollback=True)]

# One H200 node (GPU 0 in seven 1g.18gb, the rest whole and MIG off) and one H100 node of whole GPUs.
FLEET = [
    ("h200", 1, "H200-141GB", [{"1g.18gb": 7}, None, None, None, None, None, None, None]),
    ("h100", 1, "H100-80GB", [None] * 8),
]


def allocations(pool) -> set[tuple]:
    return set(pool.allocations.values_list("pk", "gpu_id", "profile", "slices", "released_at"))


def quotas(cluster) -> dict:
    cluster.simulation.refresh_from_db()
    return cluster.simulation.state["quotas"]


def sim_node(cluster, node: str) -> dict:
    return SimulatedClusterState.objects.get(cluster=cluster).state["nodes"][node]


def note_mig_change(cluster, node: str, asked: set) -> None:
    """Add the MIG change the node has pending, if any, to `asked`: each change asked of the simulated
    cluster is due at a moment of its own, and every cluster call takes longer than one poll."""
    pending = sim_node(cluster, node)["pending"]
    if pending:
        asked.add(pending["due"])


@pytest.fixture
def to_nowhere(monkeypatch):
    """Admission in the test process enqueues nothing: the test sends the provisioning itself."""
    monkeypatch.setattr(queue_service, "dispatch", SimpleNamespace(after_commit=lambda *a: None))


def admitted_pool(tenancy, approver, items) -> Pool:
    """A pool admitted in the test process, its provisioning not started. Approved and admitted in
    one transaction: the queue run that approval asks for (a session's worker may be up) finds
    nothing left to admit."""
    request = submit_request(project=tenancy.vision, user=tenancy.acme_member, items=items)
    with transaction.atomic():
        approve_request(request_id=request.pk, approver=approver)
        admit_waiting()
    return Pool.objects.get(request=request)


def test_two_workers_given_one_pool_twice_provision_it_once(tenancy, approver, tmp_path, to_nowhere):
    cluster = ClusterFactory(name="twice", fleet=FLEET)
    sync_inventory(cluster=cluster)
    pool = admitted_pool(tenancy, approver, [(TWO_MIG, 3)])
    reserved = allocations(pool)
    (node,) = layouts_to_apply(pool)  # one GPU of one node to re-partition
    SimulatedDriver(cluster).set_latency(1.0)  # every cluster call takes a while
    queue = f"twice-{uuid.uuid4().hex[:8]}"
    with workers(queue, tmp_path) as both:
        # Both runs read the pool before either reaches the cluster: its row is held until both
        # workers have their task (the first cluster call of each waits on it).
        with transaction.atomic():
            SimulatedClusterState.objects.select_for_update().get(cluster=cluster)
            for _ in range(2):
                provision_pool.apply_async(args=[pool.pk], queue=queue)
            wait_for(lambda: all(took(w, provision_pool.name) for w in both), "both take one")
            time.sleep(0.5)
        asked = set()
        wait_for(
            lambda: len(finished(both, provision_pool.name)) == 2 or failures(both),
            "both runs end",
            every=0.05,
            meanwhile=lambda: note_mig_change(cluster, node, asked),
        )
    assert not failures(both)
    assert finished(both, provision_pool.name) == ["'done'", "'done'"]
    assert len(asked) == 1, f"{node} was asked to re-partition {len(asked)} times"
    pool.refresh_from_db()
    assert pool.state == PoolState.ACTIVE
    assert list(pool.events.values_list("to_state", flat=True)) == ["provisioning", "active"]
    assert allocations(pool) == reserved  # none added, none released, none moved
    state = sim_node(cluster, node)
    assert state["mig_state"] == "success"
    assert state["mig_config"] == pool.mig_configs[node]
    made = {i["uuid"] for gpu in state["gpus"] for i in gpu["instances"] if i["profile"] == "2g.35gb"}
    bound = list(pool.allocations.values_list("instance_uuid", flat=True))
    assert len(set(bound)) == 3 and set(bound) <= made  # each holds an instance the cluster has
    assert quotas(cluster)["acme-vision"] == {"nvidia.com/mig-2g.35gb": 3}


def test_two_queue_runs_at_once_admit_each_request_once(tenancy, tmp_path):
    cluster = ClusterFactory(name="admit", fleet=FLEET)
    sync_inventory(cluster=cluster)
    asked = [
        [("h100-80gb.full", 3)],
        [("h100-80gb.full", 3)],
        [("h100-80gb.full", 3)],  # 9 of 8 H100s: one of the three waits
        [("h200-141gb.mig-1g.18gb", 4)],
        [("h200-141gb.mig-1g.18gb", 4)],  # 8 of the 7 instances there are: waits (or a re-partition)
        [("h200-141gb.full", 5)],
    ]
    requests = [
        PoolRequestFactory(project=tenancy.vision, state=RequestState.APPROVED, items=items)
        for items in asked
    ]
    queue = f"admit-{uuid.uuid4().hex[:8]}"
    with workers(queue, tmp_path) as both:
        with transaction.atomic():  # both runs wait at the queue's lock, then go one after the other
            lock_capacity()
            sent = [admit_waiting_requests.apply_async(queue=queue) for _ in range(2)]
            wait_for(lambda: all(took(w, admit_waiting_requests.name) for w in both), "both take one")
            time.sleep(0.3)
        outcomes = [result.get(timeout=60) for result in sent]
        pools = Pool.objects.filter(request__in=requests)
        # The workers provision what they admitted (the provisioning goes to their own queue).
        wait_for(
            lambda: (
                (
                    not pools.filter(state=PoolState.PROVISIONING).exists()
                    and len(finished(both, provision_pool.name)) >= pools.count()
                )
                or failures(both)
            ),
            "the admitted pools are provisioned",
        )
    admitted = [int(outcome.strip("'").split()[0]) for outcome in outcomes]
    assert sorted(admitted)[0] == 0 and sum(admitted) == pools.count() >= 4  # the second run found all taken
    assert not failures(both)
    assert set(pools.values_list("state", flat=True)) == {PoolState.ACTIVE}
    for request in PoolRequest.objects.filter(pk__in=[r.pk for r in requests]):
        pool = Pool.objects.filter(request=request).first()
        assert request.state == (RequestState.FULFILLED if pool else RequestState.QUEUED)
        if pool is None:
            continue
        assert list(pool.events.values_list("to_state", flat=True)) == ["provisioning", "active"]
        wanted = {(i.profile, i.count) for i in request.items.all()}
        held = pool.allocations.filter(released_at=None).values_list("profile").annotate(n=Count("id"))
        assert set(held) == wanted
    fulfilled = PoolEvent.objects.filter(request__in=requests, to_state=RequestState.FULFILLED)
    assert fulfilled.count() == pools.count()
    live = Allocation.objects.filter(released_at=None)
    by_spec = live.values_list("gpu__node_id", "resource_name").annotate(n=Count("id"))
    counted = {
        (s.node_id, s.resource_name): s.allocated for s in SpecAndCount.objects.filter(allocated__gt=0)
    }
    assert counted == {(node, resource): n for node, resource, n in by_spec}  # nothing reserved twice
    assert quotas(cluster)["acme-vision"] == dict(live.values_list("resource_name").annotate(n=Count("id")))


def test_a_worker_stopped_mid_provisioning_leaves_the_rest_to_the_next_one(
    tenancy, approver, tmp_path, to_nowhere
):
    """SIGTERM (a rolling update, a scale-down) in the middle of a slow cluster call: the worker
    finishes that step (warm shutdown) and the next step, already queued, waits for another worker."""
    cluster = ClusterFactory(name="stopped", fleet=FLEET)
    sync_inventory(cluster=cluster)
    pool = admitted_pool(tenancy, approver, [(TWO_MIG, 2), ("h100-80gb.full", 1)])
    reserved = allocations(pool)
    (node,) = layouts_to_apply(pool)
    SimulatedDriver(cluster).set_latency(1.5)
    queue = f"stopped-{uuid.uuid4().hex[:8]}"
    with workers(queue, tmp_path, names=("first",)) as (first,):
        provision_pool.apply_async(args=[pool.pk], queue=queue)
        wait_for(lambda: took(first, provision_pool.name), "the worker takes it")
        time.sleep(0.5)  # inside the first slow cluster call (the MIG change)
        first.process.send_signal(signal.SIGTERM)
        assert first.process.wait(timeout=30) == 0
    log = first.log.read_text()
    assert "Warm shutdown" in log and not failures([first])
    # Stopped between two steps: the MIG change it asked is recorded with the pool, nothing else done.
    pool.refresh_from_db()
    assert pool.state == PoolState.PROVISIONING and allocations(pool) == reserved
    assert pool.mig_configs == {node: sim_node(cluster, node)["mig_config"]}
    assert "acme-vision" not in quotas(cluster)
    asked = {sim_node(cluster, node)["pending"]["due"]}
    with workers(queue, tmp_path, names=("second",)) as (second,):  # nothing sent again
        wait_for(
            lambda: finished([second], provision_pool.name),
            "the task ends",
            every=0.05,
            meanwhile=lambda: note_mig_change(cluster, node, asked),
        )
    assert len(asked) == 1, f"{node} was asked to re-partition {len(asked)} times"
    pool.refresh_from_db()
    assert pool.state == PoolState.ACTIVE
    assert list(pool.events.values_list("to_state", flat=True)) == ["provisioning", "active"]
    assert allocations(pool) == reserved
    assert not Allocation.objects.filter(released_at=None).exclude(pool__state=PoolState.ACTIVE).exists()
    assert quotas(cluster)["acme-vision"] == {"nvidia.com/mig-2g.35gb": 2, "nvidia.com/gpu": 1}
