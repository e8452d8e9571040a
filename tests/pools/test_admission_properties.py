"""The admission policy on random fleets, quotas and request streams (pools/placement/admission.py, run by the
simulator as the queue runs it): every answer keeps the placement rules; no tenant ever holds beyond its
limit; no pool within its tenant's guarantee is ever reclaimed; a reclaim's end admits a request within its
guarantee at that very second; without quotas the policy is the one before quotas."""

from __future__ import annotations

from collections import Counter
from dataclasses import replace

from hypothesis import given
from hypothesis import strategies as st

from pools.placement.admission import Holding, Ledger, Quota, asked_slices, choose_victims, reclaim_candidates
from pools.placement.replay import check
from pools.placement.simulation import SimulationTrace, TimedRequest, held_until, requeued_requests, simulate
from tests.pools.test_placement_properties import PROPERTY, gpus_, requests_

TENANTS = ("a", "b", "c")


@st.composite
def quota_traces(draw) -> SimulationTrace:
    fleet = draw(gpus_())
    models = sorted({gpu.model for gpu in fleet.gpus})
    quotas = {}
    for tenant in TENANTS[: draw(st.integers(1, 3))]:
        keys = {}
        for model in draw(st.lists(st.sampled_from(models), unique=True, max_size=len(models))):
            guaranteed = draw(st.integers(0, 14))
            keys[("", model)] = Quota(guaranteed, draw(st.sampled_from([guaranteed, guaranteed + 7, None])))
        quotas[tenant] = keys
    requests, at = [], 0
    for n in range(draw(st.integers(1, 10))):
        at += draw(st.sampled_from([0, 0, 5, 20, 100]))
        request = draw(requests_())
        requests.append(
            TimedRequest(
                f"r{n}",
                at,
                draw(st.sampled_from([0, 30, 100, 400])),
                request.items,
                None,  # quotas count a request's purpose; these name none
                draw(st.sampled_from(sorted(quotas))),
                draw(st.sampled_from([0, 0, 0, 5])),
            )
        )
    horizon = draw(st.sampled_from([50, 300, 2000]))
    grace = draw(st.sampled_from([None, 0, 60]))
    return SimulationTrace(
        fleet, tuple(requests), horizon, grace, quotas, draw(st.sampled_from([0, 10, 120]))
    )


def timeline(trace, outcomes):
    """(second, +1 admitted / -1 given back, order, the request), in the order the queue saw them; what was
    asked again after a reclaim (where the trace requeues) too."""
    events = []
    for timed, outcome in zip(trace.requests, outcomes, strict=True):
        units = zip((timed, *requeued_requests(timed, outcome)), (outcome, *outcome.requeued), strict=True)
        for asked, one in units:
            if one.admitted_at is None:
                continue
            events.append((one.admitted_at, 1, one.sequence, asked))
            events.append((held_until(asked, one), 0, 0, asked))  # given back before that second's run
    return sorted(events, key=lambda event: event[:3])


@PROPERTY
@given(quota_traces(), st.booleans())
def test_no_tenant_ever_holds_beyond_its_limit_and_every_answer_keeps_the_rules(trace, requeue):
    trace = replace(trace, requeue_reclaimed=requeue)
    result = simulate(trace)
    assert check(trace, result.outcomes) == []
    books = Ledger(quotas=trace.quotas)
    for _at, admitted, _order, timed in timeline(trace, result.outcomes):
        slices = asked_slices(timed.items, timed.group)
        if admitted:
            books.take(timed.tenant, None, slices)
            for key, held in books.held[timed.tenant].items():
                limit = books.quota(timed.tenant, key).limit
                assert limit is None or held <= limit, (timed.id, key, held, limit)
        else:
            books.give(timed.tenant, None, slices)


@PROPERTY
@given(quota_traces())
def test_only_borrowed_pools_are_reclaimed_and_each_reclaim_admits_a_guaranteed_request(trace):
    result = simulate(trace)
    outcomes = result.outcomes
    admitted_at = Counter(o.admitted_at for o in outcomes if o.admitted_at is not None)
    for position, outcome in enumerate(outcomes):
        if outcome.reclaimed_at is None:
            continue
        decided = outcome.reclaimed_at - trace.reclaim_notice_seconds

        # Borrowed when it was chosen: what its tenant's pools held then, in the order they were admitted.
        def end(p, o, victim=position):  # the victim's own end for itself: its notice may be 0
            cut = o.reclaimed_at if p != victim else None
            return cut if cut is not None else o.admitted_at + trace.requests[p].held_for

        live = [
            Holding(p, trace.requests[p].tenant, None, 0, (o.admitted_at, o.sequence),
                    asked_slices(trace.requests[p].items, None))
            for p, o in enumerate(outcomes)
            if o.admitted_at is not None and o.admitted_at <= decided and end(p, o) > decided
        ]  # fmt: skip
        borrowed = Ledger(quotas=trace.quotas).borrowed(live)
        assert any(borrowed[position].values()), f"{outcome.request} was within its guarantee"
        assert admitted_at[outcome.reclaimed_at], f"nothing was admitted as {outcome.request}'s notice ended"


@PROPERTY
@given(quota_traces())
def test_without_quotas_tenants_and_priorities_of_zero_change_nothing(trace):
    plain = replace(
        trace,
        quotas={},
        requests=tuple(replace(r, tenant=None, priority=0) for r in trace.requests),
    )
    tenants_only = replace(
        plain,
        requests=tuple(
            replace(r, tenant=t.tenant) for r, t in zip(plain.requests, trace.requests, strict=True)
        ),
    )
    assert simulate(tenants_only).outcomes == simulate(plain).outcomes


def holding(pool, tenant, at, priority=0, slices=7):
    return Holding(pool, tenant, None, priority, (at, pool), {("", "H100-80GB"): slices})


def test_victims_are_the_fewest_in_the_order_of_priority_then_the_newest():
    books = Ledger(
        quotas={"a": {("", "H100-80GB"): Quota(7, None)}, "b": {("", "H100-80GB"): Quota(7, None)}}
    )
    pools = [holding(1, "a", 0), holding(2, "a", 10), holding(3, "a", 20, priority=5), holding(4, "a", 30)]
    from pools.placement.admission import Claim, Waiting

    asking = Waiting(
        "r", "b", None, 0, (0,), 0.0, (), Claim(0, frozenset(), frozenset()), {("", "H100-80GB"): 7}
    )
    order = [h.pool for h in reclaim_candidates(asking, pools, books)]
    assert order == [4, 2, 3]  # 1 is within a's guarantee; priority 0 first, the newest first; then 3
    # Two are needed; the newest two go first, and one of them is not needed once the second is taken.
    fits = lambda chosen: {h.pool for h in chosen} >= {2} or {h.pool for h in chosen} >= {4, 3}  # noqa: E731
    assert [h.pool for h in choose_victims(reclaim_candidates(asking, pools, books), fits)] == [2]
    assert choose_victims(reclaim_candidates(asking, pools, books), lambda chosen: False) is None
