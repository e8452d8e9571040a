"""The engine reads large buckets from their ranks (pools/placement/ranks.py) and the rest node by node: both
ways give the same answers, in the same order, as fleets change in place and older fleets are read again."""

import pickle
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import replace
from unittest import mock

import pytest
from hypothesis import given
from hypothesis import strategies as st

from bench.placement import engine_fleet, engine_request
from bench.placement_mixed import mixed_fleet, mixed_requests
from bench.placement_trace import random_trace
from pools import placement as engine
from pools.placement import Fleet, apply, fleet_index, place, shortfall
from pools.placement import ranks as ranks_module
from pools.placement.backfill import room_out_of_the_way
from pools.placement.choices import blank_entry, full_entry, usable_entry
from pools.placement.holds import fence, placement_gpus
from pools.placement.plan import Plan
from pools.placement.ranks import BLANK_TABLES, BucketRanks, Ranked, ranks_of
from pools.placement.simulation import release
from tests.pools.test_placement import H100, ask, fleet, gpu
from tests.pools.test_placement_properties import PROPERTY, gpus_, requests_

# Every bucket keeps ranks, all built with its index or each on first use; or no bucket keeps any.
EAGER, LAZY, NONE = (0, 0), (0, 10**9), (10**9, 10**9)  # RANKED_NODES, EAGER_NODES


@contextmanager
def ranking(mode: tuple[int, int]) -> Iterator[None]:
    ranked, eager = mode
    with (
        mock.patch.object(ranks_module, "RANKED_NODES", ranked),
        mock.patch.object(ranks_module, "EAGER_NODES", eager),
    ):
        yield


@st.composite
def fleets_(draw) -> Fleet:
    """Fleets as test_placement_properties draws them, some GPUs moved to a group of their own, so that some
    nodes have GPUs of one model in two buckets."""
    f = draw(gpus_())
    return Fleet(tuple(replace(g, group="h") if draw(st.integers(0, 4)) == 0 else g for g in f.gpus))


# What happens after each request is placed and applied: nothing more, the oldest pool released, what it
# took fenced off (as a hold does), or the next request placed on an older fleet instead.
STEPS = ["next", "next", "next", "release", "fence", "older"]


@st.composite
def steps_(draw) -> tuple:
    request = draw(requests_())
    request = replace(
        request,
        reclaimable=draw(st.booleans()),
        ends=draw(st.sampled_from([None, None, 5, 50, 500])),
    )
    demand = draw(st.sampled_from([None, None, {(H100, "1g.10gb"): 3.0, (H100, "3g.40gb"): 1.0}]))
    return request, draw(st.sampled_from(STEPS)), draw(st.integers(0, 50)), demand


def run(f: Fleet, steps: list[tuple]) -> tuple[list, list[Fleet]]:
    """Every answer of the steps on `f`, and every fleet they made."""
    fleets, held = [f], [()]  # each fleet, and the placements it holds, oldest first
    answers = []
    current = 0
    for number, (request, step, pick, demand) in enumerate(steps):
        request = replace(request, id=f"r{number}")
        upcoming = [s[0] for s in steps[number + 1 :]]
        placement = place(fleets[current], request, upcoming=upcoming, demand=demand)
        reason = placement.reason.as_data() if hasattr(placement.reason, "as_data") else placement.reason
        answers.append((placement, reason, shortfall(fleets[current], request)))
        answers.append(room_out_of_the_way(fleets[current], request.items))
        after, holding = apply(fleets[current], placement), held[current]
        if placement.placed:
            holding += (placement,)
        if step == "release" and holding:
            after, holding = release(after, holding[0]), holding[1:]
        elif step == "fence" and placement.placed:
            after = fence(after, placement_gpus(placement))
        fleets.append(after)
        held.append(holding)
        current = pick % len(fleets) if step == "older" else len(fleets) - 1
    return answers, fleets


@PROPERTY
@given(fleets_(), st.lists(steps_(), min_size=1, max_size=8))
def test_the_ranks_answer_as_reading_every_node_does(f, steps):
    with ranking(NONE):
        read, read_fleets = run(Fleet(f.gpus), steps)
    for mode in (EAGER, LAZY):
        with ranking(mode):
            ranked, ranked_fleets = run(Fleet(f.gpus), steps)
        assert ranked == read
        assert ranked_fleets == read_fleets


