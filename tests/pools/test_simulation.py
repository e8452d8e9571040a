"""The what-if simulator's pure core: the queue's policy over time by example, the replay check caught
breaking each rule, recent demand's decay and window (the properties, and a week of a busy fleet, are in
test_simulation_properties.py)."""

from dataclasses import replace

import pytest
from hypothesis import given
from hypothesis import strategies as st

from pools.mig import FULL_GPU
from pools.placement import Assignment, Fleet, Item, Placement, Reconfigure, apply, place
from pools.placement.admission import BEHIND_OLDER
from pools.placement.demand import DEMAND_WINDOW_SECONDS, recent_demand
from pools.placement.plan import QUEUE_WINDOW
from pools.placement.replay import check
from pools.placement.simulation import (
    AFTER_HORIZON,
    SimulationTrace,
    TimedRequest,
    compute_slices,
    release,
    simulate,
    stranded_slices,
)
from tests.pools.test_placement import A100, H100, fleet, gpu

HOUR = 3600


def timed(id: str, arrive: int, hold: int, *items: tuple, group: str | None = None) -> TimedRequest:
    """Items as (count, profile) or (count, profile, model), as test_placement's `ask`."""
    return TimedRequest(
        id, arrive, hold, tuple(Item(i[2] if len(i) > 2 else H100, i[1], i[0]) for i in items), group
    )


def run(f: Fleet, *requests: TimedRequest, horizon: int = 10_000, grace: int | None = None):
    trace = SimulationTrace(f, requests, horizon, grace)
    result = simulate(trace)
    assert check(trace, result.outcomes) == []
    return result


def admitted(result) -> dict[str, int | None]:
    return {o.request: o.admitted_at for o in result.outcomes}


# --- the policy, by example ----------------------------------------------------------------------------


def test_a_request_is_tried_again_once_the_re_partitioning_it_waited_on_is_done():
    # Node n2 is being re-partitioned at the first run, so its H100 cannot be switched to MPS yet and a
    # waits; the next run (b's arrival, which needs only the A100 of n1) finds n2 done and admits a, though
    # nothing was released or admitted on n2 in between.
    shared = {"group": "g", "offers": ("mig", "mps-4"), "reconfiguring": True}
    result = run(
        fleet(
            gpu("n1/0", model=A100),
            gpu("n2/0", off=True, **shared),
            gpu("n2/1", model=A100, **shared),
        ),
        timed("a", 0, 100, (1, "1g.5gb", A100), (1, "mps-4")),
        timed("b", 5, 100, (1, "1g.5gb", A100)),
    )
    assert admitted(result) == {"a": 5, "b": 5}


def test_an_arrival_that_does_not_fit_waits_for_a_release():
    result = run(
        fleet(gpu("n1/0", off=True)), timed("a", 0, 100, (1, FULL_GPU)), timed("b", 10, 50, (1, FULL_GPU))
    )
    assert admitted(result) == {"a": 0, "b": 100}
    summary = result.summary
    assert summary.admitted == 2 and summary.requests == 2
    assert summary.served_slice_hours == pytest.approx(7 * (100 + 50) / HOUR)  # a full GPU is 7 slices
    assert (summary.mean_wait_seconds, summary.p95_wait_seconds) == (45, 90)
    assert [at for at, _ in summary.stranded] == [0, 10, 100, 150]


def test_a_request_that_fits_is_admitted_behind_one_that_does_not():
    f = fleet(gpu("n1/0", off=True), gpu("n1/1", off=True))
    result = run(
        f,
        timed("holder", 0, 1000, (1, FULL_GPU)),
        timed("big", 10, 100, (2, FULL_GPU)),
        timed("small", 20, 100, (1, FULL_GPU)),
    )
    assert admitted(result) == {"holder": 0, "big": 1000, "small": 20}


def test_after_the_grace_a_blocked_request_holds_back_its_competitors():
    f = fleet(gpu("n1/0", off=True), gpu("n1/1", off=True), gpu("n2/0", off=True, model=A100))
    requests = (
        timed("holder", 0, 1000, (1, FULL_GPU)),
        timed("big", 10, 100, (2, FULL_GPU)),
        timed("early", 12, 100, (1, FULL_GPU)),  # big has waited 2 s: not yet starving
        timed("late", 20, 100, (1, FULL_GPU)),  # big has waited 10 s: starving
        timed("other model", 30, 100, (1, FULL_GPU, A100)),
    )
    result = run(f, *requests, grace=5)
    # late waits for big, which waits for holder and early; then big holds both H100s for 100 s.
    assert admitted(result) == {"holder": 0, "big": 1000, "early": 12, "late": 1100, "other model": 30}
    without_grace = run(f, *requests)
    assert admitted(without_grace)["late"] == 112  # backfilled as soon as early was gone


