"""The what-if simulator's pure core as properties: every simulated answer replayed and its summary recounted,
retries skipped on unchanged GPUs changing no answer, a release undoing what it held, and a week of a busy
fleet."""

import math
import random
from collections import Counter
from dataclasses import replace

import pytest
from hypothesis import given
from hypothesis import strategies as st

from pools.gpu_models import model_info
from pools.kinds import MIG, kind_of
from pools.mig import FULL_GPU, Instance, gpu_model, layout_errors
from pools.placement import Fleet, Item, Placement, apply, place
from pools.placement.admission import BEHIND_OLDER
from pools.placement.backfill import out_of_the_way
from pools.placement.demand import DEMAND_WINDOW_SECONDS, recent_demand
from pools.placement.plan import QUEUE_WINDOW
from pools.placement.replay import check
from pools.placement.simulation import (
    AFTER_HORIZON,
    Outcome,
    SimulationTrace,
    TimedRequest,
    compute_slices,
    release,
    simulate,
)
from tests.pools.test_placement import H100, gpu
from tests.pools.test_placement_properties import PROPERTY, gpus_, requests_
from tests.pools.test_simulation import HOUR

# --- every answer, as a property -----------------------------------------------------------------------


@st.composite
def traces_(draw) -> SimulationTrace:
    f = draw(gpus_())
    requests, at = [], 0
    for n in range(draw(st.integers(1, 10))):
        at += draw(st.sampled_from([0, 0, 5, 20, 100]))
        request = draw(requests_())
        hold = draw(st.sampled_from([0, 1, 30, 100, 400]))
        requests.append(TimedRequest(f"r{n}", at, hold, request.items, request.group))
    horizon = draw(st.sampled_from([1, 50, 300, 2000]))
    return SimulationTrace(f, tuple(requests), horizon, draw(st.sampled_from([None, None, 0, 10, 60])))


@PROPERTY
@given(traces_())
def test_every_simulated_answer_keeps_every_rule_and_its_summary_adds_up(trace):
    result = simulate(trace)
    assert check(trace, result.outcomes) == []
    assert_held_by_one_at_a_time(trace, result.outcomes)
    assert [o.request for o in result.outcomes] == [r.id for r in trace.requests]
    served = waits = 0.0
    for timed_, outcome in zip(trace.requests, result.outcomes, strict=True):
        assert (outcome.admitted_at is not None) == outcome.placement.placed
        if outcome.admitted_at is not None:
            waits += outcome.admitted_at - timed_.arrive
            held = min(outcome.admitted_at + timed_.hold, trace.horizon) - outcome.admitted_at
            served += compute_slices(trace.fleet, outcome.placement) * held / HOUR
    assert result.summary.served_slice_hours == pytest.approx(served)
    if result.summary.admitted:
        assert result.summary.mean_wait_seconds == pytest.approx(waits / result.summary.admitted)
    times = [at for at, _ in result.summary.stranded]
    assert times == sorted(set(times)) and all(at <= trace.horizon for at in times)


def assert_held_by_one_at_a_time(trace: SimulationTrace, outcomes) -> None:
    """The rules again, without engine.apply: admissions taken as moments (time, then arrival order, as one
    run per second takes them), each GPU's layout at each moment, and who holds which memory slices then."""
    gpus = {g.id: g for g in trace.fleet.gpus}
    layouts = {g.id: (g.mig, {(s.profile, s.start) for s in g.instances}) for g in trace.fleet.gpus}
    holds = {}  # GPU -> [(from, until, memory slices)]: the trace's own work from -1 and for ever
    for g in trace.fleet.gpus:
        taken = set(range(8)) if g.allocated else set()
        for slot in g.instances:
            if slot.allocated:
                taken |= _slices(g.model, slot.profile, slot.start)
        holds[g.id] = [(-1, math.inf, taken)] if taken else []

    def held(gpu: str, at: int) -> set[int]:
        # Released before the run at `until`; admitted earlier in this run (even for 0 s) still holds.
        return set().union(*(t for start, until, t in holds[gpu] if start == at or start < at < until))

    for at, n in sorted((o.admitted_at, n) for n, o in enumerate(outcomes) if o.admitted_at is not None):
        placement = outcomes[n].placement
        for change in placement.reconfigure:
            assert not held(change.gpu, at), f"{change.gpu} is re-cut at {at} while in use"
            layout = [Instance(start, profile) for profile, start in change.instances]
            assert not change.mig or layout_errors(gpu_model(gpus[change.gpu].model), layout) == []
            layouts[change.gpu] = (change.mig, set(change.instances))
        for a in placement.assignments:
            mig, layout = layouts[a.gpu]
            if a.profile == FULL_GPU:
                assert not mig, f"{a.gpu} is given whole while MIG is on"
                taken = set(range(8))
            else:
                assert mig == (kind_of(a.profile) is MIG), f"{a.gpu}: {a.profile} while MIG is {mig}"
                assert (a.profile, a.start) in layout, f"{a.gpu} has no {a.profile} at {a.start}"
                taken = _slices(gpus[a.gpu].model, a.profile, a.start)
            assert not taken & held(a.gpu, at), f"{a.gpu}: memory slices held twice at {at}"
            holds[a.gpu].append((at, at + trace.requests[n].hold, taken))


def _slices(model: str, profile: str, start: int) -> set[int]:
    return set(range(*kind_of(profile).slots(model_info(model), profile, start)))


@PROPERTY
@given(traces_())
def test_skipping_retries_on_unchanged_gpus_changes_no_answer(trace):
    assert simulate(trace).outcomes == reference(trace)


