"""The queue: approved requests are admitted when they fit, with capacity reserved in the same step."""

from datetime import timedelta

from django.db.backends.postgresql.psycopg_any import NumericRange
from django.utils import timezone

from pools.models import Allocation, Cluster, GpuCapacity, Pool, PoolRequest, RequestState, SpecAndCount
from pools.services import admit_waiting, approve_request, submit_request
from pools.services.inventory import sync_inventory
from tests.factories import ClusterFactory, GpuGroupFactory


def ask(tenancy, items, **kwargs):
    return submit_request(project=tenancy.vision, user=tenancy.acme_member, items=items, **kwargs)


def approve(request, approver, **kwargs):
    return approve_request(request_id=request.pk, approver=approver, **kwargs)


def test_a_request_that_fits_is_admitted_with_its_capacity_reserved(fleet, tenancy, approver):
    request = ask(tenancy, [("h200-141gb.mig-1g.18gb", 2), ("h100-80gb.full", 1)])
    approve(request, approver)
    (result,) = admit_waiting()
    assert result.admitted
    request.refresh_from_db()
    assert request.state == RequestState.FULFILLED and request.waiting_reason == ""
    pool = Pool.objects.get(request=request)
    assert pool.state == "provisioning" and pool.cluster == fleet and pool.reserved_at
    allocations = Allocation.objects.filter(pool=pool)
    assert sorted(a.profile for a in allocations) == ["1g.18gb", "1g.18gb", "full"]
    full = allocations.get(profile="full")
    assert full.slices == NumericRange(0, 8) and full.gpu.node.name == "h100-1"
    small = [a for a in allocations if a.profile == "1g.18gb"]
    assert all(a.slices.upper - a.slices.lower == 1 for a in small)
    assert len({a.gpu_id for a in small}) == 1  # packed on one GPU, free ones kept whole
    allocated = dict(SpecAndCount.objects.filter(allocated__gt=0).values_list("resource_name", "allocated"))
    assert allocated == {"nvidia.com/mig-1g.18gb": 2, "nvidia.com/gpu": 1}
    states = list(request.events.values_list("from_state", "to_state"))
    assert states == [
        ("", "submitted"),
        ("submitted", "approved"),
        ("approved", "fulfilled"),
        ("", "provisioning"),
    ]


def test_a_request_that_does_not_fit_now_waits_with_a_reason(fleet, tenancy, approver):
    request = ask(tenancy, [("h100-80gb.full", 8)])
    approve(request, approver)
    admit_waiting()
    other = ask(tenancy, [("h100-80gb.full", 1)])
    approve(other, approver)
    results = {r.request_id: r for r in admit_waiting()}
    assert not results[other.pk].admitted
    other.refresh_from_db()
    assert other.state == RequestState.QUEUED and other.waiting_reason
    assert "H100-80GB" in other.waiting_reason
    assert list(other.events.values_list("to_state", flat=True))[-1] == "queued"
    admit_waiting()  # again: no new event for the same wait
    assert other.events.filter(to_state="queued").count() == 1


def test_a_new_layout_is_planned_on_a_wholly_free_gpu_and_never_double_booked(fleet, tenancy, approver):
    first = ask(tenancy, [("h200-141gb.mig-4g.71gb", 1)])
    approve(first, approver)
    admit_waiting()
    planned = GpuCapacity.objects.exclude(planned_layout=None)
    assert planned.count() == 1
    gpu = planned.get()
    assert gpu.planned_layout["mig"] and "4g.71gb" in [i["profile"] for i in gpu.planned_layout["instances"]]
    assert not gpu.allocations.exclude(released_at=None).exists()
    second = ask(tenancy, [("h200-141gb.mig-4g.71gb", 1)])
    approve(second, approver)
    admit_waiting()
    gpus = Allocation.objects.filter(profile="4g.71gb").values_list("gpu_id", "slices")
    assert len(gpus) == 2 and len(set(gpus)) == 2


