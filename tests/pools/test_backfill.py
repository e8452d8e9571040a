"""The backfill rule: what a later request may take while an older one starves, in the pure rule, in the
what-if simulator and in the queue itself (the same rule in both)."""

from datetime import timedelta

import pytest
from django.utils import timezone

from pools.mig import FULL_GPU
from pools.models import PoolRequest, RequestState
from pools.placement import Assignment, Placement, Reconfigure
from pools.placement.backfill import (
    may_keep_out_of_the_way,
    out_of_the_way,
    room_out_of_the_way,
    wanted_pairs,
)
from pools.services import admit_waiting
from tests.pools.test_placement import H100, H200, fleet, gpu
from tests.pools.test_queue import approve, ask
from tests.pools.test_simulation import admitted, run, timed

F = fleet(
    gpu("n1/0", "3g.40gb@0* 2g.20gb@4 1g.10gb@6"),  # holds work: its free instances are fixed
    gpu("n1/1", "3g.40gb@0 3g.40gb@4"),  # wholly free
    gpu("n1/2", off=True),
)
WANTS_FULL = {(H100, FULL_GPU)}


def placed(*assignments: tuple, reconfigure: tuple = ()) -> Placement:
    return Placement("r", True, reconfigure, tuple(Assignment(*a) for a in assignments))


@pytest.mark.parametrize(
    ("placement", "wanted", "expected"),
    [
        (placed(("n1/0", "2g.20gb", 4)), WANTS_FULL, True),
        (placed(("n1/0", "2g.20gb", 4), ("n1/0", "1g.10gb", 6)), WANTS_FULL, True),
        (placed(("n1/0", "2g.20gb", 4)), {(H100, "2g.20gb")}, False),  # the profile it waits for
        (placed(("n1/0", "2g.20gb", 4)), {(H200, "2g.35gb"), (H100, "1g.10gb")}, True),
        (placed(("n1/1", "3g.40gb", 0)), WANTS_FULL, False),  # an instance of a wholly free GPU
        (placed(("n1/2", FULL_GPU, None)), WANTS_FULL, False),
        (
            placed(("n1/1", "2g.20gb", 0), reconfigure=(Reconfigure("n1/1", True, (("2g.20gb", 0),)),)),
            WANTS_FULL,
            False,
        ),
        (Placement("r", False, reason="no room"), WANTS_FULL, False),
        (placed(("n9/0", "2g.20gb", 4)), WANTS_FULL, False),  # not in the fleet: nothing to vouch for
    ],
)
def test_only_fixed_free_instances_of_profiles_not_waited_for_are_out_of_the_way(placement, wanted, expected):
    assert out_of_the_way(F, placement, wanted) is expected


@pytest.mark.parametrize(
    ("asked", "expected"),
    [
        ({(H100, "2g.20gb"), (H100, "1g.10gb")}, True),
        ({(H100, "2g.20gb"), (H100, FULL_GPU)}, False),  # a whole GPU is never out of the way
        ({(H100, "2g.20gb"), (H200, "1g.18gb")}, False),  # asks for a profile the starving one wants
        ({(H100, "1g.18gb")}, True),  # the profile's name on another model is another profile
    ],
)
def test_a_held_back_request_is_placed_only_if_it_could_keep_out_of_the_way(asked, expected):
    assert may_keep_out_of_the_way(asked, {(H200, "1g.18gb"), (H100, FULL_GPU)}) is expected


@pytest.mark.parametrize(
    ("items", "expected"),
    [
        ([(1, "2g.20gb")], True),
        ([(1, "2g.20gb"), (1, "1g.10gb")], True),
        ([(2, "1g.10gb")], True),  # one on each GPU in use
        ([(3, "1g.10gb")], False),  # a drained GPU gives nothing new
        ([(1, "3g.40gb")], False),  # only wholly free GPUs have one
        ([(1, "1g.10gb", H200)], False),
    ],
)
def test_a_held_back_request_is_placed_only_where_gpus_in_use_have_the_free_instances(items, expected):
    f = fleet(
        *F.gpus, gpu("n2/0", "4g.40gb@0* 1g.10gb@4"), gpu("n2/1", "1g.10gb@0* 1g.10gb@1", schedulable=False)
    )
    assert room_out_of_the_way(f, timed("r", 0, 1, *items).items) is expected