def test_groups_part_competitors_and_a_request_without_a_group_competes_with_every_group():
    f = fleet(
        gpu("a/0", off=True, group="train"),
        gpu("a/1", off=True, group="train"),
        gpu("b/0", off=True, group="serve"),
    )
    requests = (
        timed("holder", 0, 1000, (1, FULL_GPU), group="train"),
        timed("big", 10, 100, (2, FULL_GPU), group="train"),
        timed("serving", 100, 50, (1, FULL_GPU), group="serve"),
        timed("anywhere", 200, 50, (1, FULL_GPU)),
    )
    result = run(f, *requests, grace=0)
    # serving is admitted while big starves, anywhere (which might take a train GPU) only once big is.
    assert admitted(result) == {"holder": 0, "big": 1000, "serving": 100, "anywhere": 1000}
    (anywhere,) = [o for o in run(f, *requests, grace=0, horizon=500).outcomes if o.request == "anywhere"]
    assert (anywhere.admitted_at, anywhere.placement.reason) == (None, BEHIND_OLDER)


def test_a_release_frees_the_instances_and_keeps_the_layout():
    result = run(fleet(gpu("n1/0")), timed("a", 0, 100, (1, "3g.40gb")), timed("b", 200, 50, (1, "3g.40gb")))
    a, b = (o.placement for o in result.outcomes)
    assert a.reconfigure == (Reconfigure("n1/0", True, (("3g.40gb", 0), ("3g.40gb", 4))),)
    assert b.reconfigure == () and b.assignments == (Assignment("n1/0", "3g.40gb", 0),)
    after = release(apply(fleet(gpu("n1/0")), a), a)
    assert [(s.profile, s.start, s.allocated) for s in after.gpus[0].instances] == [
        ("3g.40gb", 0, False),
        ("3g.40gb", 4, False),
    ]


def test_release_refuses_what_is_not_held():
    f = fleet(gpu("n1/0", "3g.40gb@0 3g.40gb@4*"), gpu("n1/1", off=True))
    with pytest.raises(ValueError, match=r"no allocated 3g\.40gb instance at 0"):
        release(f, Placement("r", True, assignments=(Assignment("n1/0", "3g.40gb", 0),)))
    with pytest.raises(ValueError, match="cannot be given back whole"):
        release(f, Placement("r", True, assignments=(Assignment("n1/1", FULL_GPU, None),)))
    with pytest.raises(ValueError, match="not in the fleet"):
        release(f, Placement("r", True, assignments=(Assignment("n9/9", FULL_GPU, None),)))
    assert release(f, Placement("r", False, reason="no")) is f


def test_stranded_slices_follow_the_layouts_over_time():
    # Four 1g.20gb take all eight memory slices and four of the seven compute slices: three are stranded.
    f = fleet(gpu("n1/0", "1g.20gb@0 1g.20gb@2 1g.20gb@4 1g.20gb@6"), gpu("n1/1", off=True, busy=True))
    assert stranded_slices(f) == 3
    result = run(f, timed("whole", 10, 100, (1, FULL_GPU)), timed("quarters", 200, 50, (4, "1g.20gb")))
    assert result.summary.stranded == ((10, 0), (110, 0), (200, 3), (250, 3))


def test_served_hours_count_compute_slices_until_the_horizon_and_waits_use_the_nearest_rank():
    f = fleet(gpu("n1/0", off=True), gpu("n1/1"))
    mixed = timed("mixed", 0, 10 * HOUR, (1, "4g.40gb"), (1, "2g.20gb"), (1, "1g.10gb"))  # 4 + 2 + 1 slices
    queued = [timed(f"w{n}", 0, 100, (1, FULL_GPU)) for n in range(20)]  # one after another on n1/0
    result = run(f, mixed, *queued, horizon=1950)
    assert [o.admitted_at for o in result.outcomes] == [0, *range(0, 2000, 100)]
    assert compute_slices(f, result.outcomes[0].placement) == 7
    # mixed and the last full GPU are held until the horizon only: 1950 s and 50 s.
    assert result.summary.served_slice_hours == pytest.approx(7 * (1950 + 19 * 100 + 50) / HOUR)
    # 21 waits 0, 0, 100, ..., 1900: the 95th percentile by nearest rank is the 20th, 1800.
    assert result.summary.p95_wait_seconds == 1800
    assert result.summary.mean_wait_seconds == pytest.approx(19000 / 21)


