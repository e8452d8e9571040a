"""Reclaim: a request within its tenant's guarantee that does not fit takes back borrowed pools, with notice;
released at the deadline (billing stopping there), the request admitted in the next queue run; called off
where the request goes another way first. A pool within its guarantee is never reclaimed."""

from datetime import timedelta

import pytest
from django.core import mail

from pools.models import Allocation, Pool, PoolRequest, PoolState, RequestState
from pools.services import admit_waiting, approve_request, cancel_request, reject_request, submit_request
from pools.services.deadlines import release_reclaimed, sweep_stuck_pools
from pools.services.provisioning import DONE, provision_step
from pools.services.quotas import set_quota
from portal import dispatch

H100 = "H100-80GB"  # the small fleet's 8 whole H100s: 56 compute slices


@pytest.fixture
def split(fleet, tenancy, operator, approver, settings):
    """Acme and Globex each guaranteed half the H100s; Globex may borrow the other half, and holds all 8:
    two pools of 4, the second borrowed."""
    settings.RECLAIM_NOTICE_SECONDS = 900
    set_quota(actor=operator, tenant=tenancy.acme, gpu_model=H100, guaranteed=28, limit=28)
    set_quota(actor=operator, tenant=tenancy.globex, gpu_model=H100, guaranteed=28, limit=56)
    held = [admitted(tenancy.recsys, tenancy.globex_member, approver, 4) for _ in range(2)]
    return held


def admitted(project, person, approver, count, priority=0) -> Pool:
    request = submit_request(project=project, user=person, items=[("h100-80gb.full", count)])
    approve_request(request_id=request.pk, approver=approver, priority=priority)
    admit_waiting()
    pool = Pool.objects.get(request=request)
    assert provision_step(pool_id=pool.pk) == DONE  # active: only a pool in use is reclaimed
    return pool


def ask(tenancy, approver, count=2) -> PoolRequest:
    request = submit_request(
        project=tenancy.vision, user=tenancy.acme_member, items=[("h100-80gb.full", count)]
    )
    approve_request(request_id=request.pk, approver=approver)
    return request


def test_a_guaranteed_request_reclaims_a_borrowed_pool_with_notice(
    split, tenancy, approver, django_capture_on_commit_callbacks
):
    within, borrowed = split
    request = ask(tenancy, approver)
    assert request.quota_verdict == "within"
    with django_capture_on_commit_callbacks() as sent:
        admit_waiting()
    assert dispatch.Send("pools.tasks.release_reclaimed_pools", (), 900) in sent  # for the notice's end
    borrowed.refresh_from_db()
    within.refresh_from_db()
    assert (within.state, borrowed.state) == (PoolState.ACTIVE, PoolState.RECLAIMING)
    assert borrowed.reclaimed_for_id == request.pk
    assert timedelta(seconds=899) < borrowed.reclaim_at - borrowed.events.last().at <= timedelta(seconds=900)
    request.refresh_from_db()
    assert request.state == RequestState.QUEUED and "reclaimed for it" in request.waiting_reason
    # Another run chooses nothing more, and the pool stays usable until its notice ends.
    admit_waiting()
    assert Pool.objects.filter(state=PoolState.RECLAIMING).count() == 1
    assert release_reclaimed(now=borrowed.reclaim_at - timedelta(seconds=1)) == []
    assert release_reclaimed(now=borrowed.reclaim_at) == [borrowed.pk]
    borrowed.refresh_from_db()
    assert (
        borrowed.state == PoolState.RELEASING and borrowed.released_at == borrowed.reclaim_at
    )  # billing stops
    assert set(Allocation.objects.filter(pool=borrowed).values_list("released_at", flat=True)) == {
        borrowed.reclaim_at
    }
    assert "notice ended" in borrowed.events.get(to_state=PoolState.RELEASING).reason
    admit_waiting()  # the run the release sends
    request.refresh_from_db()
    assert request.state == RequestState.FULFILLED
    assert release_reclaimed(now=borrowed.reclaim_at + timedelta(hours=1)) == []  # done once


def test_the_notice_is_e_mailed_and_the_sweeper_releases_what_is_due(split, tenancy, approver):
    _within, borrowed = split
    ask(tenancy, approver)
    admit_waiting()
    borrowed.refresh_from_db()
    from pools.notifications import send_event_email

    event = borrowed.events.get(to_state=PoolState.RECLAIMING)
    mail.outbox.clear()
    assert send_event_email(event.pk) == "sent"
    (message,) = mail.outbox
    assert f"pool #{borrowed.pk}" in message.subject and "reclaimed" in message.subject
    assert borrowed.reclaim_at.strftime("%Y-%m-%d %H:%M") in message.body
    assert "asked again" in message.body  # RECLAIM_REQUEUE: its request comes back to the queue
    report = sweep_stuck_pools(now=borrowed.reclaim_at + timedelta(seconds=30))
    assert report.reclaimed == [borrowed.pk]
    borrowed.refresh_from_db()
    assert borrowed.released_at == borrowed.reclaim_at


