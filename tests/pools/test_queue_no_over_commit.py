"""Reserved capacity is never over-committed: the database refuses two live allocations of one slice, and
admissions and releases racing on their own connections reserve every GPU slice at most once."""

import random
import threading

import pytest
from django.contrib.auth.models import Group
from django.db import IntegrityError, connection, transaction
from django.db.backends.postgresql.psycopg_any import NumericRange
from django.utils import timezone

from pools.models import Allocation, Pool, PoolRequest, RequestState, SpecAndCount
from pools.services import admit_waiting, approve_request, release_pool, submit_request
from pools.services.inventory import sync_inventory
from tests.factories import AllocationFactory, ClusterFactory, MembershipFactory, ProjectFactory, UserFactory

from .test_queue import approve, ask


def test_the_database_refuses_two_live_allocations_of_one_slice(fleet, tenancy, approver):
    request = ask(tenancy, [("h100-80gb.full", 1)])
    approve(request, approver)
    admit_waiting()
    taken = Allocation.objects.get()
    with pytest.raises(IntegrityError), transaction.atomic():
        AllocationFactory(pool=taken.pool, gpu=taken.gpu, profile="full", slices=NumericRange(0, 8))
    taken.released_at = timezone.now()
    taken.save()
    # once released, the slices are free again
    AllocationFactory(pool=taken.pool, gpu=taken.gpu, profile="full", slices=NumericRange(0, 8))


@pytest.mark.django_db(transaction=True, serialized_rollback=True)
def test_racing_admissions_never_over_commit(tenancy):
    cluster = ClusterFactory(name="race", fleet=[("n", 1, "H100-80GB", [None] * 8)])
    sync_inventory(cluster=cluster)
    approver = UserFactory(username="racer", is_staff=True)
    approver.groups.add(Group.objects.get(name="approver"))
    requests = []
    for n in range(12):
        project = ProjectFactory(tenant=tenancy.acme, slug=f"race{n}")
        MembershipFactory(tenant=tenancy.acme, user=UserFactory(username=f"asker{n}"), role="member")
        user = tenancy.acme.memberships.get(user__username=f"asker{n}").user
        requests.append(submit_request(project=project, user=user, items=[("h100-80gb.full", 1)]))
    errors = []

    def worker(chunk):
        try:
            for request in chunk:
                approve_request(request_id=request.pk, approver=approver)
                admit_waiting()
        except Exception as error:  # reported below
            errors.append(error)
        finally:
            connection.close()

    threads = [threading.Thread(target=worker, args=(requests[i::4],)) for i in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert errors == []
    admit_waiting()
    live = Allocation.objects.filter(released_at=None)
    assert live.count() == 8  # every GPU once, no more
    assert live.values("gpu").distinct().count() == 8
    assert PoolRequest.objects.filter(state=RequestState.FULFILLED).count() == 8
    assert PoolRequest.objects.filter(state=RequestState.QUEUED).count() == 4


OVERLAPS = """
    SELECT count(*) FROM pools_allocation a JOIN pools_allocation b
      ON a.gpu_id = b.gpu_id AND a.id < b.id AND a.slices && b.slices
     WHERE a.released_at IS NULL AND b.released_at IS NULL
"""


@pytest.mark.django_db(transaction=True, serialized_rollback=True)
def test_racing_admissions_and_releases_never_over_commit(tenancy):
    """Threads on their own connections approve, admit and release at once on 8 GPUs."""
    cluster = ClusterFactory(name="race", fleet=[("n", 1, "H100-80GB", [None] * 8)])
    sync_inventory(cluster=cluster)
    approver = UserFactory(username="racer", is_staff=True)
    approver.groups.add(Group.objects.get(name="approver"))
    requests = [
        submit_request(
            project=tenancy.vision, user=tenancy.acme_member, items=[("h100-80gb.full", 1 + n % 2)]
        )
        for n in range(16)
    ]
    errors, overlaps = [], []

    def approver_thread(chunk):
        try:
            for request in chunk:
                approve_request(request_id=request.pk, approver=approver)
                admit_waiting()
        except Exception as error:
            errors.append(error)
        finally:
            connection.close()

    def releaser_thread(seed):
        rng = random.Random(seed)
        try:
            for _ in range(20):
                live = list(Pool.objects.filter(state="provisioning").values_list("pk", flat=True))
                if live:
                    try:
                        release_pool(pool_id=rng.choice(live), user=tenancy.acme_member)
                    except Exception as error:  # another thread released it first: a clean refusal
                        if "cannot become" not in str(error):
                            errors.append(error)
                admit_waiting()
                with connection.cursor() as cursor:
                    cursor.execute(OVERLAPS)
                    overlaps.append(cursor.fetchone()[0])
        except Exception as error:
            errors.append(error)
        finally:
            connection.close()

    threads = [threading.Thread(target=approver_thread, args=(requests[i::3],)) for i in range(3)]
    threads += [threading.Thread(target=releaser_thread, args=(seed,)) for seed in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert errors == []
    assert set(overlaps) == {0}
    live = Allocation.objects.filter(released_at=None)
    assert live.count() <= 8 and live.values("gpu").distinct().count() == live.count()
    for spec in SpecAndCount.objects.filter(node__cluster=cluster):
        assert spec.allocated == live.filter(gpu__node=spec.node, resource_name=spec.resource_name).count()
