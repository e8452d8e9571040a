"""Pools that end, are extended, grow and shrink: end dates asked and shortened, reminders before the end,
the release at the end with billing stopping exactly there (however late the sweeper runs), extensions
through the approval path, resizes on the simulated fleet, each allocation billed for exactly its time.

The clock is the one each service is given (`now=`): the sweeper's steps and metering run at chosen
moments, as they would run late or on time."""

from datetime import timedelta

import pytest
from django.core import mail
from django.utils import timezone

from billing.metering import whole_seconds
from billing.models import UsageRecord
from billing.services import meter
from pools.models import (
    Allocation,
    Pool,
    PoolEvent,
    PoolItem,
    PoolRequest,
    PoolState,
    RequestKind,
    RequestState,
    TenantPolicy,
)
from pools.notifications import send_event_email
from pools.services import (
    admit_waiting,
    approve_request,
    reject_request,
    release_pool,
    request_extension,
    request_growth,
    shrink_pool,
    submit_request,
)
from pools.services.lifecycle import release_ended, send_reminders
from pools.services.provisioning import DONE
from pools.services.replacement import settle_move
from pools.task_names import EVENT_EMAIL
from portal.dispatch import Send
from portal.errors import Conflict, InvalidInput, NotAllowed

from .conftest import active_pool

DAY = timedelta(days=1)
H100 = "h100-80gb.full"


def _quota(fleet) -> dict:
    fleet.simulation.refresh_from_db()
    return fleet.simulation.state["quotas"].get("acme-vision", {})


def _billed(pool) -> int:
    return sum(UsageRecord.objects.filter(pool=pool).values_list("seconds", flat=True))


def _metered_past(moment):
    """Meter every period that ended by `moment` plus a day: nothing later changes what it wrote."""
    meter(now=moment + DAY)


def test_an_end_date_is_kept_and_the_pool_is_released_at_it_billing_to_the_second(
    fleet, tenancy, approver, mailoutbox, django_capture_on_commit_callbacks
):
    end = (timezone.now() + 8 * DAY).replace(microsecond=0)
    pool = active_pool(tenancy.vision, tenancy.acme_member, approver, [(H100, 2)], end_at=end)
    assert pool.end_at == end and pool.request.end_at == end

    # Reminders: 7, 2 and 1 days before, each once; nothing before the first.
    assert send_reminders(now=end - 7 * DAY - timedelta(minutes=1)) == []
    for lead in (7, 2, 1):
        with django_capture_on_commit_callbacks() as callbacks:
            assert send_reminders(now=end - lead * DAY + timedelta(minutes=1)) == [pool.pk]
        for send in callbacks:
            if isinstance(send, Send) and send.task == EVENT_EMAIL:
                send_event_email(*send.args)
        assert send_reminders(now=end - lead * DAY + timedelta(minutes=2)) == []
    reminders = PoolEvent.objects.filter(pool=pool, reason_data__template__startswith="ends on")
    assert reminders.count() == 3
    told = [m for m in mail.outbox if f"pool #{pool.pk} ends on" in m.subject]
    assert [m.to for m in told] == [["alice@example.com"]] * 3

    # The sweeper runs three hours late (the workers were down): the pool is still billed only to its end.
    late = end + timedelta(hours=3)
    _metered_past(end - DAY)  # metering ran up to a day before the end, on time
    assert release_ended(now=late) == [pool.pk]
    pool.refresh_from_db()
    assert pool.state == PoolState.RELEASING and pool.released_at == end
    assert pool.billing_ended_at == end
    assert set(Allocation.objects.filter(pool=pool).values_list("released_at", flat=True)) == {end}
    _metered_past(late)
    assert _billed(pool) == 2 * (whole_seconds(end) - whole_seconds(pool.reserved_at))
    assert release_ended(now=late) == []  # a second sweep finds nothing


def test_billing_stops_at_the_end_even_while_the_pool_is_not_released_yet(fleet, tenancy, approver):
    end = (timezone.now() + timedelta(hours=2)).replace(microsecond=0)
    pool = active_pool(tenancy.vision, tenancy.acme_member, approver, [(H100, 1)], end_at=end)
    _metered_past(end + timedelta(hours=6))  # metering runs, the sweeper does not
    pool.refresh_from_db()
    assert pool.state == PoolState.ACTIVE and pool.released_at is None
    assert _billed(pool) == whole_seconds(end) - whole_seconds(pool.reserved_at)


