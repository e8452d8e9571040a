"""Metering under real workers: two beat ticks at once, and a worker stopped in the middle of a long
catch-up run; every period is metered once, whole, whatever happens to the workers.

Each test starts its own prefork workers (tests/ops/workers.py) on a queue of its own.
"""

import os
import signal
import time
import uuid
from collections import Counter
from datetime import timedelta

import pytest
from django.db import connection, transaction
from django.utils import timezone

from billing import services
from billing.metering import whole_seconds
from billing.models import MeteredPeriod, UsageRecord
from billing.services import METERING_LOCK, first_unmetered
from billing.tasks import meter_usage
from pools.models import Pool, PoolState
from tests.factories import PoolFactory, ProjectFactory
from tests.ops.workers import TWO_MIG, failures, finished, pool_children, took, wait_for, workers

pytestmark = [pytest.mark.celery, pytest.mark.django_db(transaction=True, serialized_rollback=True)]

PERIOD = 60  # seconds: metering periods short enough that pools live across hundreds of them
METERING_ENV = {"METERING_PERIOD_SECONDS": str(PERIOD), "METERING_DELAY_SECONDS": "0"}


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
        PoolFactory(
            allocated=True,
            project=project,
            request__items=[("h100-80gb.full", 2)],
            reserved_at=ago(minutes, 0.25),
        ),
        PoolFactory(
            allocated=True,
            project=project,
            request__items=[("h100-80gb.full", 1), (TWO_MIG, 3)],
            state=PoolState.RELEASED,
            reserved_at=ago(minutes * 0.8, 13.5),
            released_at=ago(minutes * 0.3, 7.75),
        ),
        PoolFactory(
            allocated=True,
            project=project,
            request__items=[("h200-141gb.mig-1g.18gb", 5)],
            state=PoolState.RELEASED,
            reserved_at=ago(minutes * 0.5, -10.5),
            released_at=ago(minutes * 0.5, -40.25),
        ),
        PoolFactory(
            allocated=True,
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
            "AND classid = 0 AND objid = %s::oid AND objsubid = 1 AND pid <> pg_backend_pid() "
            "AND database = (SELECT oid FROM pg_database WHERE datname = current_database()))",
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
