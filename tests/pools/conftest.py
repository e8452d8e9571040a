"""Fixtures of the capacity tests: simulated clusters with small fleets."""

import pytest

from pools.models import Pool, PoolRequest, PoolState, RequestState
from pools.services import admit_waiting, approve_request, provision_step, submit_request
from pools.services.inventory import sync_inventory
from pools.services.provisioning import DONE
from tests.factories import ClusterFactory, PoolFactory, PoolRequestFactory
from tests.pools.whatif_month import kst

FULL = [None] * 8
SMALL_FLEET = [
    ("h200", 2, "H200-141GB", [{"1g.18gb": 7}, {"3g.71gb": 2}, None, None, None, None, None, None]),
    ("h100", 1, "H100-80GB", FULL),
]


@pytest.fixture(autouse=True)
def _instant_mig(settings):
    settings.SIMULATED_MIG_APPLY_SECONDS = 0


@pytest.fixture
def sim_cluster(db):
    return ClusterFactory(name="sim", fleet=SMALL_FLEET)


@pytest.fixture
def fleet(sim_cluster):
    """The small fleet synced: h200-1, h200-2 (GPU 0 = 7 × 1g.18gb, GPU 1 = 2 × 3g.71gb, 6 whole GPUs each),
    h100-1 (8 whole GPUs)."""
    sync_inventory(cluster=sim_cluster)
    return sim_cluster


@pytest.fixture
def more_operators(operator):
    """`more_operators(n)`: n operators besides `operator`, each of the operator group."""
    from django.contrib.auth.models import Group

    from tests.factories import UserFactory

    def make(count: int) -> list:
        people = [UserFactory(username=f"operator-{n}", is_staff=True) for n in range(count)]
        for person in people:
            person.groups.add(Group.objects.get(name="operator"))
        return people

    return make


@pytest.fixture
def seoul_billing(settings):
    settings.BILLING_TIME_ZONE = "Asia/Seoul"


@pytest.fixture
def march(fleet, tenancy):
    """2026-03 on the small fleet, written as given state (no task is sent): requests for 4 whole H100s
    approved every two hours on the 2nd, each pool held 5 hours, so that the later ones wait for the
    earlier; every third cancelled while it waited."""
    for n in range(9):
        request = PoolRequestFactory(
            project=tenancy.vision, cluster=fleet, purpose="", state=RequestState.FULFILLED,
            approved_at=kst(2, 2 * n), items=[("h100-80gb.full", 4)],
        )  # fmt: skip
        if n % 3 == 2:
            PoolRequest.objects.filter(pk=request.pk).update(state=RequestState.CANCELLED)
        else:
            PoolFactory(
                project=tenancy.vision, request=request, cluster=fleet, state=PoolState.RELEASED,
                reserved_at=kst(2, 2 * n), released_at=kst(2, 2 * n + 5),
            )  # fmt: skip
    return fleet


def active_pool(project, user, approver, items, **asked) -> Pool:
    """A pool asked for (`asked`: its end, cluster, purpose…), approved, admitted and provisioned, as the
    services do it one after another."""
    request = submit_request(project=project, user=user, items=items, **asked)
    approve_request(request_id=request.pk, approver=approver)
    admit_waiting()
    pool = Pool.objects.get(request=request)
    for _step in range(3):
        if provision_step(pool_id=pool.pk) == DONE:
            break
    pool.refresh_from_db()
    assert pool.state == PoolState.ACTIVE
    return pool