def test_a_duration_counts_from_admission_and_a_pool_without_end_lives_on(fleet, tenancy, approver):
    timed = active_pool(tenancy.vision, tenancy.acme_member, approver, [(H100, 1)], hold_seconds=5 * 3600)
    assert timed.end_at == timed.reserved_at + timedelta(hours=5)
    endless = active_pool(tenancy.vision, tenancy.acme_member, approver, [(H100, 1)])
    assert endless.end_at is None and endless.billing_ended_at is None
    assert release_ended(now=timezone.now() + 3650 * DAY) == [timed.pk]
    endless.refresh_from_db()
    assert endless.state == PoolState.ACTIVE


@pytest.mark.parametrize(
    ("end", "message"),
    [
        ({"end_at": "past"}, "must be in the future"),
        ({"end_at": "far"}, "at most 72 hours"),
        ({"hold_seconds": 73 * 3600}, "at most 72 hours"),
        ({}, "requires an end for every pool"),
        ({"end_at": "soon", "hold_seconds": 3600}, "not both"),
        ({"hold_seconds": 0}, "above zero"),
    ],
)
def test_an_end_the_tenant_does_not_allow_is_refused_and_nothing_is_filed(fleet, tenancy, end, message):
    TenantPolicy.objects.create(tenant=tenancy.acme, max_duration_hours=72)
    now = timezone.now()
    moments = {"past": now - timedelta(minutes=1), "far": now + 4 * DAY, "soon": now + DAY}
    given = {key: moments.get(value, value) for key, value in end.items()}
    with pytest.raises(InvalidInput, match=message):
        submit_request(project=tenancy.vision, user=tenancy.acme_member, items=[(H100, 1)], **given)
    assert not PoolRequest.objects.exists()


def test_an_approver_may_shorten_the_end_never_lengthen_it(fleet, tenancy, approver):
    asked = (timezone.now() + 10 * DAY).replace(microsecond=0)
    request = submit_request(
        project=tenancy.vision, user=tenancy.acme_member, items=[(H100, 1)], end_at=asked
    )
    with pytest.raises(InvalidInput, match="not move it later"):
        approve_request(request_id=request.pk, approver=approver, end_at=asked + DAY)
    request.refresh_from_db()
    assert request.state == RequestState.SUBMITTED and request.end_at == asked

    shorter = asked - 3 * DAY
    approve_request(request_id=request.pk, approver=approver, end_at=shorter)
    request.refresh_from_db()
    assert request.end_at == shorter
    event = request.events.get(to_state=RequestState.APPROVED)
    assert event.actor == approver and "set the end" in event.reason
    admit_waiting()
    assert Pool.objects.get(request=request).end_at == shorter


def test_an_extension_goes_to_approvers_moves_the_end_and_starts_the_reminders_again(
    fleet, tenancy, approver
):
    end = (timezone.now() + 3 * DAY).replace(microsecond=0)
    pool = active_pool(tenancy.vision, tenancy.acme_member, approver, [(H100, 1)], end_at=end)
    send_reminders(now=end - 2 * DAY + timedelta(minutes=1))
    pool.refresh_from_db()
    assert pool.reminders_sent

    refused = request_extension(pool_id=pool.pk, user=tenancy.acme_member, end_at=end + 5 * DAY)
    assert (refused.kind, refused.target_pool_id, refused.state) == (
        RequestKind.EXTENSION,
        pool.pk,
        RequestState.SUBMITTED,
    )
    reject_request(request_id=refused.pk, approver=approver, reason="not this month")
    pool.refresh_from_db()
    assert pool.end_at == end  # a refused extension leaves the end as it was

    asked = request_extension(pool_id=pool.pk, user=tenancy.acme_admin, end_at=end + 7 * DAY)
    approve_request(request_id=asked.pk, approver=approver)
    asked.refresh_from_db()
    pool.refresh_from_db()
    assert asked.state == RequestState.FULFILLED
    assert pool.end_at == end + 7 * DAY and pool.reminders_sent == []
    assert PoolEvent.objects.filter(pool=pool, reason__contains="extension #").exists()
    assert send_reminders(now=end + 5 * DAY + timedelta(minutes=1)) == [pool.pk]


