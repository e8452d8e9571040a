"""The simulator under quotas: the admission policy of the queue, on a timed trace with tenants (API.md,
"Quotas and end dates in the simulation trace"): fair share, limits, and reclaim with notice."""

import json
from dataclasses import replace

import pytest
from django.core.management import call_command

from pools.mig import FULL_GPU
from pools.placement.admission import Quota
from pools.placement.replay import check
from pools.placement.simulation import SimulationTrace, TimedRequest, simulate
from pools.placement.timetrace import TraceError, read_simulation_trace, write_outcomes
from pools.placement.types import Item
from tests.pools.test_placement import H100, fleet, gpu

FOUR = fleet(*(gpu(f"n1/{i}", off=True) for i in range(4)))  # 4 whole H100s: 28 compute slices


def timed(id, arrive, hold, count, tenant, priority=0, declared=None) -> TimedRequest:
    return TimedRequest(id, arrive, hold, (Item(H100, FULL_GPU, count),), None, tenant, priority, declared)


def halves(limit=28) -> dict:
    return {name: {("", H100): Quota(14, limit)} for name in ("a", "b")}


def outcomes(result) -> dict:
    return {o.request: o for o in result.outcomes}


def b_lends_then_a_asks(**options) -> SimulationTrace:
    """b holds the four GPUs, two of them borrowed; then a asks for its guarantee, two."""
    return SimulationTrace(
        FOUR,
        (timed("b1", 0, 5000, 2, "b"), timed("b2", 10, 5000, 2, "b"), timed("a1", 100, 1000, 2, "a")),
        horizon=20_000,
        quotas=halves(),
        reclaim_notice_seconds=600,
        **options,
    )


def test_a_guaranteed_request_reclaims_the_borrowed_pool_after_its_notice():
    trace = b_lends_then_a_asks()
    result = simulate(trace)
    found = outcomes(result)
    assert (found["b1"].borrowed, found["b2"].borrowed) == (False, True)
    assert (found["b2"].reclaimed_at, found["a1"].admitted_at) == (700, 700)  # admitted at the notice's end
    assert found["b1"].reclaimed_at is None
    assert result.summary.reclaimed == 1 and result.summary.p95_within_wait_seconds == 600
    # Served: b1 whole, b2 until reclaimed, a1 whole.
    assert result.summary.served_slice_hours == pytest.approx((14 * 5000 + 14 * 690 + 14 * 1000) / 3600)


def test_a_reclaimed_pool_is_asked_again_for_what_its_hold_had_left_where_the_trace_requeues():
    trace = b_lends_then_a_asks(requeue_reclaimed=True)
    result = simulate(trace)
    assert check(trace, result.outcomes) == []
    b2 = outcomes(result)["b2"]
    (again,) = b2.requeued
    assert (b2.reclaimed_at, again.admitted_at, again.reclaimed_at) == (700, 1100 + 600, None)  # when a1 ends
    assert len(again.placement.assignments) == 2 and again.borrowed
    # Served: b1 whole, b2 until reclaimed, a1 whole, and what b2 had left once admitted again.
    assert result.summary.served_slice_hours == pytest.approx(
        (14 * 5000 + 14 * 690 + 14 * 1000 + 14 * (5010 - 700)) / 3600
    )
    written = write_outcomes(result.outcomes, quotas=True, requeue=True)["results"]
    assert written[1]["requeued"][0]["admitted_at"] == 1700 and "id" not in written[1]["requeued"][0]
    assert written[0]["requeued"] == []
    # The replay check sees what was asked again: an answer that leaves it out, or keeps it where the
    # trace does not requeue, is refused.
    assert check(trace, [replace(o, requeued=()) for o in result.outcomes]) == [
        "'b2' was reclaimed at 700 and not asked again."
    ]
    assert "does not requeue" in check(replace(trace, requeue_reclaimed=False), result.outcomes)[0]


