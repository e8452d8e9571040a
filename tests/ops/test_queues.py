"""Each kind of work on a Celery queue of its own, under real workers: a burst on one queue holds up no task
on another.

The test starts one worker per queue it needs, as the deployment runs one per queue, and routes what it sends
as production does (tests/ops/workers.py: `routed`), each queue named apart for the test. The burst is made to
wait, not to be slow: its first task blocks on a lock the test holds, the rest wait behind it.
"""

import uuid
from contextlib import ExitStack, contextmanager
from datetime import timedelta

import psycopg
import pytest
from django.utils import timezone

from billing.services import METERING_LOCK
from billing.tasks import meter_usage
from pools.models import Pool, PoolState, RequestState
from pools.services import approve_request, submit_request
from pools.tasks import admit_waiting_requests, provision_pool
from tests.conftest import QUEUE_SETTINGS, database_address, running_worker
from tests.factories import PoolFactory
from tests.ops.workers import failures, finished, routed, took, wait_for

pytestmark = [pytest.mark.celery, pytest.mark.django_db(transaction=True, serialized_rollback=True)]

FLEET = [("h100", 1, "H100-80GB", [None] * 8)]
BURST = 6


@contextmanager
def broker():
    """The broker's Redis, to read a queue's length."""
    from portal.celery import app

    with app.connection_for_read() as connection:
        yield connection.default_channel.client


def test_a_burst_of_metering_holds_up_no_provisioning(synced, tenancy, approver, settings, tmp_path):
    """Six metering runs are queued, the first stuck on the metering lock; a request approved meanwhile is
    admitted and provisioned by the provisioning worker while all six still wait. With one queue for both
    (as before), the queue run and the provisioning would wait behind the six."""
    cluster = synced(FLEET)
    # Two hours held and released: the metering runs have ended periods to meter, under the lock.
    hours_ago = timezone.now() - timedelta(hours=3)
    PoolFactory(
        cluster=cluster,
        project=tenancy.vision,
        state=PoolState.RELEASED,
        reserved_at=hours_ago,
        released_at=hours_ago + timedelta(hours=2),
    )
    suffix = uuid.uuid4().hex[:8]
    queues = {name: f"{name.lower()}-{suffix}" for name in ("CELERY_QUEUE", *QUEUE_SETTINGS)}
    for name in QUEUE_SETTINGS:
        setattr(settings, name, queues[name])  # the test's sends go where the workers' own do
    provisioning_queue, metering_queue = queues["PROVISIONING_QUEUE"], queues["METERING_QUEUE"]
    with ExitStack() as stack:
        started = {}
        for queue in (provisioning_queue, metering_queue):
            (tmp_path / queue).mkdir()
            started[queue] = stack.enter_context(
                running_worker(queue, tmp_path / queue, pool="prefork", hostname=f"{queue}@%h", env=queues)
            )
        provisioning, metering = started[provisioning_queue], started[metering_queue]
        stack.enter_context(routed(queues["CELERY_QUEUE"]))
        # Another session holds the metering lock: the first run waits on it, the other five behind it.
        holder = stack.enter_context(psycopg.connect(database_address(), autocommit=True))
        holder.execute("SELECT pg_advisory_lock(%s)", [METERING_LOCK])
        for _ in range(BURST):
            meter_usage.delay()
        wait_for(lambda: took(metering, meter_usage.name), "the metering worker takes the first run")

        request = submit_request(
            project=tenancy.vision, user=tenancy.acme_member, items=[("h100-80gb.full", 2)]
        )
        approve_request(request_id=request.pk, approver=approver)  # sends the queue run, routed
        pool = wait_for(
            lambda: (
                Pool.objects.filter(request=request, state=PoolState.ACTIVE).first()
                or failures(started.values())
            ),
            "the pool is admitted and provisioned",
        )

        assert not failures(started.values())
        assert isinstance(pool, Pool) and pool.state == PoolState.ACTIVE
        assert finished([provisioning], admit_waiting_requests.name)
        assert finished([provisioning], provision_pool.name)
        # The burst was still waiting: none of it done, all but the first still on its queue.
        assert finished([metering], meter_usage.name) == []
        assert took(metering, meter_usage.name) == 1
        with broker() as redis:
            assert redis.llen(metering_queue) == BURST - 1

        holder.execute("SELECT pg_advisory_unlock(%s)", [METERING_LOCK])
        wait_for(
            lambda: len(finished([metering], meter_usage.name)) == BURST or failures([metering]),
            "the burst ends once the lock is let go",
        )
        assert not failures([metering])
        with broker() as redis:  # what the workers sent to queues nobody here takes (e-mails)
            redis.delete(*queues.values())
    request.refresh_from_db()
    assert request.state == RequestState.FULFILLED
    assert not any(took(metering, task) for task in (admit_waiting_requests.name, provision_pool.name))
    assert not took(provisioning, meter_usage.name)