def reference(trace: SimulationTrace) -> tuple[Outcome, ...]:
    """The policy as the simulator's docstring states it, with every waiting request tried at every run."""
    f, waiting, holding, answer = trace.fleet, [], [], {}
    arrivals, first = list(trace.requests), True
    while True:
        times = [r.arrive for r in arrivals[:1]] + [end for end, _ in holding]
        if not times or min(times) > trace.horizon:
            break
        now = min(times)
        f = _release_due(f, holding, now)
        f = Fleet(tuple(g if first else replace(g, reconfiguring=False) for g in f.gpus))
        first = False
        while arrivals and arrivals[0].arrive <= now:
            waiting.append(arrivals.pop(0))
        seen = [(r.arrive, r.items) for r in trace.requests if now - DEMAND_WINDOW_SECONDS < r.arrive <= now]
        demand = recent_demand(seen, now=now, window_seconds=DEMAND_WINDOW_SECONDS) or None
        starving, still = [], []
        for number, r in enumerate(waiting):
            models = {i.model for i in r.items}
            blockers = [w for m, g, w in starving if models & m and (None in (g, r.group) or g == r.group)]
            upcoming = [w.request for w in waiting[number + 1 : number + 1 + QUEUE_WINDOW]]
            placement = place(f, r.request, upcoming=upcoming, demand=demand)
            if blockers and not (placement.placed and out_of_the_way(f, placement, set().union(*blockers))):
                answer[r.id] = Outcome(r.id, None, Placement(r.id, False, reason=BEHIND_OLDER))
                still.append(r)
                continue
            if placement.placed:
                f = apply(f, placement)
                answer[r.id] = Outcome(r.id, now, placement)
                holding.append((now + r.hold, placement))
                continue
            answer[r.id] = Outcome(r.id, None, placement)
            if trace.backfill_grace_seconds is not None and now - r.arrive >= trace.backfill_grace_seconds:
                starving.append((models, r.group, {(i.model, i.profile) for i in r.items}))
            still.append(r)
        waiting = still
        f = _release_due(f, holding, now)
    return tuple(
        answer.get(r.id) or Outcome(r.id, None, Placement(r.id, False, reason=AFTER_HORIZON))
        for r in trace.requests
    )


def _release_due(f: Fleet, holding: list, now: int) -> Fleet:
    for entry in [e for e in holding if e[0] <= now]:
        holding.remove(entry)
        f = release(f, entry[1])
    return f


@PROPERTY
@given(gpus_(), requests_())
def test_release_undoes_what_apply_allocates_and_keeps_the_layouts(f, request):
    placement = place(f, request)
    after = release(apply(f, placement), placement)
    recut = {c.gpu: c for c in placement.reconfigure}
    for before, now in zip(f.gpus, after.gpus, strict=True):
        if before.id in recut:
            change = recut[before.id]
            assert now.mig == change.mig and not now.allocated
            assert [(s.profile, s.start, s.allocated) for s in now.instances] == [
                (p, s, False) for p, s in change.instances
            ]
        else:
            assert replace(now, reconfiguring=before.reconfiguring, sharing=before.sharing) == before
            assert {g.sharing for g in after.gpus if g.node == now.node} == {now.sharing}  # the node's mode


# --- a week of a busy fleet ------------------------------------------------------------------------------


def week(seed: int, requests: int = 600) -> SimulationTrace:
    """8 nodes × 8 GPUs (H100-80GB and H200-141GB, a training and an inference group of each), ~600 requests
    of MIG instances and whole GPUs held an hour to three days, as the capacity planners' what-if asks."""
    rnd = random.Random(seed)
    gpus = []
    for node in range(8):
        model = H100 if node < 4 else "H200-141GB"
        gpus += [
            gpu(
                f"n{node}/{i}",
                off=rnd.random() < 0.25,
                model=model,
                group="train" if node % 4 < 2 else "serve",
            )
            for i in range(8)
        ]
    profiles = {
        H100: ["1g.10gb", "1g.20gb", "2g.20gb", "3g.40gb", "4g.40gb", "7g.80gb"],
        "H200-141GB": ["1g.18gb", "1g.35gb", "2g.35gb", "3g.71gb", "4g.71gb", "7g.141gb"],
    }
    timed_requests, at = [], 0
    for n in range(requests):
        at += int(rnd.expovariate(requests / (7 * 86400)))
        model = rnd.choice(list(profiles))
        if rnd.random() < 0.15:
            items = (Item(model, FULL_GPU, rnd.choice([1, 1, 2, 4, 8])),)
        else:
            chosen = Counter(rnd.choices(profiles[model], [5, 2, 3, 3, 1, 1], k=rnd.choice([1, 2, 3, 4])))
            items = tuple(Item(model, profile, count) for profile, count in chosen.items())
        hold = int(rnd.choice([1, 4, 12, 24, 48, 72]) * HOUR * rnd.uniform(0.2, 0.6))
        timed_requests.append(TimedRequest(f"r{n}", at, hold, items, rnd.choice([None, "train", "serve"])))
    return SimulationTrace(Fleet(tuple(gpus)), tuple(timed_requests), 7 * 86400, None)


def test_a_week_of_a_busy_fleet_keeps_every_rule():
    trace = week(7)
    result = simulate(trace)
    assert check(trace, result.outcomes) == []
    assert_held_by_one_at_a_time(trace, result.outcomes)
    summary = result.summary
    assert summary.admitted > 0.8 * summary.requests
    assert len(summary.stranded) > summary.requests  # arrivals and releases
