"""A what-if run's figures over time (pools/placement/whatif.py `series_of`): utilisation, stranded compute
slices, requests waiting and the mean wait of those admitted, in buckets of whole hours, time-weighted,
capped in number; pure, checked by hand on small traces and against the run's own summary on random ones."""

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pools.placement import Fleet, Gpu, Item
from pools.placement.simulation import SimulationTrace, TimedRequest, simulate
from pools.placement.types import Slot
from pools.placement.whatif import MAX_POINTS, series_of
from tests.examples import examples

H100 = "H100-80GB"
HOUR = 3600


def whole(count: int) -> Fleet:
    return Fleet(tuple(Gpu(f"c/n/{i}", "c/n", H100, mig=False, cluster="c") for i in range(count)))


def full(rid: str, arrive: int, hold: int, count: int = 1) -> TimedRequest:
    return TimedRequest(rid, arrive, hold, (Item(H100, "full", count),))


def series(trace: SimulationTrace, **options) -> dict:
    return series_of(trace, simulate(trace), **options)


def test_a_request_waiting_behind_another_shows_in_its_hour():
    # One GPU: r1 holds it for half an hour, r2 arrives at 10 minutes and waits until r1 leaves.
    trace = SimulationTrace(whole(1), (full("r1", 0, 1800), full("r2", 600, 3600)), 2 * HOUR)
    assert series(trace) == {
        "step_seconds": HOUR,
        "compute_slices": 7,
        "at": [0, HOUR],
        "utilisation": [1.0, 0.5],  # r1, then r2 to 5400 s
        "stranded": [0.0, 0.0],
        "waiting": [0.33, 0.0],  # r2 waits 1200 of the first 3600 seconds
        "mean_wait_seconds": [600, None],  # r1 waited 0 and r2 1200, both admitted in the first hour
    }


def test_a_layout_that_strands_a_slice_counts_from_second_zero():
    two_halves = (Slot("3g.40gb", 0), Slot("3g.40gb", 4))  # six compute slices of seven: one stranded
    fleet = Fleet((Gpu("c/n/0", "c/n", H100, mig=True, instances=two_halves, cluster="c"),))
    request = TimedRequest("r", HOUR, HOUR, (Item(H100, "3g.40gb", 1),))
    found = series(SimulationTrace(fleet, (request,), 3 * HOUR))
    assert found["stranded"] == [1.0, 1.0, 1.0]
    assert found["utilisation"] == [0.0, round(3 / 7, 4), 0.0]


def test_the_last_bucket_is_cut_at_the_horizon_and_weighs_only_its_part():
    trace = SimulationTrace(whole(2), (full("r", 0, 10 * HOUR),), 3 * HOUR + 1800)
    found = series(trace)
    assert found["at"] == [0, HOUR, 2 * HOUR, 3 * HOUR]
    assert found["utilisation"] == [0.5, 0.5, 0.5, 0.5]  # held past the horizon: busy to the end


def test_a_month_is_cut_into_buckets_of_whole_hours_no_more_than_the_cap():
    month = 31 * 24 * HOUR
    trace = SimulationTrace(whole(1), (full("r", 0, HOUR),), month)
    found = series(trace)
    assert found["step_seconds"] == 2 * HOUR and len(found["at"]) == 372 <= MAX_POINTS
    assert all(len(found[key]) == 372 for key in ("utilisation", "stranded", "waiting", "mean_wait_seconds"))
    assert found["utilisation"][:2] == [0.5, 0.0]
    few = series(trace, max_points=10)
    assert few["step_seconds"] == 75 * HOUR and len(few["at"]) == 10


def test_a_fleet_without_gpus_has_no_utilisation():
    found = series(SimulationTrace(Fleet(()), (full("r", 0, 60),), HOUR))
    assert found["utilisation"] == [None] and found["waiting"] == [1.0] and found["compute_slices"] == 0


timed_requests = st.lists(
    st.tuples(
        st.integers(0, 20 * HOUR),
        st.integers(0, 8 * HOUR),
        st.integers(1, 3),
        st.sampled_from(["full", "1g.10gb"]),
    ),
    max_size=25,
)


@settings(max_examples=examples(40), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(timed_requests, st.integers(1, 30 * HOUR))
def test_the_series_adds_up_to_the_runs_own_figures(rows, horizon):
    rows = sorted(rows)
    requests = tuple(
        TimedRequest(f"r{n}", arrive, hold, (Item(H100, profile, count),))
        for n, (arrive, hold, count, profile) in enumerate(rows)
    )
    trace = SimulationTrace(whole(3), requests, horizon, backfill_grace_seconds=1800)
    result = simulate(trace)
    found = series_of(trace, result)
    widths = [min(horizon, at + found["step_seconds"]) - at for at in found["at"]]
    # Compute-slice-hours under the utilisation line are those the run served (values rounded to 4 places).
    served = sum(
        u * found["compute_slices"] * w / HOUR for u, w in zip(found["utilisation"], widths, strict=True)
    )
    assert (
        abs(served - result.summary.served_slice_hours) <= 0.0001 * found["compute_slices"] * horizon / HOUR
    )
    # Request-seconds under the waiting line are the waits up to the horizon (each value rounded to 2 places).
    waited = sum(
        min(o.admitted_at if o.admitted_at is not None else horizon, horizon) - r.arrive
        for r, o in zip(requests, result.outcomes, strict=True)
        if r.arrive <= horizon
    )
    assert (
        abs(sum(v * w for v, w in zip(found["waiting"], widths, strict=True)) - waited)
        <= 0.005 * horizon + 1e-6
    )
    # The stranded line stays within what the run counted after each event time, and the start.
    counts = [count for _at, count in result.summary.stranded] + [0]
    assert all(min(counts) - 1e-9 <= value <= max(counts) + 1e-9 for value in found["stranded"])
    admitted = [
        o.admitted_at - r.arrive
        for r, o in zip(requests, result.outcomes, strict=True)
        if o.admitted_at is not None
    ]
    means = [m for m in found["mean_wait_seconds"] if m is not None]
    assert (means == []) == (admitted == [])
