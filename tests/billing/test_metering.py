"""Metering arithmetic, property-based: whatever the times and however the runs fall, each pool is
metered for exactly the whole seconds it held its capacity, once."""

from dataclasses import astuple
from datetime import UTC, datetime

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from billing.metering import (
    Holding,
    billable_seconds,
    bounded,
    ended_periods,
    held,
    moment,
    period_start,
    usage_in_period,
    usage_in_periods,
    whole_seconds,
)
from tests.examples import examples

PERIOD = 3600
# Every period length the settings allow (billing.apps.check_metering).
PERIODS = [period for period in range(60, 3601) if 3600 % period == 0]
# Around the end of November 2026 in Seoul (2026-11-30 15:00 UTC), give or take two days.
MONTH_END = int(datetime(2026, 11, 30, 15, tzinfo=UTC).timestamp())
moments = st.integers(MONTH_END - 2 * 86400, MONTH_END + 2 * 86400)


@st.composite
def holdings(draw) -> Holding:
    reserved = draw(moments)
    released = draw(st.one_of(st.none(), st.integers(reserved, reserved + 3 * 86400)))
    return Holding(1, "H100-80GB", "1g.10gb", draw(st.integers(1, 7)), reserved, released)


def run_all(holding: Holding, runs: list[int], delay: int = 60) -> tuple[int, int | None]:
    """The watermark algorithm of billing.services.meter on one holding: (metered seconds, metered until)."""
    metered: set[int] = set()
    next_start = period_start(holding.reserved, PERIOD)
    for now in runs:
        for start in ended_periods(next_start, now, PERIOD, delay):
            assert start not in metered  # a period is metered once
            metered.add(start)
            next_start = start + PERIOD
    total = sum(u.seconds for start in metered for u in usage_in_period([holding], start, PERIOD))
    return total, (max(metered) + PERIOD if metered else None)


@settings(max_examples=examples(500), deadline=None)
@given(holdings(), st.lists(moments, max_size=8))
def test_any_runs_meter_exactly_what_was_held_up_to_where_they_reached(holding, runs):
    runs = sorted(runs)  # the clock only moves forward; runs may repeat and come late
    total, until = run_all(holding, runs)
    assert total == (billable_seconds(holding, until) if until else 0)


@settings(max_examples=examples(500), deadline=None)
@given(holdings(), st.lists(moments, max_size=4))
def test_once_released_and_metered_the_total_is_the_exact_duration(holding, runs):
    released = holding.released if holding.released is not None else holding.reserved + 86400
    holding = Holding(1, "H100-80GB", "full", holding.count, holding.reserved, released)
    total, _until = run_all(holding, [*sorted(runs), released + PERIOD + 61])
    assert total == holding.count * (released - holding.reserved)


@settings(max_examples=examples(300), deadline=None)
@given(holdings(), moments)
def test_usage_in_each_period_never_exceeds_the_period(holding, start):
    start = period_start(start, PERIOD)
    assert 0 <= held(holding, start, PERIOD) <= PERIOD


def test_whole_seconds_drop_fractions_and_need_a_time_zone():
    assert whole_seconds(datetime(2026, 12, 1, 0, 0, 0, 999999, tzinfo=UTC)) == whole_seconds(
        datetime(2026, 12, 1, tzinfo=UTC)
    )
    assert moment(whole_seconds(datetime(2026, 12, 1, tzinfo=UTC))) == datetime(2026, 12, 1, tzinfo=UTC)
    with pytest.raises(ValueError, match="aware"):
        whole_seconds(datetime(2026, 12, 1))


def test_a_period_is_metered_only_once_its_end_is_delay_seconds_past():
    start = period_start(MONTH_END, PERIOD)
    assert list(ended_periods(start, start + PERIOD + 59, PERIOD, delay=60)) == []
    assert list(ended_periods(start, start + PERIOD + 60, PERIOD, delay=60)) == [start]
    with pytest.raises(ValueError, match="not the start"):
        ended_periods(start + 1, start + 10 * PERIOD, PERIOD)