def test_priority_then_approval_time_and_a_starving_request_stops_backfill(
    fleet, tenancy, approver, settings
):
    settings.QUEUE_BACKFILL_GRACE_SECONDS = 3600
    hog = ask(tenancy, [("h100-80gb.full", 6)])
    approve(hog, approver)
    admit_waiting()  # 6 of 8 H100 taken
    big = ask(tenancy, [("h100-80gb.full", 4)])
    approve(big, approver)
    small = ask(tenancy, [("h100-80gb.full", 1)])
    approve(small, approver)
    admit_waiting()
    small.refresh_from_db()
    assert small.state == RequestState.FULFILLED  # backfill while the big one is young

    PoolRequest.objects.filter(pk=big.pk).update(approved_at=timezone.now() - timedelta(hours=2))
    late = ask(tenancy, [("h100-80gb.full", 1)])
    approve(late, approver)
    urgent = ask(tenancy, [("h200-141gb.full", 1)])
    approve(urgent, approver, priority=5)
    admit_waiting()
    late.refresh_from_db()
    urgent.refresh_from_db()
    assert late.state == RequestState.QUEUED and "older request" in late.waiting_reason
    assert urgent.state == RequestState.FULFILLED  # higher priority is not held back

    elsewhere = ask(tenancy, [("h200-141gb.mig-1g.18gb", 1)])  # same priority, another GPU model
    approve(elsewhere, approver)
    admit_waiting()
    elsewhere.refresh_from_db()
    assert elsewhere.state == RequestState.FULFILLED  # it competes for nothing the big one waits for


def test_a_starving_request_holds_back_only_what_competes_for_its_gpus(db, tenancy, staff_user, settings):
    """Same model, same cluster, same group: held back. Another cluster, or another group of a
    cluster with groups: admitted, since it takes nothing the starving request could use."""
    from pools.models import NodeCapacity

    settings.QUEUE_BACKFILL_GRACE_SECONDS = 60
    full = [None] * 8
    a = ClusterFactory(name="a", fleet=[("n", 1, "H100-80GB", full)])
    b = ClusterFactory(name="b", fleet=[("train", 1, "H100-80GB", full), ("serve", 1, "H100-80GB", full)])
    for cluster in (a, b):
        sync_inventory(cluster=cluster)
    for name, node in (("training", "train-1"), ("inference", "serve-1")):
        group = GpuGroupFactory(cluster=b, name=name)
        NodeCapacity.objects.filter(cluster=b, name=node).update(group=group)
    approver = staff_user("approver")

    def asked(count, **where):
        request = ask(tenancy, [("h100-80gb.full", count)], **where)
        approve(request, approver)
        return request

    asked(1, cluster=b, purpose="training")
    admit_waiting()  # one of training's 8 GPUs is taken
    starving = asked(8, cluster=b, purpose="training")  # waits until that one comes back
    admit_waiting()
    PoolRequest.objects.filter(pk=starving.pk).update(approved_at=timezone.now() - timedelta(hours=1))
    same_group = asked(1, cluster=b, purpose="training")
    any_group = asked(1, cluster=b)
    other_group = asked(1, cluster=b, purpose="inference")
    other_cluster = asked(1, cluster=a)
    admit_waiting()
    states = {
        name: PoolRequest.objects.get(pk=r.pk).state
        for name, r in [
            ("same group", same_group),
            ("any group", any_group),
            ("other group", other_group),
            ("other cluster", other_cluster),
        ]
    }
    assert states == {
        "same group": RequestState.QUEUED,
        "any group": RequestState.QUEUED,
        "other group": RequestState.FULFILLED,
        "other cluster": RequestState.FULFILLED,
    }


def test_requests_for_a_cluster_and_a_group_land_there(db, tenancy, staff_user):
    from pools.models import NodeCapacity

    full = [None] * 8
    a = ClusterFactory(name="a", fleet=[("n", 1, "H100-80GB", full)])
    b = ClusterFactory(name="b", fleet=[("train", 1, "H100-80GB", full), ("serve", 1, "H100-80GB", full)])
    for cluster in (a, b):
        sync_inventory(cluster=cluster)
    training = GpuGroupFactory(cluster=b, name="training")
    NodeCapacity.objects.filter(cluster=b, name="train-1").update(group=training)
    approver = staff_user("approver")
    request = submit_request(
        project=tenancy.vision,
        user=tenancy.acme_member,
        items=[("h100-80gb.full", 2)],
        cluster=b,
        purpose="training",
    )
    approve_request(request_id=request.pk, approver=approver)
    admit_waiting()
    nodes = set(Allocation.objects.values_list("gpu__node__name", flat=True))
    assert nodes == {"train-1"}


