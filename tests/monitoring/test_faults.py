"""GPU faults: readings through ingest drain a faulty GPU and flag the pools on it (who is told of it:
test_fault_notifications.py); approvers re-place those pools from the faults page, operators clear the
fault, tenants see a banner."""

from datetime import UTC, datetime, timedelta

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.urls import reverse

from monitoring.collectors import GpuReading, Reading
from monitoring.faults import services as faults
from monitoring.faults import views as fault_views
from monitoring.ingest.readings import ingest
from monitoring.models import FaultNotice, GpuEvent, GpuFault
from monitoring.task_names import EVALUATE_ALERTS
from pools.models import Allocation, GpuCapacity, NodeCapacity, Pool, PoolRequest
from pools.services import (
    admit_waiting,
    approve_request,
    release_pool,
    set_gpu_drained,
    submit_request,
)
from portal.dispatch import Send
from portal.errors import Conflict, NotAllowed
from tests.pools.test_replacement import active_pool

FLEET = [
    ("h100", 1, "H100-80GB", [None] * 8),
    ("h200", 1, "H200-141GB", [{"1g.18gb": 7}, {"3g.71gb": 2}, *[None] * 6]),
]


@pytest.fixture
def fleet(synced):
    return synced(FLEET)


def gpu_of(pool) -> GpuCapacity:
    (gpu,) = {
        a.gpu for a in Allocation.objects.filter(pool=pool, released_at=None).select_related("gpu__node")
    }
    return gpu


def report(node_name: str, *, seconds: int = 0, omit=(), **figures) -> Reading:
    """What the node's agent pushes: every GPU of the node but `omit`; `figures` for GPU `gN`."""
    node = NodeCapacity.objects.get(name=node_name)
    gpus = tuple(
        GpuReading(gpu.index, gpu.uuid, **{"ecc_uncorrected": 0, **figures.get(f"g{gpu.index}", {})})
        for gpu in node.gpus.order_by("index")
        if gpu.index not in omit
    )
    return Reading(node_name, datetime.now(UTC).replace(microsecond=0) + timedelta(seconds=seconds), gpus)


def push(cluster, reading: Reading):
    return ingest(cluster=cluster, readings=[reading], source="agent")


def told_later(callbacks) -> list[Send]:
    """The alert evaluations sent for, which tell of the new faults."""
    return [c for c in callbacks if isinstance(c, Send) and c.task == EVALUATE_ALERTS]


def test_an_uncorrected_ecc_error_drains_the_gpu_and_flags_its_pool_once(
    fleet, tenancy, approver, django_capture_on_commit_callbacks
):
    pool = active_pool(tenancy.vision, tenancy.acme_member, approver, [("h100-80gb.full", 1)])
    gpu = gpu_of(pool)
    push(fleet, report("h100-1"))  # the count the GPU starts from
    with django_capture_on_commit_callbacks() as callbacks:
        push(fleet, report("h100-1", seconds=15, **{f"g{gpu.index}": {"ecc_uncorrected": 2}}))

    gpu.refresh_from_db()
    assert gpu.drained and not gpu.schedulable
    assert GpuCapacity.objects.filter(drained=True).count() == 1
    fault = GpuFault.objects.get()
    assert (fault.gpu, fault.kind, fault.code, fault.drained_by_portal) == (gpu, "ecc", 2, True)
    assert list(FaultNotice.objects.values_list("fault", "pool")) == [(fault.pk, pool.pk)]
    assert fault.notified_at is None and told_later(callbacks) == [Send(EVALUATE_ALERTS)]

    with django_capture_on_commit_callbacks() as callbacks:  # the GPU keeps failing: nothing new
        push(
            fleet,
            report("h100-1", seconds=30, **{f"g{gpu.index}": {"ecc_uncorrected": 5, "xid_events": (79,)}}),
        )
    assert GpuEvent.objects.filter(gpu=gpu, kind__in=["ecc", "xid"]).count() == 3
    assert GpuFault.objects.count() == 1 and FaultNotice.objects.count() == 1
    assert told_later(callbacks) == []


def test_a_fault_that_flags_no_pool_has_nobody_to_tell_but_its_alert(
    fleet, django_capture_on_commit_callbacks
):
    with django_capture_on_commit_callbacks() as callbacks:
        push(fleet, report("h100-1", g3={"ecc_uncorrected": 1}))
    fault = GpuFault.objects.get()
    assert fault.notified_at is not None and not fault.notices.exists()
    assert told_later(callbacks) == []