def test_a_pool_held_for_no_time_frees_its_gpus_after_the_run_that_admitted_it():
    f = fleet(gpu("n1/0", off=True))
    result = run(
        f,
        timed("blink", 10, 0, (1, FULL_GPU)),
        timed("next", 10, 5, (1, FULL_GPU)),
        timed("late", 50, 5, (1, "1g.10gb", A100)),
    )
    assert admitted(result) == {"blink": 10, "next": 50, "late": None}
    assert result.summary.served_slice_hours == pytest.approx(7 * 5 / HOUR)


def test_nothing_happens_after_the_horizon():
    result = run(
        fleet(gpu("n1/0", off=True)),
        timed("a", 0, 100, (1, FULL_GPU)),
        timed("b", 10, 5, (1, FULL_GPU)),
        timed("c", 200, 5, (1, FULL_GPU)),
        horizon=99,
    )
    assert admitted(result) == {"a": 0, "b": None, "c": None}
    assert result.outcomes[2].placement.reason == AFTER_HORIZON
    assert "1 × full" in result.outcomes[1].placement.reason  # the engine's reason it still waits
    assert [at for at, _ in result.summary.stranded] == [0, 10]
    assert result.summary.served_slice_hours == pytest.approx(7 * 99 / HOUR)


def test_no_request_admitted_has_no_waits():
    result = run(fleet(gpu("n1/0")), timed("a", 0, 100, (1, FULL_GPU, A100)))
    summary = result.summary
    assert (summary.admitted, summary.mean_wait_seconds, summary.p95_wait_seconds) == (0, None, None)


def test_the_placer_sees_the_queue_behind_and_the_recent_demand():
    seen = []

    def placer(fleet, request, *, upcoming, demand):
        seen.append((request.id, [r.id for r in upcoming], dict(demand)))
        return place(fleet, request, upcoming=upcoming, demand=demand)

    f = fleet(gpu("n1/0", off=True))
    requests = [timed("a", 0, 100, (1, FULL_GPU))] + [
        timed(f"q{n}", 1, 10, (1, "1g.10gb")) for n in range(QUEUE_WINDOW + 2)
    ]
    simulate(SimulationTrace(f, tuple(requests), 50), placer=placer, demand_window_seconds=100)
    assert seen[0] == ("a", [], {(H100, FULL_GPU): 1.0})
    request, upcoming, demand = seen[1]
    assert request == "q0" and upcoming == [f"q{n}" for n in range(1, QUEUE_WINDOW + 1)]
    assert demand[(H100, FULL_GPU)] == pytest.approx(0.5 ** (1 / 50))
    assert demand[(H100, "1g.10gb")] == pytest.approx(QUEUE_WINDOW + 2)
    assert len(seen) == 1 + QUEUE_WINDOW + 2  # at second 1 each is tried once; nothing changes before 50


def test_the_demand_window_leaves_out_its_oldest_second_as_the_queue_does():
    seen = []

    def placer(fleet, request, *, upcoming, demand):
        seen.append((request.id, demand))
        return place(fleet, request, upcoming=upcoming, demand=demand)

    f = fleet(gpu("n1/0", off=True), gpu("n1/1", off=True))
    requests = (timed("old", 0, 10, (1, FULL_GPU)), timed("new", 100, 10, (1, "1g.10gb")))
    simulate(SimulationTrace(f, requests, 200), placer=placer, demand_window_seconds=100)
    assert seen == [("old", {(H100, FULL_GPU): 1.0}), ("new", {(H100, "1g.10gb"): 1.0})]
    seen.clear()
    # Tried again once nothing of the window is left: no demand is told as None, as the queue tells it.
    requests = (timed("holder", 0, 150, (2, FULL_GPU)), timed("waiter", 0, 10, (1, FULL_GPU)))
    simulate(SimulationTrace(f, requests, 200), placer=placer, demand_window_seconds=100)
    assert seen[0][0] == "holder" and seen[-1] == ("waiter", None)


# --- the replay check catches each broken rule ----------------------------------------------------------


def _tampered(trace, result, position, **changes):
    outcomes = list(result.outcomes)
    outcomes[position] = replace(outcomes[position], **changes)
    return check(trace, outcomes)