def test_approvers_see_where_a_request_would_land_before_deciding(fleet, tenancy, client, approver):
    request = ask(tenancy, [("h200-141gb.mig-4g.71gb", 1), ("h100-80gb.full", 1)])
    client.force_login(approver)
    page = client.get(f"/admin/pools/poolrequest/{request.pk}/change/").content.decode()
    assert "Fits now on sim:" in page and "re-partition h200-" in page and "full → h100-1 GPU" in page
    assert not Allocation.objects.exists()  # a preview reserves nothing
    too_big = ask(tenancy, [("h100-80gb.full", 8)])
    ask_more = ask(tenancy, [("h100-80gb.full", 1)])
    approve(too_big, approver)
    admit_waiting()
    page = client.get(f"/admin/pools/poolrequest/{ask_more.pk}/change/").content.decode()
    assert "Does not fit now:" in page


def test_an_instance_reported_at_another_start_is_still_seen_as_held(fleet, tenancy, approver):
    """The cluster may place a planned instance elsewhere; what shares a held slice is never offered."""
    request = ask(tenancy, [("h200-141gb.mig-4g.71gb", 1)])
    approve(request, approver)
    admit_waiting()
    held = Allocation.objects.get()
    gpu = held.gpu
    # the cluster reports the GPU cut differently: a 2g at 2, inside the slices the 4g holds
    GpuCapacity.objects.filter(pk=gpu.pk).update(
        planned_layout=None,
        mig_enabled=True,
        layout=[
            {"profile": "2g.35gb", "start": 2, "uuid": ""},
            {"profile": "3g.71gb", "start": 4, "uuid": ""},
        ],
    )
    other = ask(tenancy, [("h200-141gb.mig-2g.35gb", 1)])
    approve(other, approver)
    admit_waiting()
    taken = Allocation.objects.filter(gpu=gpu, released_at=None).values_list("slices", flat=True)
    assert all(not (a.lower < b.upper and b.lower < a.upper) for a in taken for b in taken if a != b)


def test_the_reason_a_request_waits_is_shown_in_the_readers_language(
    fleet, tenancy, approver, client, api_for
):
    hog = ask(tenancy, [("h100-80gb.full", 8)])
    approve(hog, approver)
    admit_waiting()
    waiting = ask(tenancy, [("h100-80gb.full", 2)])
    approve(waiting, approver)
    admit_waiting()
    waiting.refresh_from_db()
    assert waiting.waiting_reason == "needs 2 × full H100-80GB; 0 free"
    client.force_login(tenancy.acme_member)
    page = client.get(f"/t/acme/requests/{waiting.pk}/", headers={"accept-language": "ko"}).content.decode()
    assert "H100-80GB 전체 GPU 2개가 필요하지만 0개만 비어 있습니다" in page
    shown = api_for(tenancy.acme_member).get(f"/api/v1/pool-requests/{waiting.pk}/").json()
    assert shown["waiting_reason"] == "needs 2 × full H100-80GB; 0 free"


def test_a_waiting_request_names_the_closest_cluster_and_fulfilment_clears_it(db, tenancy, staff_user):
    """Any cluster: the reason comes from the cluster that comes nearest (here the second, which has
    H200s), not from the first one tried (which has none); once admitted, nothing says it waits."""
    from pools.services.provisioning import fail_pool
    from pools.services.verdicts import preview

    full = [None] * 8
    ClusterFactory(name="a-busan", fleet=[("h100", 1, "H100-80GB", full)])
    ClusterFactory(name="b-seoul", fleet=[("h200", 1, "H200-141GB", full)])
    for cluster in Cluster.objects.all():
        sync_inventory(cluster=cluster)
    approver = staff_user("approver")
    hog = ask(tenancy, [("h200-141gb.full", 6)])
    approve(hog, approver)
    admit_waiting()
    request = ask(tenancy, [("h200-141gb.full", 4)])
    approve(request, approver)
    admit_waiting()
    request.refresh_from_db()
    assert request.state == RequestState.QUEUED
    assert request.waiting_reason == "closest on cluster b-seoul: needs 4 × full H200-141GB; 2 free"
    assert request.waiting_reason_data["params"]["cluster"] == "b-seoul"
    assert "b-seoul" in preview(request)

    fail_pool(pool_id=Pool.objects.get(request=hog).pk, reason="gone")  # its GPUs come back
    admit_waiting()
    request.refresh_from_db()
    assert request.state == RequestState.FULFILLED
    assert (request.waiting_reason, request.waiting_reason_data) == ("", None)