def test_a_tenant_s_guarantee_is_an_amount_its_waiting_requests_share_and_reclaim_only_once():
    trace = SimulationTrace(
        FOUR,
        (
            *(timed(f"b{n}", n, 5000, 1, "b") for n in range(1, 5)),  # b has no guarantee: all borrowed
            timed("a1", 100, 1000, 2, "a"),  # within a's 14 slices
            timed("a2", 100, 1000, 2, "a"),  # within them alone too, but not after a1, which comes first
        ),
        horizon=20_000,
        quotas={"a": {("", H100): Quota(14, None)}, "b": {("", H100): Quota(0, None)}},
        reclaim_notice_seconds=600,
    )
    found = outcomes(simulate(trace))
    assert [found[f"b{n}"].reclaimed_at for n in range(1, 5)] == [None, None, 700, 700]  # the newest two
    assert (found["a1"].admitted_at, found["a2"].admitted_at) == (700, 1700)  # a2 when a1 ends


def test_a_second_run_in_one_second_is_replayed_after_the_releases_before_it():
    # At 5: a run admits r2 (held for 0 s) and reclaims b's r0 with no notice for r5; the run that follows
    # in that second admits r5 where r0 was, and r3 where r2 was, once both are given back.
    two = fleet(gpu("g0", off=True, node="n0"), gpu("g1", off=True, node="n0"))
    full = [timed("r0", 0, 30, 1, "b"), *(timed(f"r{n}", 0, 0, 1, "a") for n in range(1, 5))]
    ones = TimedRequest("r5", 5, 0, (Item(H100, "1g.10gb", 1),), None, "a")
    trace = SimulationTrace(
        two,
        (*full, ones),
        horizon=50,
        quotas={"a": {("", H100): Quota(8, 8)}, "b": {}},
        reclaim_notice_seconds=0,
    )
    result = simulate(trace)
    found = outcomes(result)
    assert (found["r0"].reclaimed_at, found["r2"].admitted_at, found["r3"].admitted_at) == (5, 5, 5)
    assert found["r3"].run > found["r2"].run
    assert check(trace, result.outcomes) == []


def test_a_reclaim_is_called_off_where_room_comes_free_first_and_the_pool_keeps_its_end():
    trace = SimulationTrace(
        FOUR,
        (timed("b1", 0, 300, 2, "b"), timed("b2", 10, 5000, 2, "b"), timed("a1", 100, 1000, 2, "a")),
        horizon=20_000,
        quotas=halves(),
        reclaim_notice_seconds=600,
    )
    found = outcomes(simulate(trace))
    assert found["a1"].admitted_at == 300  # b1 ended before the notice did
    assert found["b2"].reclaimed_at is None


def test_what_a_reclaim_frees_is_held_for_its_request_through_the_notice():
    sevens = " ".join(f"1g.10gb@{start}" for start in range(7))
    two = fleet(gpu("n1/0", sevens), gpu("n2/0", sevens))

    def ones(id, arrive, hold, count, tenant):
        return TimedRequest(id, arrive, hold, (Item(H100, "1g.10gb", count),), None, tenant)

    trace = SimulationTrace(
        two,
        (
            ones("b1", 0, 10_000, 7, "b"),
            ones("b2", 1, 10_000, 4, "b"),  # borrowed: on a GPU of its own
            ones("a1", 100, 1000, 7, "a"),  # within: 3 free beside b2, and b2's 4 once reclaimed
            ones("b3", 200, 5000, 1, "b"),  # would take one of those 3 during the notice
        ),
        horizon=20_000,
        quotas={name: {("", H100): Quota(7, None)} for name in ("a", "b")},
        reclaim_notice_seconds=600,
    )
    found = outcomes(simulate(trace))
    assert (found["b2"].reclaimed_at, found["a1"].admitted_at) == (700, 700)  # one notice, not two
    assert found["b3"].admitted_at == 1100 + 600  # when a1 ends


def test_nobody_holds_past_a_limit_and_the_tenant_furthest_below_its_guarantee_goes_first():
    trace = SimulationTrace(
        FOUR,
        (
            timed("a1", 0, 1000, 2, "a"),
            timed("a2", 5, 1000, 2, "a"),  # would take a to 28 of its limit of 14
            timed("b1", 10, 1000, 2, "b"),
        ),
        horizon=20_000,
        quotas=halves(limit=14),
    )
    found = outcomes(simulate(trace))
    assert (found["a1"].admitted_at, found["b1"].admitted_at, found["a2"].admitted_at) == (0, 10, 1000)
    cut = outcomes(simulate(SimulationTrace(FOUR, trace.requests, horizon=500, quotas=halves(limit=14))))
    assert cut["a2"].admitted_at is None and "limit of 14" in cut["a2"].placement.reason


