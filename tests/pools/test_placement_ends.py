"""Placement that knows when pools end, as properties (hypothesis): ends that tell nothing apart change no
answer, a request's instances go where they extend a GPU's busy time least (then beside the work that ends
soonest after them) when all else is equal, applied
work carries its request's end and gives it up when released, and the simulator tells the engine each
request's declared end (never its true hold) in answers that pass the replay check."""

from dataclasses import replace

import pytest
from hypothesis import given
from hypothesis import strategies as st

from pools.placement import Fleet, Item, Request, apply, place, place_all
from pools.placement.replay import check
from pools.placement.simulation import SimulationTrace, TimedRequest, release, simulate
from tests.pools.test_placement import H100, fleet, gpu
from tests.pools.test_placement_properties import PROPERTY, gpus_, requests_
from tests.pools.test_simulation_properties import traces_

ENDS = st.one_of(st.none(), st.integers(0, 10**6))


def with_ends(f: Fleet, ends: int | None) -> Fleet:
    """The fleet with every allocated instance and every whole GPU in use ending at `ends`."""
    return Fleet(
        tuple(
            replace(
                g,
                ends=ends if g.allocated else None,
                instances=tuple(replace(s, ends=ends) if s.allocated else s for s in g.instances),
            )
            for g in f.gpus
        )
    )


def answer(placement):
    """A placement as the queue reads it: where each instance goes and which GPUs are re-cut how."""
    return (placement.placed, placement.reason, placement.reconfigure, placement.assignments)


# --- ends that tell no GPU apart change nothing -----------------------------------------------------------


@PROPERTY
@given(gpus_(), requests_(), st.lists(requests_(id="q"), max_size=3), ENDS)
def test_ends_equal_everywhere_place_as_no_ends_at_all(f, request, upcoming, ends):
    """Work that all ends at one time, and a request that ends then too (or whose end is unknown), is
    placed as if no end were known anywhere: the order of GPUs that hold work is the one without ends."""
    before = place(f, request, upcoming=upcoming)
    assert answer(place(with_ends(f, ends), replace(request, ends=ends), upcoming=upcoming)) == answer(before)
    assert answer(place(with_ends(f, ends), replace(request, ends=None), upcoming=upcoming)) == answer(before)
    assert answer(place(f, replace(request, ends=ends), upcoming=upcoming)) == answer(before)


@PROPERTY
@given(gpus_(), st.lists(requests_(), min_size=1, max_size=5))
def test_a_queue_with_no_ends_is_placed_as_before_and_carries_none(f, requests):
    placements, after = place_all(f, requests)
    assert all(p.ends is None for p in placements)
    assert all(s.ends is None for g in after.gpus for s in g.instances) and all(
        g.ends is None for g in after.gpus
    )


# --- least extension first, then the soonest end after, all else equal ----------------------------------


def best_fits(request_ends: int | None, gpu_ends: dict[str, int | None]) -> set[str]:
    """The GPUs a pool ending at `request_ends` fits best beside, no end known counting as far away: those
    whose work it outlasts least, and among those whose work it does not outlast, whose work ends soonest
    after it (a known end before one far away)."""
    known = {name: ends for name, ends in gpu_ends.items() if ends is not None}
    far = set(gpu_ends) - set(known)
    if request_ends is None:
        latest = max(known.values(), default=None)
        return far or {name for name, ends in known.items() if ends == latest}
    after = {name: ends - request_ends for name, ends in known.items() if ends >= request_ends}
    if after:
        return {name for name, left in after.items() if left == min(after.values())}
    if far:
        return far
    return {name for name, ends in known.items() if ends == max(known.values())}