def test_the_replay_check_names_each_broken_rule():
    f = fleet(gpu("n1/0"), gpu("n1/1", off=True))
    requests = (
        timed("a", 0, 100, (1, "3g.40gb")),
        timed("b", 10, 100, (1, "3g.40gb")),
        timed("c", 20, 100, (1, FULL_GPU)),
    )
    trace = SimulationTrace(f, requests, 1000)
    result = simulate(trace)
    assert check(trace, result.outcomes) == []
    a, b, _c = result.outcomes
    twice = replace(b.placement, assignments=a.placement.assignments)
    assert any("no free 3g.40gb instance at 0" in p for p in _tampered(trace, result, 1, placement=twice))
    recut = replace(
        b.placement,
        reconfigure=(Reconfigure("n1/0", True, (("7g.80gb", 0),)),),
        assignments=(Assignment("n1/0", "7g.80gb", 0),),
    )
    problems = _tampered(trace, result, 1, placement=recut)
    assert any("holds allocated work: its layout or share mode cannot change" in p for p in problems)
    assert any("asked for 1 × H100-80GB 3g.40gb and was given 1 × H100-80GB 7g.80gb" in p for p in problems)
    bad_layout = replace(
        a.placement,
        reconfigure=(Reconfigure("n1/0", True, (("4g.40gb", 0), ("4g.40gb", 4))),),
        assignments=(Assignment("n1/0", "4g.40gb", 0),),
    )
    assert any(
        "does not fit on one H100-80GB" in p for p in _tampered(trace, result, 0, placement=bad_layout)
    )
    assert any("before it arrived" in p for p in _tampered(trace, result, 2, admitted_at=5))
    assert any("no queue ran then" in p for p in _tampered(trace, result, 2, admitted_at=21))
    assert any("after the horizon" in p for p in _tampered(trace, result, 2, admitted_at=1100))
    assert any("is not admitted, yet" in p for p in _tampered(trace, result, 2, admitted_at=None))
    assert check(trace, result.outcomes[:2]) == ["2 outcomes for the 3 requests of the trace."]


# --- recent demand --------------------------------------------------------------------------------------


def test_recent_demand_halves_every_half_window_and_forgets_what_is_older():
    day = 86400
    arrivals = [
        (10 * day, [Item(H100, "1g.10gb", 2)]),  # now: in full
        (10 * day - 3.5 * day, [Item(H100, "1g.10gb", 4)]),  # half a window ago: half
        (3 * day, [Item(H100, "1g.10gb", 8), Item(H100, FULL_GPU, 1)]),  # a whole window ago: a quarter
        (3 * day - 1, [Item(H100, "3g.40gb", 100)]),  # older: nothing
        (10 * day + 1, [Item(H100, "7g.80gb", 100)]),  # later than now: not known yet
    ]
    demand = recent_demand(arrivals, now=10 * day, window_seconds=DEMAND_WINDOW_SECONDS)
    assert demand == pytest.approx({(H100, "1g.10gb"): 2 + 4 / 2 + 8 / 4, (H100, FULL_GPU): 1 / 4})
    assert 7 * day == DEMAND_WINDOW_SECONDS
    assert recent_demand([], now=0, window_seconds=1) == {}
    with pytest.raises(ValueError, match="positive number of seconds"):
        recent_demand(arrivals, now=0, window_seconds=0)


@given(
    st.lists(
        st.tuples(st.integers(0, 1000), st.integers(1, 5), st.sampled_from(["1g.10gb", "full"])), max_size=8
    ),
    st.integers(0, 1200),
    st.integers(1, 900),
    st.integers(0, 2_000_000_000),
)
def test_recent_demand_depends_on_ages_only_and_grows_with_what_arrives(raw, now, window, epoch):
    arrivals = [(at, [Item(H100, profile, count)]) for at, count, profile in raw]
    demand = recent_demand(arrivals, now=now, window_seconds=window)
    shifted = recent_demand(
        [(at + epoch, items) for at, items in arrivals], now=now + epoch, window_seconds=window
    )
    assert shifted.keys() == demand.keys()
    assert all(shifted[key] == pytest.approx(demand[key]) for key in demand)
    for key, value in demand.items():
        counted = sum(
            i.count
            for at, items in arrivals
            for i in items
            if (i.model, i.profile) == key and 0 <= now - at <= window
        )
        assert counted / 4 - 1e-9 <= value <= counted + 1e-9
    more = recent_demand([*arrivals, (now, [Item(H100, "1g.10gb", 1)])], now=now, window_seconds=window)
    assert more[(H100, "1g.10gb")] == pytest.approx(demand.get((H100, "1g.10gb"), 0) + 1)