def test_the_wanted_pairs_are_the_items_model_and_profile():
    (request,) = [timed("r", 0, 1, (2, "1g.10gb"), (1, FULL_GPU, H200))]
    assert wanted_pairs(request.items) == {(H100, "1g.10gb"), (H200, FULL_GPU)}


def test_the_simulator_backfills_what_keeps_out_of_the_way_of_a_starving_request():
    # n1/1 holds a tenant for good: its free 2g and 1g instances are all it can still give.
    f = fleet(gpu("n1/0", off=True), gpu("n1/1", "3g.40gb@0* 2g.20gb@4 1g.10gb@6"))
    requests = (
        timed("holder", 0, 1000, (1, FULL_GPU)),
        timed("big", 10, 100, (1, FULL_GPU)),  # starves until holder leaves
        timed("fixed free", 20, 100, (1, "2g.20gb")),  # a free instance of n1/1: no use to big
        timed("whole", 30, 100, (1, FULL_GPU)),  # would take what big waits for
    )
    result = run(f, *requests, grace=5)
    assert admitted(result) == {"holder": 0, "big": 1000, "fixed free": 20, "whole": 1100}
    asks_it_too = (requests[0], timed("big", 10, 100, (1, FULL_GPU), (1, "2g.20gb")), requests[2])
    result = run(f, *asks_it_too, grace=5)
    assert admitted(result) == {"holder": 0, "big": 1000, "fixed free": 1100}  # held back for big


@pytest.mark.parametrize(
    ("starving_items", "backfilled"),
    [
        ([("h200-141gb.full", 4)], True),
        ([("h200-141gb.full", 4), ("h200-141gb.mig-1g.18gb", 1)], False),
    ],
)
def test_the_queue_backfills_a_fixed_free_instance_only_of_a_profile_the_starving_one_does_not_want(
    fleet, tenancy, approver, settings, starving_items, backfilled
):
    """The fleet's H200s: GPU 0 of each node 7 × 1g.18gb, GPU 1 2 × 3g.71gb, 6 whole each."""
    settings.QUEUE_BACKFILL_GRACE_SECONDS = 60
    first = ask(tenancy, [("h200-141gb.mig-1g.18gb", 1)])  # one 1g GPU now holds work
    hog = ask(tenancy, [("h200-141gb.full", 12)])  # every MIG-disabled H200
    for request in (first, hog):
        approve(request, approver)
    admit_waiting()
    fulfilled = PoolRequest.objects.filter(pk__in=[first.pk, hog.pk], state=RequestState.FULFILLED)
    assert fulfilled.count() == 2
    starving = ask(tenancy, starving_items)  # 3 wholly free MIG GPUs are left, not 4
    approve(starving, approver)
    PoolRequest.objects.filter(pk=starving.pk).update(approved_at=timezone.now() - timedelta(hours=1))
    small = ask(tenancy, [("h200-141gb.mig-1g.18gb", 1)])  # fits on the GPU that holds work
    large = ask(tenancy, [("h200-141gb.mig-3g.71gb", 1)])  # would take a wholly free GPU
    for request in (small, large):
        approve(request, approver)
    admit_waiting()
    states = {r.pk: r for r in PoolRequest.objects.filter(pk__in=[starving.pk, small.pk, large.pk])}
    assert states[starving.pk].state == RequestState.QUEUED
    assert states[large.pk].state == RequestState.QUEUED
    assert "older request" in states[large.pk].waiting_reason
    assert (states[small.pk].state == RequestState.FULFILLED) is backfilled
    if backfilled:
        (allocation,) = states[small.pk].pool.allocations.all()
        assert allocation.gpu_id == first.pool.allocations.get().gpu_id  # beside the first tenant
    else:
        assert "older request" in states[small.pk].waiting_reason