@pytest.mark.parametrize("requeue", [True, False])
def test_a_pool_released_at_its_notice_s_end_has_its_request_asked_again(
    split, tenancy, approver, settings, client, requeue
):
    settings.RECLAIM_REQUEUE = requeue
    _within, borrowed = split
    original = PoolRequest.objects.get(pk=borrowed.request_id)
    PoolRequest.objects.filter(pk=original.pk).update(priority=5, justification="nightly training")
    request = ask(tenancy, approver)
    admit_waiting()
    release_reclaimed(now=Pool.objects.get(pk=borrowed.pk).reclaim_at)
    again = PoolRequest.objects.filter(asked_again_for=borrowed).first()
    if not requeue:
        assert again is None
        return
    assert (again.state, again.project, again.submitted_by, again.priority) == (
        RequestState.APPROVED,
        original.project,
        original.submitted_by,
        5,
    )
    assert again.justification == "nightly training" and again.decided_by is None
    assert [(i.gpu_model, i.profile, i.count) for i in again.items.all()] == [(H100, "full", 4)]
    assert again.quota_verdict == "borrowed"  # Globex holds its guarantee with the other pool
    assert f"pool #{borrowed.pk}" in again.events.get(to_state=RequestState.APPROVED).reason
    admit_waiting()  # the capacity freed is the reclaiming request's; the one asked again waits for room
    assert PoolRequest.objects.get(pk=request.pk).state == RequestState.FULFILLED
    assert PoolRequest.objects.get(pk=again.pk).state == RequestState.QUEUED
    client.force_login(tenancy.globex_member)
    page = client.get(f"/t/{tenancy.globex.slug}/pools/{borrowed.pk}/").content.decode()
    assert f"/t/{tenancy.globex.slug}/requests/{again.pk}/" in page
    page = client.get(f"/t/{tenancy.globex.slug}/requests/{again.pk}/").content.decode()
    assert f"/t/{tenancy.globex.slug}/pools/{borrowed.pk}/" in page
    assert client.get(f"/api/v1/pool-requests/{again.pk}/").json()["asked_again_for"] == borrowed.pk


@pytest.mark.parametrize("how", ["cancelled", "rejected", "admitted otherwise"])
def test_a_reclaim_is_called_off_when_its_request_goes_another_way(split, tenancy, approver, how):
    within, borrowed = split
    request = ask(tenancy, approver)
    admit_waiting()
    assert Pool.objects.get(pk=borrowed.pk).state == PoolState.RECLAIMING
    if how == "cancelled":
        cancel_request(request_id=request.pk, user=tenancy.acme_member)
    elif how == "rejected":
        reject_request(request_id=request.pk, approver=approver, reason="not now")
    else:
        from pools.services import release_pool

        release_pool(pool_id=within.pk, user=tenancy.globex_member)  # room comes free another way
        admit_waiting()
        assert PoolRequest.objects.get(pk=request.pk).state == RequestState.FULFILLED
    borrowed.refresh_from_db()
    assert (borrowed.state, borrowed.reclaim_at) == (PoolState.ACTIVE, None)
    assert "called off" in borrowed.events.last().reason


def test_what_a_reclaim_frees_is_held_for_its_request_through_the_notice(
    fleet, tenancy, operator, approver, settings
):
    settings.RECLAIM_NOTICE_SECONDS = 900
    set_quota(actor=operator, tenant=tenancy.acme, gpu_model=H100, guaranteed=28, limit=28)
    set_quota(actor=operator, tenant=tenancy.globex, gpu_model=H100, guaranteed=28, limit=56)
    admitted(tenancy.recsys, tenancy.globex_member, approver, 4)
    borrowed = admitted(tenancy.recsys, tenancy.globex_member, approver, 3)  # one GPU stays free
    request = ask(tenancy, approver, count=4)  # the free GPU and three of the borrowed pool's
    admit_waiting()
    borrowed.refresh_from_db()
    assert borrowed.state == PoolState.RECLAIMING
    later = submit_request(project=tenancy.recsys, user=tenancy.globex_member, items=[("h100-80gb.full", 1)])
    approve_request(request_id=later.pk, approver=approver)  # would take the free GPU during the notice
    admit_waiting()
    later.refresh_from_db()
    assert later.state == RequestState.QUEUED
    assert release_reclaimed(now=borrowed.reclaim_at) == [borrowed.pk]
    admit_waiting()
    request.refresh_from_db()
    later.refresh_from_db()
    assert (request.state, later.state) == (RequestState.FULFILLED, RequestState.QUEUED)
    assert Pool.objects.filter(state=PoolState.RECLAIMING).count() == 0  # nothing reclaimed twice


