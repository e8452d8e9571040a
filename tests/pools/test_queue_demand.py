"""The queue tells placement what was asked lately: requests approved in the demand window, decayed, decide
the layout of a GPU it re-partitions, in the approver's verdict as in the admission itself."""

from datetime import timedelta

import pytest
from django.utils import timezone

from pools.models import GpuCapacity, Pool, RequestState
from pools.selectors.demand import queue_demand
from pools.services import admit_waiting, approve_request, submit_request
from pools.services.verdicts import FITS, verdict
from tests.factories import PoolRequestFactory

WEEK = 7 * 24 * 3600


def asked_before(project, *, seconds_ago: float, items, state=RequestState.FULFILLED):
    """A request approved that long ago (its own pool, if any, long gone: only its demand counts here)."""
    request = PoolRequestFactory(project=project, state=state, items=items)
    request.approved_at = timezone.now() - timedelta(seconds=seconds_ago)
    request.save(update_fields=["approved_at"])
    return request


@pytest.mark.django_db
def test_recent_demand_counts_the_window_decayed_and_nothing_older(tenancy, settings):
    settings.QUEUE_DEMAND_WINDOW_SECONDS = WEEK
    asked_before(tenancy.vision, seconds_ago=0, items=[("h200-141gb.mig-3g.71gb", 2)])
    asked_before(tenancy.vision, seconds_ago=WEEK / 2, items=[("h200-141gb.mig-3g.71gb", 4)])
    asked_before(tenancy.vision, seconds_ago=WEEK + 60, items=[("h200-141gb.mig-1g.18gb", 7)])
    asked_before(tenancy.vision, seconds_ago=60, items=[("h100-80gb.full", 1)], state=RequestState.CANCELLED)
    PoolRequestFactory(project=tenancy.vision, items=[("h200-141gb.mig-1g.18gb", 3)])  # never approved
    demand = queue_demand(now=timezone.now())
    assert set(demand) == {("H200-141GB", "3g.71gb"), ("H100-80GB", "full")}
    assert demand[("H200-141GB", "3g.71gb")] == pytest.approx(2 + 4 * 0.5, rel=1e-3)
    assert demand[("H100-80GB", "full")] == pytest.approx(1, rel=1e-3)


def new_layout(fleet, tenancy, approver, items) -> tuple[list[str], list[str]]:
    """The profiles the verdict cuts the re-partitioned GPU into, and what the admission planned for it."""
    request = submit_request(project=tenancy.vision, user=tenancy.acme_member, items=items)
    approve_request(request_id=request.pk, approver=approver)
    shown = verdict(request)
    assert shown.outcome == FITS
    (change,) = shown.repartitions
    admit_waiting()
    pool = Pool.objects.get(request=request)
    (gpu,) = GpuCapacity.objects.filter(allocations__pool=pool).exclude(planned_layout=None).distinct()
    return sorted(change.profiles), sorted(i["profile"] for i in gpu.planned_layout["instances"])


@pytest.mark.parametrize(
    ("lately", "expected"),
    [
        ("h200-141gb.mig-1g.18gb", ["1g.18gb"] * 7),  # small instances asked lately: cut it all small
        ("h200-141gb.mig-3g.71gb", ["1g.18gb"] * 4 + ["3g.71gb"]),  # room kept for what is asked
    ],
)
def test_what_was_asked_lately_decides_the_layout_of_a_re_partitioned_gpu(
    fleet, tenancy, approver, lately, expected
):
    for hours in range(1, 6):
        asked_before(tenancy.vision, seconds_ago=hours * 3600, items=[(lately, 2)])
    # Fifteen 1g.18gb: the seven free ones of GPU 0 on each H200 node, and one on a GPU cut for it.
    shown, planned = new_layout(fleet, tenancy, approver, [("h200-141gb.mig-1g.18gb", 15)])
    assert shown == planned  # the approver sees what the queue does
    assert planned == sorted(expected)
