"""Several real workers on one queue, and workers stopped mid-task: every task is done once, whole.

Each test starts its own prefork workers (tests.conftest.running_worker) on a queue of its own, as
several worker pods of one deployment consume one queue. Tasks are sent twice at once, as two beat
ticks or a sweeper's re-drive would send them; where a test must be sure that the two runs meet, it
holds the lock they start on until both workers have taken their task.
"""

import os
import re
import signal
import subprocess
import time
import uuid
from collections import Counter
from contextlib import ExitStack, contextmanager
from datetime import timedelta
from types import SimpleNamespace

import pytest
from django.db import connection, transaction
from django.db.models import Count
from django.utils import timezone

from billing import services
from billing.metering import whole_seconds
from billing.models import MeteredPeriod, UsageRecord
from billing.services import METERING_LOCK, first_unmetered
from billing.tasks import meter_usage
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
from pools.services import admit_waiting, approve_request, dispatch, submit_request
from pools.services import queue as queue_service
from pools.services.provisioning import layouts_to_apply
from pools.services.queue import lock_capacity
from pools.sync import sync_cluster
from pools.tasks import admit_waiting_requests, provision_pool
from tests.conftest import running_worker
from tests.factories import ClusterFactory, PoolFactory, PoolRequestFactory, ProjectFactory

pytestmark = [pytest.mark.celery, pytest.mark.django_db(transaction=True, serialized_rollback=True)]

# One H200 node (GPU 0 in seven 1g.18gb, the rest whole and MIG off) and one H100 node of whole GPUs.
FLEET = [
    ("h200", 1, "H200-141GB", [{"1g.18gb": 7}, None, None, None, None, None, None, None]),
    ("h100", 1, "H100-80GB", [None] * 8),
]
TWO_MIG = "h200-141gb.mig-2g.35gb"  # no GPU has one yet: a pool of them waits for a re-partition
PERIOD = 60  # seconds: metering periods short enough that pools live across hundreds of them
METERING_ENV = {"METERING_PERIOD_SECONDS": str(PERIOD), "METERING_DELAY_SECONDS": "0"}


def wait_for(condition, what: str, timeout: float = 60, every: float = 0.1, meanwhile=None):
    """Poll until `condition()` holds, calling `meanwhile()` (which watches, or asserts) each time."""
    deadline = time.monotonic() + timeout
    while not (found := condition()):
        assert time.monotonic() < deadline, what
        if meanwhile is not None:
            meanwhile()
        time.sleep(every)
    return found


@contextmanager
def workers(queue: str, tmp_path, names=("a", "b"), env=None):
    """Prefork workers, one per name, each under its own node name, all consuming `queue`."""
    with ExitStack() as stack:
        started = []
        for name in names:
            workdir = tmp_path / name
            workdir.mkdir()
            started.append(
                stack.enter_context(
                    running_worker(queue, workdir, pool="prefork", hostname=f"{name}-{queue}@%h", env=env)
                )
            )
        yield started


def took(worker, task: str) -> int:
    """How many deliveries of `task` the worker received (a retry is a delivery of its own)."""
    return worker.log.read_text().count(f"Task {task}[")  # the banner lists names without a bracket


def finished(workers_, task: str) -> list[str]:
    """What each run of `task` returned, over all the workers' logs, in no particular order."""
    pattern = re.compile(rf"Task {re.escape(task)}\[[^\]]+\] succeeded in [\d.]+s: (.*)")
    return [m.group(1) for w in workers_ for m in pattern.finditer(w.log.read_text())]


def failures(workers_) -> list[str]:
    return [line for w in workers_ for line in w.log.read_text().splitlines() if "raised unexpected" in line]


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


def pool_children(worker) -> list[int]:
    found = subprocess.run(["pgrep", "-P", str(worker.process.pid)], capture_output=True, text=True)
    return [int(pid) for pid in found.stdout.split()]


@pytest.fixture
def to_nowhere(monkeypatch):
    """Admission in the test process enqueues nothing: the test sends the provisioning itself."""
    monkeypatch.setattr(
        queue_service, "dispatch", SimpleNamespace(PROVISION=dispatch.PROVISION, after_commit=lambda *a: None)
    )


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
    sync_cluster(cluster=cluster)
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


