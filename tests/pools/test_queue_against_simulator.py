"""The queue and the simulator give the same decisions on the same stream: one admission policy, run by the
queue on the database and by the simulator on plain data. Seeded streams of requests of two tenants with
guarantees and limits, priorities and holds, are run through both; each request is admitted at the same
second onto the same GPUs, judged borrowed alike, and reclaimed alike."""

import random

import pytest

from pools.models import Pool, PoolRequest, PoolState
from pools.placement.admission import Quota
from pools.placement.simulation import SimulationTrace, TimedRequest, simulate
from pools.placement.types import Item
from pools.selectors import fleet_snapshot, ready_clusters
from pools.services import admit_waiting, approve_request, release_pool, submit_request
from pools.services.deadlines import release_reclaimed
from pools.services.provisioning import provision_step
from pools.services.quotas import set_quota
from portal.errors import InvalidInput
from tests.examples import scenarios

H100 = "H100-80GB"
NOTICE = 300


def stream(seed: int, tenants) -> list[dict]:
    rng = random.Random(seed)
    at, found = 0, []
    for n in range(24):
        at += rng.choice([0, 10, 50, 200])
        found.append(
            {
                "id": f"r{n}",
                "arrive": at,
                "hold": rng.choice([100, 400, 1500, 4000, 20000]),
                "count": rng.choice([1, 1, 2, 3]),
                "tenant": rng.choice(tenants),
                "priority": rng.choice([0, 0, 0, 5]),
            }
        )
    return found


@pytest.mark.parametrize(
    ("seed", "requeue"), scenarios([(1, False), (2, False), (3, False), (4, False), (4, True), (1, True)])
)
def test_the_queue_decides_as_the_simulator_does(fleet, tenancy, operator, approver, settings, seed, requeue):
    settings.RECLAIM_NOTICE_SECONDS = NOTICE
    settings.RECLAIM_REQUEUE = requeue  # a reclaimed pool's request asked again, "name+" for "name"
    settings.QUEUE_BACKFILL_GRACE_SECONDS = 10**9  # the simulator's None: wall time plays no part
    people = {
        tenancy.acme.pk: (tenancy.vision, tenancy.acme_member),
        tenancy.globex.pk: (tenancy.recsys, tenancy.globex_member),
    }
    set_quota(actor=operator, tenant=tenancy.acme, gpu_model=H100, guaranteed=28, limit=None)
    set_quota(actor=operator, tenant=tenancy.globex, gpu_model=H100, guaranteed=21, limit=42)
    quotas = {tenancy.acme.pk: {("", H100): Quota(28, None)}, tenancy.globex.pk: {("", H100): Quota(21, 42)}}
    asked = stream(seed, sorted(people))
    clusters, grouped = ready_clusters()
    h100s = fleet_snapshot(clusters, grouped)[fleet.name]
    h100s = type(h100s)(tuple(g for g in h100s.gpus if g.model == H100))
    # The stream through the database, second by second as the simulator runs it. A request beyond a limit as
    # it is submitted is refused there: it never joins the queue, and is left out of the simulator's stream.
    hold = {r["id"]: r["hold"] for r in asked}
    requests, pools, ends, notices = {}, {}, {}, {}
    arrivals = list(asked)
    got: dict[str, dict] = {}
    refused: set[str] = set()
    while True:
        times = [arrivals[0]["arrive"]] if arrivals else []
        times += list(ends.values()) + list(notices.values())
        if not times:
            break
        now = min(times)
        for pool_id, end in list(ends.items()):
            if end <= now and notices.get(pool_id, end + 1) > end:  # its own end comes first, notice or not
                pool = Pool.objects.get(pk=pool_id)
                project, person = people[pool.project.tenant_id]
                release_pool(pool_id=pool_id, user=person)
                del ends[pool_id]
                notices.pop(pool_id, None)
        due = [pool_id for pool_id, end in notices.items() if end <= now]
        if due:  # marked in the order of time, so the last one's deadline releases exactly these
            last = max(Pool.objects.filter(pk__in=due).values_list("reclaim_at", flat=True))
            assert sorted(release_reclaimed(now=last)) == sorted(due)
            for pool_id in due:
                name = pools[pool_id]
                got[name]["reclaimed_at"] = notices.pop(pool_id)
                del ends[pool_id]
                for again in PoolRequest.objects.filter(asked_again_for_id=pool_id):
                    requests[again.pk] = f"{name}+"
                    hold[f"{name}+"] = got[name]["admitted_at"] + hold[name] - got[name]["reclaimed_at"]
        while arrivals and arrivals[0]["arrive"] <= now:
            r = arrivals.pop(0)
            project, person = people[r["tenant"]]
            try:
                request = submit_request(project=project, user=person, items=[("h100-80gb.full", r["count"])])
            except InvalidInput:
                refused.add(r["id"])
                continue
            approve_request(request_id=request.pk, approver=approver, priority=r["priority"])
            requests[request.pk] = r["id"]
        admit_waiting()
        for pool in Pool.objects.filter(request_id__in=list(requests)).exclude(pk__in=list(pools)):
            name = requests[pool.request_id]
            provision_step(pool_id=pool.pk)
            pools[pool.pk] = name
            gpus = set(pool.allocations.values_list("gpu_id", flat=True))
            got[name] = {"admitted_at": now, "gpus": {str(g) for g in gpus}, "reclaimed_at": None,
                         "borrowed": pool.request.quota_verdict == "borrowed"}  # fmt: skip
            ends[pool.pk] = now + hold[name]
        for pool in Pool.objects.filter(state=PoolState.RECLAIMING).exclude(pk__in=list(notices)):
            notices[pool.pk] = now + NOTICE
        for pool_id in [p for p in notices if Pool.objects.get(pk=p).state == PoolState.ACTIVE]:
            del notices[pool_id]  # called off: it keeps its own end

    trace = SimulationTrace(
        h100s,
        tuple(
            TimedRequest(
                r["id"],
                r["arrive"],
                r["hold"],
                (Item(H100, "full", r["count"]),),
                None,
                r["tenant"],
                r["priority"],
            )
            for r in asked
            if r["id"] not in refused
        ),
        horizon=10**6,
        quotas=quotas,
        reclaim_notice_seconds=NOTICE,
        requeue_reclaimed=requeue,
    )
    expected = {}
    for outcome in simulate(trace).outcomes:
        expected[outcome.request] = outcome
        for number, again in enumerate(outcome.requeued, 1):
            expected[outcome.request + "+" * number] = again
    for name, outcome in expected.items():
        mine = got.get(name)
        if outcome.admitted_at is None:
            assert mine is None, name
            continue
        assert mine is not None, (
            f"{name} admitted by the simulator at {outcome.admitted_at}, not by the queue"
        )
        assert mine["admitted_at"] == outcome.admitted_at, name
        assert mine["gpus"] == {a.gpu for a in outcome.placement.assignments}, name
        assert (mine["borrowed"], mine["reclaimed_at"]) == (outcome.borrowed, outcome.reclaimed_at), name
    if seed in (1, 4):  # these streams reclaim, and these refuse requests beyond a limit: both are covered
        assert any(o.reclaimed_at for o in expected.values())
    if seed in (2, 3):
        assert refused
    if requeue:  # and what was asked again was admitted again, alike
        assert any(name.endswith("+") and got[name]["admitted_at"] for name in got)