def test_a_holding_ending_inside_a_period_counts_only_its_part():
    start = period_start(MONTH_END, PERIOD)
    holding = Holding(7, "H200-141GB", "3g.71gb", 2, start + 100, start + 1000)
    (usage,) = usage_in_period([holding], start, PERIOD)
    assert (usage.pool_id, usage.count, usage.seconds) == (7, 2, 2 * 900)
    assert usage_in_period([holding], start + PERIOD, PERIOD) == []


@st.composite
def spans(draw) -> range:
    """Up to 400 consecutive periods of any allowed length."""
    period = draw(st.sampled_from(PERIODS))
    first = period_start(draw(moments), period)
    return range(first, first + draw(st.integers(0, 400)) * period, period)


@settings(max_examples=examples(200), deadline=None)
@given(st.lists(holdings(), max_size=5), spans())
def test_usage_over_many_periods_is_the_usage_of_each_period(found, starts):
    # Many periods at once give exactly what one period at a time gives, whatever the period.
    expected = [usage for start in starts for usage in usage_in_period(found, start, starts.step)]
    assert sorted(usage_in_periods(found, starts), key=astuple) == sorted(expected, key=astuple)


@settings(max_examples=examples(200), deadline=None)
@given(st.lists(holdings(), max_size=5), spans(), st.integers(0, 200))
def test_a_transaction_meters_the_most_periods_that_fit_and_never_none(found, starts, records):
    part = bounded(found, starts, records)
    assert part == starts[: len(part)] and (len(part) >= 1 or not starts)
    assert len(usage_in_periods(found, part)) <= records or len(part) == 1
    if len(part) < len(starts):  # one period more would not fit
        assert len(usage_in_periods(found, starts[: len(part) + 1])) > records


@st.composite
def resized(draw) -> tuple[list[tuple[str, int, int | None]], int | None]:
    """A pool's allocations after a sequence of grows and shrinks: each (spec, reserved, released or None),
    and the pool's end date (None: no end). A grow reserves new instances at its moment; a shrink releases
    some of those live at its moment; the pool's release, where it comes, frees the rest."""
    clock = draw(moments)
    live: list[list] = [["1g.10gb", clock, None] for _ in range(draw(st.integers(1, 4)))]
    done: list[list] = []
    for grow, step in draw(st.lists(st.tuples(st.booleans(), st.integers(1, 40_000)), max_size=12)):
        clock += step
        if grow:
            live += [
                [draw(st.sampled_from(["1g.10gb", "3g.40gb"])), clock, None]
                for _ in range(draw(st.integers(1, 3)))
            ]
        elif len(live) > 1:
            for _ in range(draw(st.integers(1, len(live) - 1))):
                gone = live.pop(draw(st.integers(0, len(live) - 1)))
                gone[2] = clock
                done.append(gone)
    if draw(st.booleans()):
        clock += draw(st.integers(1, 40_000))
        for allocation in live:
            allocation[2] = clock
    ends = draw(st.one_of(st.none(), st.integers(done[0][1] if done else live[0][1], clock + 86_400)))
    return [tuple(a) for a in done + live], ends


@settings(max_examples=examples(300), deadline=None)
@given(resized(), st.sampled_from(PERIODS))
def test_for_any_grows_and_shrinks_each_allocation_is_metered_for_exactly_its_time(pool, period):
    # Each allocation a holding of its own, as billing.services reads them; metering merges them per spec and
    # period, and what it writes adds up, per period and in all, to each allocation's own time held.
    allocations, ends = pool
    found = [
        Holding(1, "H100-80GB", profile, 1, reserved, released, ends)
        for profile, reserved, released in allocations
    ]
    first = period_start(min(h.reserved for h in found), period)
    last = max((h.until or h.reserved) for h in found) + period
    starts = range(first, period_start(last, period) + period, period)
    usages = usage_in_periods(found, starts)
    assert len({(u.profile, u.period_start) for u in usages}) == len(usages)  # one record per spec and period
    for usage in usages:
        alone = [held(h, usage.period_start, period) for h in found if h.profile == usage.profile]
        assert usage.seconds == sum(alone) and usage.count == sum(1 for s in alone if s)
    exact = sum(max(0, (h.until if h.until is not None else starts.stop) - h.reserved) for h in found)
    assert sum(u.seconds for u in usages) == exact