@PROPERTY
@given(st.lists(ENDS, min_size=2, max_size=6), ENDS, st.booleans())
def test_a_request_goes_where_it_extends_the_gpus_busy_time_least(ends, request_ends, reclaimable):
    """GPUs alike in all but when their one tenant's work ends: the request's instance goes to one it fits
    best beside."""
    gpus = []
    for n, end in enumerate(ends):
        g = gpu(f"n{n}/0", "3g.40gb@0* 1g.10gb@4 1g.10gb@5 1g.10gb@6")
        tenant = replace(g.instances[0], ends=end, reclaimable=reclaimable)
        gpus.append(replace(g, instances=(tenant, *g.instances[1:])))
    f = fleet(*gpus)
    placement = place(
        f, Request("r", (Item(H100, "1g.10gb", 1),), ends=request_ends, reclaimable=reclaimable)
    )
    (assignment,) = placement.assignments
    assert placement.reconfigure == ()
    assert assignment.gpu in best_fits(request_ends, {g.id: e for g, e in zip(gpus, ends, strict=True)})


def ending(*ends: int | None) -> Fleet:
    """GPUs n0/0, n1/0, ... alike, each with one tenant whose work ends at the given end."""
    gpus = []
    for n, end in enumerate(ends):
        g = gpu(f"n{n}/0", "3g.40gb@0* 1g.10gb@4")
        gpus.append(replace(g, instances=(replace(g.instances[0], ends=end), g.instances[1])))
    return fleet(*gpus)


def test_a_gpu_that_stays_busy_anyway_beats_one_nearer_in_time_that_would_come_free():
    """Work ending at 100 and at 5000: a pool ending at 300 goes beside the latter, which stays busy after it
    anyway, not beside the former, nearer in time but kept from coming free 200 longer."""
    one = Request("r", (Item(H100, "1g.10gb", 1),), ends=300)
    assert place(ending(100, 5000), one).assignments[0].gpu == "n1/0"
    assert place(ending(100, 200), one).assignments[0].gpu == "n1/0"  # both extended: the least
    assert place(ending(5000, 400), one).assignments[0].gpu == "n1/0"  # neither: the soonest end after it


def test_an_end_far_away_counts_later_than_any_known_end():
    """No end known is far away: such a request goes beside work with no end, else beside the work that
    ends last; a request with an end goes beside work it does not outlast, with a known end before work
    with none, and beside work with no end before work it would outlast."""
    f = ending(100, 5000, None)
    one = Request("r", (Item(H100, "1g.10gb", 1),))
    assert place(f, one).assignments[0].gpu == "n2/0"
    assert place(f, replace(one, ends=50)).assignments[0].gpu == "n0/0"
    assert place(f, replace(one, ends=200)).assignments[0].gpu == "n1/0"
    assert place(f, replace(one, ends=4000)).assignments[0].gpu == "n1/0"
    assert place(f, replace(one, ends=6000)).assignments[0].gpu == "n2/0"
    without_far = Fleet(f.gpus[:2])
    assert place(without_far, one).assignments[0].gpu == "n1/0"
    assert place(without_far, replace(one, ends=6000)).assignments[0].gpu == "n1/0"


def test_the_latest_end_of_a_gpus_work_is_its_end_and_the_rules_before_it_still_come_first():
    """A GPU's work ends when its last tenant's does; work that may not be reclaimed still goes last to GPUs
    whose work all may, however near their ends."""
    early_and_late = gpu("a/0", "1g.10gb@0* 1g.10gb@1* 1g.10gb@2")
    early_and_late = replace(
        early_and_late,
        instances=(
            replace(early_and_late.instances[0], ends=100),
            replace(early_and_late.instances[1], ends=9000),
            early_and_late.instances[2],
        ),
    )
    middling = gpu("b/0", "1g.10gb@0* 1g.10gb@1")
    middling = replace(middling, instances=(replace(middling.instances[0], ends=3000), middling.instances[1]))
    one = Request("r", (Item(H100, "1g.10gb", 1),), ends=8000)
    assert place(fleet(early_and_late, middling), one).assignments[0].gpu == "a/0"
    assert place(fleet(early_and_late, middling), replace(one, ends=150)).assignments[0].gpu == "b/0"
    borrowed = gpu("c/0", "1g.10gb@0+ 1g.10gb@1")
    borrowed = replace(borrowed, instances=(replace(borrowed.instances[0], ends=150), borrowed.instances[1]))
    within = replace(one, ends=150)
    assert place(fleet(borrowed, middling), within).assignments[0].gpu == "b/0"
    assert place(fleet(borrowed, middling), replace(within, reclaimable=True)).assignments[0].gpu == "c/0"