def expected_usage(pools, until: int) -> dict[tuple, int]:
    """(pool, model, profile, period start) -> instance-seconds, by counting each pool's seconds."""
    found = {}
    for pool in pools:
        reserved = whole_seconds(pool.reserved_at)
        released = until if pool.released_at is None else min(whole_seconds(pool.released_at), until)
        for item in pool.request.items.all():
            for start in range(reserved - reserved % PERIOD, released, PERIOD):
                held = min(released, start + PERIOD) - max(reserved, start)
                if held > 0:
                    found[(pool.pk, item.gpu_model, item.profile, start)] = item.count * held
    return found


def backdated_pools(minutes: int) -> list[Pool]:
    """Pools live across many ended periods: one still held, one released, one held for half a
    minute, one failed; reserved and released at fractions of a second."""
    now = timezone.now()

    def ago(minutes_ago: float, seconds: float = 0.0):
        return now - timedelta(minutes=minutes_ago, seconds=seconds)

    project = ProjectFactory()
    return [
        PoolFactory(project=project, request__items=[("h100-80gb.full", 2)], reserved_at=ago(minutes, 0.25)),
        PoolFactory(
            project=project,
            request__items=[("h100-80gb.full", 1), (TWO_MIG, 3)],
            state=PoolState.RELEASED,
            reserved_at=ago(minutes * 0.8, 13.5),
            released_at=ago(minutes * 0.3, 7.75),
        ),
        PoolFactory(
            project=project,
            request__items=[("h200-141gb.mig-1g.18gb", 5)],
            state=PoolState.RELEASED,
            reserved_at=ago(minutes * 0.5, -10.5),
            released_at=ago(minutes * 0.5, -40.25),
        ),
        PoolFactory(
            project=project,
            request__items=[("h100-80gb.full", 4)],
            state=PoolState.FAILED,
            reserved_at=ago(minutes * 0.6, 1.5),
            released_at=ago(minutes * 0.6, -30),
        ),
    ]


def metered_until() -> int:
    last = MeteredPeriod.objects.order_by("-start").first()
    return whole_seconds(last.start) + PERIOD


def assert_metered_exactly_once(pools, first: int) -> None:
    """Every period from `first` to the last metered one is metered, each (pool, spec, period) has one
    usage row with the seconds the pool held, and each pool's rows add up to its live time."""
    until = metered_until()
    starts = [
        whole_seconds(s) for s in MeteredPeriod.objects.order_by("start").values_list("start", flat=True)
    ]
    assert starts == list(range(first, until, PERIOD))  # none skipped, none twice
    rows = list(UsageRecord.objects.values_list("pool_id", "gpu_model", "profile", "period_start", "seconds"))
    keys = Counter((pool, model, profile, whole_seconds(start)) for pool, model, profile, start, _s in rows)
    assert max(keys.values()) == 1
    found = {(p, m, prof, whole_seconds(start)): s for p, m, prof, start, s in rows}
    assert found == expected_usage(pools, until)
    for pool in pools:
        end = until if pool.released_at is None else min(whole_seconds(pool.released_at), until)
        live = end - whole_seconds(pool.reserved_at)
        held = sum(item.count for item in pool.request.items.all()) * live
        assert sum(s for key, s in found.items() if key[0] == pool.pk) == held


def test_two_beat_ticks_of_metering_at_once_meter_every_period_once(settings, tmp_path):
    settings.METERING_PERIOD_SECONDS, settings.METERING_DELAY_SECONDS = PERIOD, 0  # as the workers have it
    pools = backdated_pools(minutes=300)
    first = first_unmetered()
    queue = f"meter-{uuid.uuid4().hex[:8]}"
    with workers(queue, tmp_path, env=METERING_ENV) as both:
        # The metering lock is held until both runs have started: they meet from the first period on.
        with transaction.atomic():
            with connection.cursor() as cursor:
                cursor.execute("SELECT pg_advisory_xact_lock(%s)", [METERING_LOCK])
            sent = [meter_usage.apply_async(queue=queue) for _ in range(2)]
            wait_for(lambda: all(took(w, meter_usage.name) for w in both), "both take one")
            time.sleep(0.3)
        outcomes = [result.get(timeout=60) for result in sent]  # raises if a run failed
    assert all(outcome.startswith("metered ") for outcome in outcomes), outcomes
    assert len(finished(both, meter_usage.name)) == 2 and not failures(both)
    assert metered_until() > whole_seconds(timezone.now()) - 2 * PERIOD  # caught up on ~300 periods
    assert_metered_exactly_once(pools, first)


