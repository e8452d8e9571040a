"""Quotas through a real worker: a request within its tenant's guarantee approved by the policy, a borrowed
pool reclaimed for it with notice and e-mail and released at the deadline by the task sent for that moment,
the request then admitted and provisioned; and a reclaim called off when its request is cancelled first."""

import time
import uuid

import pytest

from pools.models import Pool, PoolRequest, PoolState, RequestState
from pools.services import admit_waiting, approve_request, cancel_request, submit_request
from pools.services.provisioning import DONE, provision_step
from pools.services.quotas import set_auto_approve, set_quota
from tests.conftest import running_worker
from tests.ops.workers import default_queue, failures, finished, wait_for
from tests.pools.conftest import SMALL_FLEET

pytestmark = [pytest.mark.celery, pytest.mark.django_db(transaction=True, serialized_rollback=True)]

H100 = "H100-80GB"
NOTICE = 3  # seconds: the worker's RECLAIM_NOTICE_SECONDS


@pytest.fixture
def borrowed(synced, tenancy, operator, approver, settings):
    """Globex holds all 8 H100s, the second half borrowed; Acme, guaranteed the other half, asks by policy."""
    settings.RECLAIM_NOTICE_SECONDS = NOTICE  # as the worker has it
    synced(SMALL_FLEET)
    set_quota(actor=operator, tenant=tenancy.acme, gpu_model=H100, guaranteed=28)
    set_quota(actor=operator, tenant=tenancy.globex, gpu_model=H100, guaranteed=28, limit=None)
    set_auto_approve(actor=operator, tenant=tenancy.acme, on=True)
    held = []
    for _ in range(2):
        request = submit_request(
            project=tenancy.recsys, user=tenancy.globex_member, items=[("h100-80gb.full", 4)]
        )
        approve_request(request_id=request.pk, approver=approver)
        admit_waiting()
        pool = Pool.objects.get(request=request)
        assert provision_step(pool_id=pool.pk) == DONE
        held.append(pool)
    return held[1]


@pytest.fixture
def worker(tmp_path):
    queue = f"reclaim-{uuid.uuid4().hex[:8]}"
    env = {"RECLAIM_NOTICE_SECONDS": str(NOTICE)}
    with running_worker(queue, tmp_path, pool="prefork", env=env) as started, default_queue(queue):
        yield started


def test_a_request_approved_by_policy_reclaims_with_notice_and_is_admitted_at_the_deadline(
    borrowed, tenancy, worker
):
    tenancy.globex_member.email = "mallory@example.com"
    tenancy.globex_member.save(update_fields=["email"])
    request = submit_request(project=tenancy.vision, user=tenancy.acme_member, items=[("h100-80gb.full", 4)])
    assert (request.state, request.quota_verdict, request.decided_by) == (
        RequestState.APPROVED,
        "within",
        None,
    )
    # The worker runs the queue the approval sent: no room, so the borrowed pool gets its notice.
    wait_for(
        lambda: Pool.objects.get(pk=borrowed.pk).state == PoolState.RECLAIMING or failures([worker]), "notice"
    )
    noticed = Pool.objects.get(pk=borrowed.pk)
    assert noticed.reclaimed_for_id == request.pk
    mail = wait_for(
        lambda: [p.read_text() for p in worker.mail_dir.glob("*") if f"pool #{borrowed.pk}" in p.read_text()],
        "the notice's e-mail",
    )
    assert "mallory@example.com" in mail[0] and "reclaimed" in mail[0]
    assert PoolRequest.objects.get(pk=request.pk).state == RequestState.QUEUED
    # At the deadline the task sent for it releases the pool, billing stopping there, and the queue admits.
    wait_for(
        lambda: PoolRequest.objects.get(pk=request.pk).state == RequestState.FULFILLED or failures([worker]),
        "admitted once the notice ended",
        timeout=NOTICE + 60,
    )
    released = Pool.objects.get(pk=borrowed.pk)
    assert released.state in (PoolState.RELEASING, PoolState.RELEASED)
    assert released.released_at == released.reclaim_at == noticed.reclaim_at
    assert any(
        line.startswith("'1 released") for line in finished([worker], "pools.tasks.release_reclaimed_pools")
    )
    mine = Pool.objects.get(request=request)
    wait_for(
        lambda: Pool.objects.get(pk=mine.pk).state == PoolState.ACTIVE or failures([worker]), "provisioned"
    )
    assert not failures([worker])


def test_a_reclaim_is_called_off_when_its_request_is_cancelled_first(borrowed, tenancy, worker):
    request = submit_request(project=tenancy.vision, user=tenancy.acme_member, items=[("h100-80gb.full", 4)])
    wait_for(
        lambda: Pool.objects.get(pk=borrowed.pk).state == PoolState.RECLAIMING or failures([worker]), "notice"
    )
    cancel_request(request_id=request.pk, user=tenancy.acme_member)
    kept = Pool.objects.get(pk=borrowed.pk)
    assert (kept.state, kept.reclaim_at) == (PoolState.ACTIVE, None)
    # The task sent for the deadline comes, and finds nothing due.
    wait_for(
        lambda: finished([worker], "pools.tasks.release_reclaimed_pools") or failures([worker]),
        "the deadline's task",
        timeout=NOTICE + 60,
    )
    time.sleep(0.2)
    assert finished([worker], "pools.tasks.release_reclaimed_pools") == ["'0 released'"]
    assert Pool.objects.get(pk=borrowed.pk).state == PoolState.ACTIVE
    assert not failures([worker])