def test_extensions_that_cannot_be_are_refused_and_change_nothing(fleet, tenancy, approver):
    end = (timezone.now() + 2 * DAY).replace(microsecond=0)
    pool = active_pool(tenancy.vision, tenancy.acme_member, approver, [(H100, 1)], end_at=end)
    endless = active_pool(tenancy.vision, tenancy.acme_member, approver, [(H100, 1)])
    with pytest.raises(InvalidInput, match="after the pool's present end"):
        request_extension(pool_id=pool.pk, user=tenancy.acme_member, end_at=end - DAY)
    with pytest.raises(Conflict, match="no end date"):
        request_extension(pool_id=endless.pk, user=tenancy.acme_member, end_at=end)
    with pytest.raises(NotAllowed):
        request_extension(pool_id=pool.pk, user=tenancy.globex_member, end_at=end + DAY)
    pending = request_extension(pool_id=pool.pk, user=tenancy.acme_member, end_at=end + DAY)

    release_ended(now=end + timedelta(seconds=1))  # the end came first
    pending.refresh_from_db()
    assert pending.state == RequestState.CANCELLED  # nothing left to extend
    with pytest.raises(Conflict, match="only a pool in use"):
        request_extension(pool_id=pool.pk, user=tenancy.acme_member, end_at=end + 3 * DAY)
    assert PoolRequest.objects.filter(kind=RequestKind.EXTENSION).count() == 1


def test_a_pool_grows_in_place_and_shrinks_quota_first_each_allocation_billed_its_own_time(
    fleet, tenancy, approver
):
    pool = active_pool(tenancy.vision, tenancy.acme_member, approver, [(H100, 1)])
    assert _quota(fleet) == {"nvidia.com/gpu": 1}

    growth = request_growth(pool_id=pool.pk, user=tenancy.acme_member, items=[(H100, 2)])
    assert (growth.kind, growth.target_pool_id, growth.cluster_id) == (RequestKind.RESIZE, pool.pk, fleet.pk)
    approve_request(request_id=growth.pk, approver=approver)
    admit_waiting()
    growth.refresh_from_db()
    assert growth.state == RequestState.FULFILLED
    assert not Pool.objects.filter(request=growth).exists()  # no new pool: the same one grew
    for _step in range(5):
        if settle_move(pool_id=pool.pk) == DONE:
            break
    live = list(Allocation.objects.filter(pool=pool, released_at=None).order_by("pk"))
    assert len(live) == 3 and _quota(fleet) == {"nvidia.com/gpu": 3}
    assert list(PoolItem.objects.filter(pool=pool).values_list("count", flat=True)) == [3]

    shrink_pool(pool_id=pool.pk, user=tenancy.acme_member, allocation_ids=[live[0].pk])
    assert _quota(fleet) == {"nvidia.com/gpu": 2}
    assert list(PoolItem.objects.filter(pool=pool).values_list("count", flat=True)) == [2]
    release_pool(pool_id=pool.pk, user=tenancy.acme_member)

    pool.refresh_from_db()
    _metered_past(pool.released_at)
    exact = sum(
        whole_seconds(a.released_at) - whole_seconds(a.allocated_at)
        for a in Allocation.objects.filter(pool=pool)
    )
    assert _billed(pool) == exact
    # Each allocation lies within the pool's life, the grown ones from their own later reservation.
    spans = sorted((a.allocated_at, a.released_at) for a in Allocation.objects.filter(pool=pool))
    assert all(pool.reserved_at <= start and end <= pool.released_at for start, end in spans)
    assert len(spans) == 3 and spans[0][0] < spans[1][0]


def test_a_shrink_the_cluster_refuses_gives_nothing_back(fleet, tenancy, approver):
    from pools.drivers.simulated import SimulatedDriver

    pool = active_pool(tenancy.vision, tenancy.acme_member, approver, [(H100, 2)])
    SimulatedDriver(fleet).set_reachable(False)
    with pytest.raises(Conflict, match="nothing was given back"):
        shrink_pool(pool_id=pool.pk, user=tenancy.acme_member, release=[(H100, 1)])
    assert Allocation.objects.filter(pool=pool, released_at=None).count() == 2


def test_bad_resizes_are_refused_and_change_nothing(fleet, tenancy, approver):
    pool = active_pool(tenancy.vision, tenancy.acme_member, approver, [(H100, 2)])
    live = list(Allocation.objects.filter(pool=pool, released_at=None).values_list("pk", flat=True))
    with pytest.raises(InvalidInput, match="release the pool instead"):
        shrink_pool(pool_id=pool.pk, user=tenancy.acme_member, allocation_ids=live)
    with pytest.raises(InvalidInput, match="cannot give back 3"):
        shrink_pool(pool_id=pool.pk, user=tenancy.acme_member, release=[(H100, 3)])
    with pytest.raises(InvalidInput, match="no live allocation"):
        shrink_pool(pool_id=pool.pk, user=tenancy.acme_member, allocation_ids=[live[0] + 10_000])
    with pytest.raises(NotAllowed):
        shrink_pool(pool_id=pool.pk, user=tenancy.globex_member, release=[(H100, 1)])
    with pytest.raises(NotAllowed):
        request_growth(pool_id=pool.pk, user=tenancy.globex_member, items=[(H100, 1)])
    release_pool(pool_id=pool.pk, user=tenancy.acme_member)
    with pytest.raises(Conflict, match="only an active pool can grow"):
        request_growth(pool_id=pool.pk, user=tenancy.acme_member, items=[(H100, 1)])
    assert Allocation.objects.filter(pool=pool, released_at=None).count() == 0
    assert not PoolRequest.objects.filter(kind=RequestKind.RESIZE).exists()