def _queue(requests: list) -> list[tuple]:
    """Steps over a queue: each kind of step in turn, ends and reclaimable work among the requests."""
    return [
        (replace(r, ends=(n * 37) % 500 or None, reclaimable=n % 3 == 0), STEPS[n % len(STEPS)], 7 * n, None)
        for n, r in enumerate(requests)
    ]


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_the_ranks_answer_as_reading_every_node_does_on_fleets_of_many_equal_nodes(seed):
    """The benchmarks' fleets, smaller: many nodes alike, so that ties between them decide."""
    trace = random_trace(seed, nodes=30, requests=120)
    fleets = [
        (mixed_fleet(seed, 30), mixed_requests(seed, 120)),
        (engine_fleet(engine, trace.gpus), [engine_request(engine, r) for r in trace.requests]),
    ]
    for f, requests in fleets:
        with ranking(NONE):
            read = run(Fleet(f.gpus), _queue(requests))
        for mode in (EAGER, LAZY):
            with ranking(mode):
                assert run(Fleet(f.gpus), _queue(requests)) == read


def _ranked(ranked: Ranked) -> tuple:
    return dict(ranked.entries), {cls: list(members) for cls, members in ranked.classes.items()}


def ranks_summary(ranks: BucketRanks, built: BucketRanks) -> tuple:
    """The ranks `built` has built so far, read from `ranks` as plain data: every member's class and order,
    every class in order, and the counts."""
    partial = {}
    for profile in built._partial:
        found = ranks.partial(profile)
        by_end = {end: set(kinds) for end, kinds in found.by_end.items()}
        partial[profile] = (_ranked(found.ranked), by_end, found.ends)
    whole_slots = {profile: _ranked(ranks.whole_slots(profile)) for profile in built._whole_slots}
    nodes = {choice: _ranked(ranks._ranked(choice)) for choice in built._nodes}
    if built._counts is None:
        return partial, whole_slots, nodes
    counts = ranks.counts
    return (
        partial,
        whole_slots,
        nodes,
        counts.blank,
        counts.whole,
        {sharing: n for sharing, n in counts.mig_whole.items() if n},
        {sharing: n for sharing, n in counts.convertible.items() if n},
    )


@PROPERTY
@given(fleets_(), st.lists(steps_(), min_size=1, max_size=8), st.randoms(use_true_random=False))
def test_the_ranks_kept_are_those_built_afresh(f, steps, rnd):
    """Kept up to date node by node, through changes and checkouts of older fleets, the ranks are what the
    tables of the fleet read now give."""
    for mode in (EAGER, LAZY):
        with ranking(mode):
            _answers, fleets = run(Fleet(f.gpus), steps)
            for found in rnd.sample(fleets, len(fleets)):
                index = fleet_index(found)
                for bucket in index.buckets.values():
                    kept = ranks_of(index, bucket)
                    afresh = BucketRanks(index, bucket, eager=True)
                    assert ranks_summary(kept, kept) == ranks_summary(afresh, kept)


@PROPERTY
@given(fleets_(), st.lists(steps_(), min_size=1, max_size=6))
def test_the_ranks_read_each_node_as_the_plan_reads_it(f, steps):
    """Each node a rank keeps has the class and order the plan reads for it when it has touched nothing."""
    untouched = Plan()
    with ranking(LAZY):
        _answers, fleets = run(f, steps)
        for found in fleets:
            index = fleet_index(found)
            for bucket in index.buckets.values():
                ranks, model = ranks_of(index, bucket), bucket.key[1]
                for node in set(bucket.members) - ranks.split:
                    full = full_entry(index, [bucket], node, untouched, model)
                    assert ranks.full.entries.get(node) == (full and full[:2])
                    for table in BLANK_TABLES:
                        blank = blank_entry(index, [bucket], table, node, untouched)
                        assert ranks.blank(table).entries.get(node) == (blank and blank[:2])
                    usable = usable_entry(index, [bucket], node, untouched, model, "no mode")
                    assert ranks.usable.entries.get(node) == (usable and usable[:2])
                    whole = ranks.whole_sharing.entries.get(node)
                    assert whole == (
                        (index.sharing(node), (bucket.number, bucket.whole.since[node]))
                        if node in bucket.whole
                        else None
                    )


def test_a_fleet_made_by_a_change_reads_its_own_gpus_whenever_asked():
    f = fleet(gpu("n1/0"), gpu("n1/1", "1g.10gb@0 3g.40gb@4*"), gpu("n2/0", off=True))
    first_placement = place(f, ask((2, "1g.10gb")))
    first = apply(f, first_placement)
    second_placement = place(first, ask((1, "full")))
    second = apply(first, second_placement)
    third_placement = place(first, ask((1, "3g.40gb")))
    third = apply(first, third_placement)  # another branch from `first`
    # Read last made first: each reads what applying its change to a fleet built afresh gives.
    assert third.gpus == apply(Fleet(first.gpus), third_placement).gpus
    assert second.gpus == apply(Fleet(first.gpus), second_placement).gpus
    assert first.gpus == apply(Fleet(f.gpus), first_placement).gpus
    assert [g.allocated for g in second.gpus] == [False, False, True]
    assert pickle.loads(pickle.dumps(second)) == second == Fleet(second.gpus)