def test_without_tenants_the_trace_runs_as_before_and_says_nothing_of_quotas():
    plain = SimulationTrace(FOUR, (timed("x", 0, 10, 4, None), timed("y", 1, 10, 1, None)), horizon=100)
    result = simulate(plain)
    assert [o.admitted_at for o in result.outcomes] == [0, 10]
    assert all(not o.borrowed and o.reclaimed_at is None for o in result.outcomes)
    assert "borrowed" not in write_outcomes(result.outcomes)["results"][0]


def test_a_declared_end_caps_the_hold():
    trace = SimulationTrace(FOUR, (timed("x", 0, 100, 4, None, declared=40), timed("y", 1, 10, 1, None)), 200)
    assert [o.admitted_at for o in simulate(trace).outcomes] == [0, 40]


def trace_json(**changes) -> dict:
    data = {
        "gpus": [{"id": f"n1/{i}", "node": "n1", "model": H100, "mig": False} for i in range(4)],
        "horizon": 10_000,
        "reclaim_notice_seconds": 600,
        "tenants": [
            {"name": "a", "auto_approve": True, "quotas": [{"model": H100, "guaranteed": 14, "limit": 28}]}
        ],
        "requests": [
            {"id": "r1", "arrive": 0, "hold": 100, "tenant": "a", "priority": 0, "declared_hold": 50,
             "items": [{"model": H100, "profile": "full", "count": 1}]},
        ],
    }  # fmt: skip
    for path, value in changes.items():
        target = data
        *parents, last = path.split(".")
        for key in parents:
            target = target[int(key)] if isinstance(target, list) else target[key]
        target[int(last) if isinstance(target, list) else last] = value
    return data


def test_the_trace_reads_tenants_their_quotas_and_each_requests_tenant():
    trace = read_simulation_trace(trace_json())
    assert trace.quotas == {"a": {("", H100): Quota(14, 28)}} and trace.reclaim_notice_seconds == 600
    (request,) = trace.requests
    assert (request.tenant, request.priority, request.declared_hold, request.held_for) == ("a", 0, 50, 50)
    no_limit = read_simulation_trace(trace_json(**{"tenants.0.quotas.0.limit": None}))
    assert no_limit.quotas["a"][("", H100)] == Quota(14, None)


@pytest.mark.parametrize(
    ("change", "words"),
    [
        ({"requests.0.tenant": "z"}, '"tenant" \'z\' is not in "tenants"'),
        ({"requests.0.priority": 2.5}, '"priority" must be a whole number'),
        ({"requests.0.declared_hold": -1}, '"declared_hold" must be null or'),
        ({"tenants.0.quotas.0.model": "B200-180GB"}, "is not a model of the fleet"),
        ({"tenants.0.quotas.0.guaranteed": -3}, '"guaranteed" must be a whole number of compute slices'),
        ({"tenants.0.quotas.0.limit": 7}, "at least the guarantee (14)"),
        ({"tenants.0.auto_approve": "yes"}, '"auto_approve" must be true or false'),
        ({"tenants.0.name": ""}, '"name" must be a non-empty string'),
        ({"reclaim_notice_seconds": "soon"}, '"reclaim_notice_seconds" must be'),
        ({"requeue_reclaimed": "yes"}, '"requeue_reclaimed" must be true or false'),
    ],
)
def test_bad_tenants_and_quotas_are_refused_saying_where(change, words):
    with pytest.raises(TraceError, match=None) as refused:
        read_simulation_trace(trace_json(**change))
    assert words in str(refused.value)


def test_the_command_writes_borrowed_and_reclaimed_at_for_a_trace_with_tenants(tmp_path, capsys):
    path = tmp_path / "trace.json"
    path.write_text(json.dumps(trace_json()))
    call_command("simulate", "--input", str(path))
    (result,) = json.loads(capsys.readouterr().out)["results"]
    assert (result["admitted_at"], result["borrowed"], result["reclaimed_at"]) == (0, False, None)