def test_two_queue_runs_at_once_admit_each_request_once(tenancy, tmp_path):
    cluster = ClusterFactory(name="admit", fleet=FLEET)
    sync_cluster(cluster=cluster)
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
                not pools.filter(state=PoolState.PROVISIONING).exists()
                and len(finished(both, provision_pool.name)) >= pools.count()
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
    sync_cluster(cluster=cluster)
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


def half_metered() -> bool:
    """Whether a period shows only part of its metering: usage rows without the period marked metered,
    or a period marked metered without the rows it counted. One statement: one snapshot."""
    with connection.cursor() as cursor:
        cursor.execute(
            """
            SELECT EXISTS (
                       SELECT 1 FROM billing_usagerecord u
                       WHERE NOT EXISTS (SELECT 1 FROM billing_meteredperiod p WHERE p.start = u.period_start)
                   )
                OR EXISTS (
                       SELECT 1 FROM billing_meteredperiod p
                       WHERE p.records <> (
                           SELECT count(*) FROM billing_usagerecord u WHERE u.period_start = p.start
                       )
                   )
            """
        )
        return cursor.fetchone()[0]


def waits_for_metering_lock() -> bool:
    """Whether another connection waits for the metering lock (a one-key advisory lock: objsubid 1)."""
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT EXISTS (SELECT 1 FROM pg_locks WHERE locktype = 'advisory' AND NOT granted "
            "AND classid = 0 AND objid = %s::oid AND objsubid = 1 AND pid <> pg_backend_pid())",
            [METERING_LOCK],
        )
        return cursor.fetchone()[0]


def test_a_worker_stopped_mid_metering_leaves_no_period_half_metered(settings, tmp_path):
    """SIGTERM in the middle of a long catch-up run, then the process running it killed before the run
    ends (as when the grace period runs out): it leaves whole periods only, metered or not, whenever it
    is looked at. The task goes back to the queue (acknowledged late, rejected when its worker is
    lost) and another worker meters the rest, once. The run meters in parts, each its own transaction;
    the test holds the metering lock after the first part, so that the run is cut inside the second."""
    settings.METERING_PERIOD_SECONDS, settings.METERING_DELAY_SECONDS = PERIOD, 0
    pools = backdated_pools(minutes=5000)
    first = first_unmetered()
    queue = f"cut-{uuid.uuid4().hex[:8]}"

    def whole():
        assert not half_metered()

    def hold_metering_lock():
        with connection.cursor() as cursor:
            cursor.execute("SELECT pg_advisory_xact_lock(%s)", [METERING_LOCK])

    with workers(queue, tmp_path, names=("first",), env=METERING_ENV) as (first_worker,):
        with transaction.atomic():  # the run waits at the lock before its first part
            hold_metering_lock()
            meter_usage.apply_async(queue=queue)
            wait_for(waits_for_metering_lock, "the run waits for the lock", every=0.02)
        with transaction.atomic():  # granted once the first part is committed, before the second part asks
            hold_metering_lock()
            wait_for(waits_for_metering_lock, "the second part waits for the lock", every=0.02)
            assert MeteredPeriod.objects.count() == services.PERIODS_PER_TRANSACTION
            first_worker.process.send_signal(signal.SIGTERM)
            grace = time.monotonic() + 1.5  # every period is seen whole or not at all, throughout
            wait_for(lambda: time.monotonic() > grace, "the grace period ends", every=0.01, meanwhile=whole)
            (child,) = pool_children(first_worker)
            os.kill(child, signal.SIGKILL)
            first_worker.process.wait(timeout=30)
    cut = MeteredPeriod.objects.count()
    assert cut == services.PERIODS_PER_TRANSACTION and not half_metered()
    log = first_worker.log.read_text()
    assert "Warm shutdown" in log and "WorkerLostError" in log  # cut mid-run, not after it
    assert not finished([first_worker], meter_usage.name)
    with workers(queue, tmp_path, names=("second",), env=METERING_ENV) as (second,):  # nothing sent again
        wait_for(lambda: finished([second], meter_usage.name), "the run ends", every=0.02, meanwhile=whole)
    assert not failures([second])
    assert MeteredPeriod.objects.count() > cut
    assert_metered_exactly_once(pools, first)