def test_a_gpu_gone_from_its_hosts_reading_is_a_fault_too(fleet, tenancy, approver):
    pool = active_pool(tenancy.vision, tenancy.acme_member, approver, [("h100-80gb.full", 1)])
    gpu = gpu_of(pool)
    push(fleet, report("h100-1"))
    push(fleet, report("h100-1", seconds=15, omit=(gpu.index,)))

    fault = GpuFault.objects.get()
    assert (fault.gpu, fault.kind) == (gpu, "lost")
    assert GpuCapacity.objects.get(pk=gpu.pk).drained
    assert FaultNotice.objects.get().pool == pool
    push(fleet, report("h100-1", seconds=30, omit=(gpu.index,)))  # still gone: the same fault
    assert GpuFault.objects.count() == 1


@pytest.mark.parametrize(("xid", "fatal"), [(13, False), (31, False), (79, True), (48, True)])
def test_only_fatal_xids_are_faults(xid, fatal, fleet):
    push(fleet, report("h100-1", g2={"xid_events": (xid,)}))
    assert GpuFault.objects.exists() == fatal
    assert GpuCapacity.objects.get(node__name="h100-1", index=2).drained == fatal


def test_the_queue_places_nothing_new_on_a_faulty_gpu_until_an_operator_clears_it(
    fleet, tenancy, approver, staff_user
):
    active_pool(tenancy.vision, tenancy.acme_member, approver, [("h100-80gb.full", 1)])
    idle = GpuCapacity.objects.filter(node__name="h100-1", allocations=None).order_by("index").first()
    push(fleet, report("h100-1", **{f"g{idle.index}": {"ecc_uncorrected": 1}}))
    assert GpuFault.objects.get().gpu == idle

    request = submit_request(project=tenancy.vision, user=tenancy.acme_member, items=[("h100-80gb.full", 7)])
    approve_request(request_id=request.pk, approver=approver)
    admit_waiting()
    request.refresh_from_db()
    assert request.state == "queued" and "H100-80GB" in request.waiting_reason  # 6 healthy GPUs are free
    smaller = submit_request(project=tenancy.vision, user=tenancy.acme_member, items=[("h100-80gb.full", 6)])
    approve_request(request_id=smaller.pk, approver=approver)
    admit_waiting()
    placed = Pool.objects.get(request=smaller)
    assert placed.allocations.count() == 6 and not placed.allocations.filter(gpu=idle).exists()

    with pytest.raises(NotAllowed):
        faults.clear_fault(fault=GpuFault.objects.get(), user=approver)
    cleared = faults.clear_fault(fault=GpuFault.objects.get(), user=staff_user("operator"))
    assert cleared.cleared_at and not GpuCapacity.objects.get(pk=idle.pk).drained
    with pytest.raises(Conflict):
        faults.clear_fault(fault=cleared, user=staff_user("operator"))
    release_pool(pool_id=placed.pk, user=tenancy.acme_member)  # capacity back: the big one fits now
    admit_waiting()
    assert PoolRequest.objects.get(pk=request.pk).state == "fulfilled"


def test_an_operators_own_drain_outlives_the_fault(fleet, staff_user):
    gpu = GpuCapacity.objects.get(node__name="h100-1", index=3)
    set_gpu_drained(gpu=gpu, drained=True)
    push(fleet, report("h100-1", g3={"ecc_uncorrected": 1}))
    fault = GpuFault.objects.get()
    assert not fault.drained_by_portal
    faults.clear_fault(fault=fault, user=staff_user("operator"))
    assert GpuCapacity.objects.get(pk=gpu.pk).drained
    push(fleet, report("h100-1", seconds=15, g3={"ecc_uncorrected": 2}))  # a new error, a new fault
    assert GpuFault.objects.open().count() == 1 and GpuFault.objects.count() == 2


def test_the_approver_re_places_from_the_faults_page_and_the_tenant_sees_the_banner(
    fleet, tenancy, approver, client
):
    pool = active_pool(tenancy.vision, tenancy.acme_member, approver, [("h100-80gb.full", 1)])
    elsewhere = active_pool(tenancy.vision, tenancy.acme_member, approver, [("h200-141gb.full", 1)])
    gpu = gpu_of(pool)
    push(fleet, report("h100-1", **{f"g{gpu.index}": {"ecc_uncorrected": 1}}))
    banner = "runs on a faulty GPU"

    client.force_login(tenancy.acme_member)
    assert (
        banner in client.get(reverse("pool", kwargs={"tenant_slug": "acme", "pk": pool.pk})).content.decode()
    )
    assert (
        banner
        not in client.get(
            reverse("pool", kwargs={"tenant_slug": "acme", "pk": elsewhere.pk})
        ).content.decode()
    )

    client.force_login(approver)
    page = client.get(reverse("monitoring-faults")).content.decode()
    assert f"#{pool.pk}" in page and "Fits now" in page and f"#{elsewhere.pk}" not in page
    assert "Clear the fault" not in page  # operators clear faults
    response = client.post(reverse("monitoring-fault-replace", kwargs={"pk": pool.pk}), follow=True)
    assert response.status_code == 200 and "is re-placed" in response.content.decode()
    moved = gpu_of(pool)
    assert moved != gpu and moved.schedulable

    client.force_login(tenancy.acme_member)
    page = client.get(reverse("pool", kwargs={"tenant_slug": "acme", "pk": pool.pk})).content.decode()
    assert banner not in page and "Re-placed off GPUs" in page  # the move is on the pool's timeline