def test_the_portal_gives_back_instances_that_free_whole_gpus_first(fleet, tenancy, approver):
    pool = active_pool(tenancy.vision, tenancy.acme_member, approver, [("h200-141gb.mig-1g.18gb", 3)])
    other = active_pool(tenancy.vision, tenancy.acme_member, approver, [("h200-141gb.mig-1g.18gb", 4)])
    # Where another pool shares a GPU with this one, that GPU cannot come free: the portal takes elsewhere.
    shared = {a.gpu_id for a in Allocation.objects.filter(pool=other, released_at=None)}
    shrink_pool(pool_id=pool.pk, user=tenancy.acme_member, release=[("h200-141gb.mig-1g.18gb", 1)])
    (given,) = Allocation.objects.filter(pool=pool, released_at__isnull=False)
    mine = Allocation.objects.filter(pool=pool).values_list("gpu_id", flat=True)
    if set(mine) - shared:
        assert given.gpu_id not in shared


def local(moment) -> str:
    """A moment as a datetime-local field sends it: the reader's wall clock."""
    return timezone.localtime(moment).strftime("%Y-%m-%dT%H:%M")


def test_the_pool_page_shows_the_end_and_its_changes_and_takes_them(fleet, tenancy, approver, client):
    end = (timezone.now() + 10 * DAY).replace(microsecond=0)
    pool = active_pool(tenancy.vision, tenancy.acme_member, approver, [(H100, 2)], end_at=end)
    page = f"/t/acme/pools/{pool.pk}/"

    client.force_login(tenancy.acme_viewer)  # sees the end, may change nothing
    shown = client.get(page).content.decode()
    assert (
        end.strftime("%Y-%m-%d") in shown
        and 'id="extend-form"' not in shown
        and 'id="grow-form"' not in shown
    )

    client.force_login(tenancy.acme_member)
    shown = client.get(page).content.decode()
    assert 'id="extend-form"' in shown and 'id="grow-form"' in shown and 'id="shrink-form"' in shown
    refused = client.post(f"{page}extend/", {"end_at": local(end - DAY)})
    assert refused.status_code == 400 and "after the pool&#x27;s present end" in refused.content.decode()
    asked = client.post(f"{page}extend/", {"end_at": local(end + DAY)})
    assert asked.status_code == 302
    assert client.post(f"{page}grow/", {"spec": H100, "count": 1}).status_code == 302
    one = Allocation.objects.filter(pool=pool, released_at=None).first()
    assert client.post(f"{page}shrink/", {"allocation": [one.pk]}).status_code == 302
    assert Allocation.objects.filter(pool=pool, released_at=None).count() == 1

    shown = client.get(page).content.decode()
    kinds = list(pool.changes.values_list("kind", flat=True).order_by("pk"))
    assert kinds == [RequestKind.EXTENSION, RequestKind.RESIZE]
    assert all(f"#{change.pk}" in shown for change in pool.changes.all())


def test_an_extension_within_the_guarantee_is_approved_by_the_policy_and_the_page_says_so(
    fleet, tenancy, approver, client
):
    from pools.services.quotas import set_auto_approve, set_quota

    end = (timezone.now() + 3 * DAY).replace(microsecond=0)
    pool = active_pool(tenancy.vision, tenancy.acme_member, approver, [(H100, 1)], end_at=end)
    set_quota(actor=approver, tenant=tenancy.acme, gpu_model="H100-80GB", guaranteed=56, limit=None)
    set_auto_approve(actor=approver, tenant=tenancy.acme, on=True)
    client.force_login(tenancy.acme_member)
    answer = client.post(f"/t/acme/pools/{pool.pk}/extend/", {"end_at": local(end + DAY)}, follow=True)
    assert "approved by the policy" in answer.content.decode()
    pool.refresh_from_db()
    assert pool.end_at == end + DAY - timedelta(seconds=end.second)
    (extension,) = pool.changes.all()
    assert extension.state == RequestState.FULFILLED and extension.decided_by is None