# --- applied work carries its end ------------------------------------------------------------------------


@PROPERTY
@given(gpus_(), requests_(), ENDS)
def test_applied_work_carries_the_requests_end_and_gives_it_up_when_released(f, request, ends):
    placement = place(f, replace(request, ends=ends))
    assert placement.ends == (ends if placement.placed else None)
    after = apply(f, placement)
    gpus = {g.id: g for g in after.gpus}
    for a in placement.assignments:
        g = gpus[a.gpu]
        if a.start is None:
            assert g.allocated and g.ends == ends
        else:
            (slot,) = [s for s in g.instances if s.start == a.start]
            assert slot.allocated and slot.ends == ends
    freed = {g.id: g for g in release(after, placement).gpus}
    for a in placement.assignments:
        assert freed[a.gpu].ends is None
        assert all(s.ends is None for s in freed[a.gpu].instances if not s.allocated)


# --- the simulator tells declared ends -------------------------------------------------------------------


@st.composite
def declared_traces_(draw) -> SimulationTrace:
    trace = draw(traces_())
    requests = tuple(
        replace(timed, declared_hold=draw(st.sampled_from([None, 0, 10, 50, 500])))
        for timed in trace.requests
    )
    return replace(trace, requests=requests)


@PROPERTY
@given(declared_traces_())
def test_the_simulator_tells_the_declared_end_and_its_answers_pass_the_replay_check(trace):
    asked: dict[str, set] = {}

    def spying(f, request, **context):
        asked.setdefault(request.id, set()).add(request.ends)
        return place(f, request, **context)

    result = simulate(trace, placer=spying)
    assert check(trace, result.outcomes) == []
    assert result == simulate(trace)
    for timed, outcome in zip(trace.requests, result.outcomes, strict=True):
        if timed.declared_hold is None:
            assert asked.get(timed.id, {None}) == {None}
        if outcome.admitted_at is not None:
            declared = None if timed.declared_hold is None else outcome.admitted_at + timed.declared_hold
            assert outcome.placement.ends == declared
            assert declared in asked[timed.id]


def test_the_simulator_puts_a_pool_beside_work_that_ends_when_it_does():
    """Two GPUs alike but for when their tenant's declared end falls; the third request, declaring an end
    like the second's, is put beside it; without declared ends, beside the first (fleet order)."""
    f = fleet(gpu("a/0", "4g.40gb@0 1g.10gb@4 1g.10gb@5"), gpu("b/0", "4g.40gb@0 1g.10gb@4 1g.10gb@5"))
    four = (Item(H100, "4g.40gb", 1),)
    one = (Item(H100, "1g.10gb", 1),)
    requests = (
        TimedRequest("short", 0, 100, four, declared_hold=100),
        TimedRequest("long", 0, 5000, four, declared_hold=5000),
        TimedRequest("new", 10, 4000, one, declared_hold=4990),
    )
    trace = SimulationTrace(f, requests, 10000)
    result = simulate(trace)
    assert check(trace, result.outcomes) == []
    where = {o.request: o.placement.assignments[0].gpu for o in result.outcomes}
    assert where["new"] == where["long"] != where["short"]
    blind = replace(trace, requests=tuple(replace(r, declared_hold=None) for r in requests))
    where = {o.request: o.placement.assignments[0].gpu for o in simulate(blind).outcomes}
    assert where["new"] == where["short"]


@pytest.mark.parametrize("ends", [None, 7])
def test_a_gpu_given_whole_carries_the_end(ends):
    f = fleet(gpu("a/0", off=True))
    placement = place(f, Request("r", (Item(H100, "full", 1),), ends=ends))
    assert apply(f, placement).gpus[0].ends == ends