def test_a_pool_within_its_guarantee_is_never_reclaimed(fleet, tenancy, operator, approver):
    set_quota(actor=operator, tenant=tenancy.acme, gpu_model=H100, guaranteed=28, limit=28)
    set_quota(actor=operator, tenant=tenancy.globex, gpu_model=H100, guaranteed=28, limit=56)
    mine = admitted(tenancy.recsys, tenancy.globex_member, approver, 4)  # within Globex's guarantee
    borrowed = admitted(tenancy.recsys, tenancy.globex_member, approver, 2)  # borrowed: 2 GPUs
    request = ask(tenancy, approver, count=4)  # needs 4; only 2 are free and 2 borrowed
    admit_waiting()
    borrowed.refresh_from_db()
    assert borrowed.state == PoolState.RECLAIMING  # the two free and the two borrowed make four
    assert Pool.objects.get(pk=mine.pk).state == PoolState.ACTIVE
    cancel_request(request_id=request.pk, user=tenancy.acme_member)
    more = submit_request(project=tenancy.vision, user=tenancy.acme_member, items=[("h100-80gb.full", 1)])
    approve_request(request_id=more.pk, approver=approver)
    admit_waiting()  # it fits on a free GPU: nothing is reclaimed for it
    assert not Pool.objects.filter(state=PoolState.RECLAIMING).exists()


def test_victims_are_the_fewest_lowest_priority_most_recent_borrowed_pools(
    fleet, tenancy, operator, approver
):
    set_quota(actor=operator, tenant=tenancy.acme, gpu_model=H100, guaranteed=28, limit=28)
    set_quota(actor=operator, tenant=tenancy.globex, gpu_model=H100, guaranteed=14, limit=56)
    admitted(tenancy.recsys, tenancy.globex_member, approver, 2)  # within
    urgent = admitted(tenancy.recsys, tenancy.globex_member, approver, 2, priority=5)  # borrowed, important
    old = admitted(tenancy.recsys, tenancy.globex_member, approver, 2)  # borrowed
    new = admitted(tenancy.recsys, tenancy.globex_member, approver, 2)  # borrowed, the most recent
    ask(tenancy, approver, count=2)
    admit_waiting()
    reclaiming = set(Pool.objects.filter(state=PoolState.RECLAIMING).values_list("pk", flat=True))
    assert reclaiming == {new.pk}
    assert Pool.objects.get(pk=old.pk).state == Pool.objects.get(pk=urgent.pk).state == PoolState.ACTIVE


def test_a_request_that_would_not_fit_even_with_every_borrowed_pool_gone_says_so(
    fleet, tenancy, operator, approver
):
    set_quota(actor=operator, tenant=tenancy.acme, gpu_model=H100, guaranteed=35, limit=35)
    set_quota(actor=operator, tenant=tenancy.globex, gpu_model=H100, guaranteed=21, limit=56)
    admitted(tenancy.recsys, tenancy.globex_member, approver, 3)  # within Globex's guarantee
    borrowed = admitted(tenancy.recsys, tenancy.globex_member, approver, 2)
    request = ask(tenancy, approver, count=5)  # 3 free and 2 borrowed: fits once they go
    admit_waiting()
    assert Pool.objects.get(pk=borrowed.pk).state == PoolState.RECLAIMING
    cancel_request(request_id=request.pk, user=tenancy.acme_member)
    drain_free_h100s(1)
    too_big = ask(tenancy, approver, count=5)  # one H100 drained: 2 free + 2 borrowed are not five
    admit_waiting()
    too_big.refresh_from_db()
    assert "would not fit even were every borrowed pool released" in too_big.waiting_reason
    assert not Pool.objects.filter(state=PoolState.RECLAIMING).exists()


def drain_free_h100s(count):
    from pools.models import GpuCapacity

    held = Allocation.objects.filter(released_at__isnull=True).values("gpu_id")
    free = GpuCapacity.objects.filter(model=H100).exclude(pk__in=held)
    GpuCapacity.objects.filter(pk__in=list(free.values_list("pk", flat=True)[:count])).update(drained=True)