def test_a_re_place_without_room_says_why_and_changes_nothing(fleet, tenancy, approver, client):
    pool = active_pool(tenancy.vision, tenancy.acme_member, approver, [("h100-80gb.full", 8)])
    push(fleet, report("h100-1", g0={"ecc_uncorrected": 1}))
    before = sorted(Allocation.objects.values_list("pk", "gpu_id", "released_at"))
    client.force_login(approver)
    page = client.get(reverse("monitoring-faults")).content.decode()
    assert "No room to re-place" in page
    response = client.post(reverse("monitoring-fault-replace", kwargs={"pk": pool.pk}), follow=True)
    assert "No room to re-place" in response.content.decode()
    assert sorted(Allocation.objects.values_list("pk", "gpu_id", "released_at")) == before


@pytest.mark.parametrize("who", ["acme_admin", "globex_member", "outsider", "finance", "operator"])
def test_others_do_not_find_the_faults_page_or_its_actions(who, fleet, tenancy, approver, staff_user, client):
    pool = active_pool(tenancy.vision, tenancy.acme_member, approver, [("h100-80gb.full", 1)])
    gpu = gpu_of(pool)
    push(fleet, report("h100-1", **{f"g{gpu.index}": {"ecc_uncorrected": 1}}))
    fault = GpuFault.objects.get()
    user = staff_user(who) if who in ("finance", "operator") else getattr(tenancy, who)
    client.force_login(user)
    listed = client.get(reverse("monitoring-faults"))
    replaced = client.post(reverse("monitoring-fault-replace", kwargs={"pk": pool.pk}))
    assert gpu_of(pool) == gpu
    assert replaced.status_code == 404
    cleared = client.post(reverse("monitoring-fault-clear", kwargs={"pk": fault.pk}))
    if who == "operator":  # operators see the faults and clear them, but re-placing is for approvers
        assert listed.status_code == 200 and "Clear the fault" in listed.content.decode()
        assert "Re-place</button>" not in listed.content.decode()
        assert cleared.status_code == 302 and not GpuFault.objects.open().exists()
    else:
        assert (listed.status_code, cleared.status_code) == (404, 404)
        assert GpuFault.objects.open().exists()


def test_approvers_cannot_clear_and_the_page_needs_a_post(fleet, tenancy, approver, client):
    pool = active_pool(tenancy.vision, tenancy.acme_member, approver, [("h100-80gb.full", 1)])
    push(fleet, report("h100-1", **{f"g{gpu_of(pool).index}": {"ecc_uncorrected": 1}}))
    client.force_login(approver)
    assert (
        client.post(reverse("monitoring-fault-clear", kwargs={"pk": GpuFault.objects.get().pk})).status_code
        == 404
    )
    assert client.get(reverse("monitoring-fault-replace", kwargs={"pk": pool.pk})).status_code == 405


def test_the_faults_page_reads_in_the_same_number_of_queries_for_more_faults(
    fleet, tenancy, approver, client
):
    client.force_login(approver)

    def queries() -> int:
        with CaptureQueriesContext(connection) as captured:
            assert client.get(reverse("monitoring-faults")).status_code == 200
        return len(captured)

    pools = [
        active_pool(tenancy.vision, tenancy.acme_member, approver, [("h100-80gb.full", 1)]) for _n in range(3)
    ]
    push(fleet, report("h100-1", **{f"g{gpu_of(pools[0]).index}": {"ecc_uncorrected": 1}}))
    one = queries()
    push(
        fleet,
        report("h100-1", seconds=15, **{f"g{gpu_of(p).index}": {"ecc_uncorrected": 1} for p in pools[1:]}),
    )
    assert GpuFault.objects.count() == 3
    assert queries() == one


def test_the_faults_page_shows_a_page_of_faults_at_a_time(fleet, approver, client, monkeypatch):
    monkeypatch.setattr(fault_views, "FAULTS_PER_PAGE", 2)
    node = NodeCapacity.objects.get(name="h100-1")
    push(fleet, report("h100-1", **{f"g{gpu.index}": {"ecc_uncorrected": 1} for gpu in node.gpus.all()[:3]}))
    client.force_login(approver)

    first = client.get(reverse("monitoring-faults")).content.decode()
    second = client.get(reverse("monitoring-faults"), {"page": 2}).content.decode()

    assert GpuFault.objects.count() == 3
    assert first.count('class="card fault"') == 2 and second.count('class="card fault"') == 1
    assert "Page 1 of 2" in first
