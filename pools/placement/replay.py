"""The replay check of a simulated answer: whatever simulator or placer produced it, does it keep every rule?

It replays the outcomes on the trace's fleet in time order: at each admission time, first the releases due by
then, then that time's admissions (each applied as engine.apply applies it, which refuses a layout change on
a GPU that holds work, an invalid layout, and an instance or GPU given twice), then the releases of what was
admitted there with a hold of 0 — the order pools/placement/simulation.py runs them in. Where a second saw
more than one queue run (a pool reclaimed with no notice frees room for another run), the outcomes say which
run admitted each (`run`), and each run's admissions come after the releases the run before it made. A
queue run admits
in queue order (priority and fair share): that second's admissions are taken in the order the outcomes
say (`sequence`) where they say it; else (an answer read from JSON, which does not write it down) those
with re-cuts first (an admission on a GPU re-cut in that second came after the re-cut), in arrival order,
and again those that did not apply yet, until all apply or none more does. A
pool is released at its hold's end (`declared_hold` capping it), or where it was reclaimed, at
`reclaimed_at`.
It also checks that each admitted request got exactly what it asked for, in one cluster, on schedulable GPUs
of its group, after it arrived, not after the horizon, at a time when something arrived or was released.

Pure: plain data in, a list of problems out (empty when the answer is valid).
"""

from __future__ import annotations

import heapq
from collections import Counter
from collections.abc import Sequence
from itertools import pairwise

from pools.kinds import kind_of
from pools.placement.engine import apply
from pools.placement.simulation import (
    Outcome,
    SimulationTrace,
    TimedRequest,
    held_until,
    release,
    requeued_request,
    requeued_requests,
)
from pools.placement.types import Fleet, Gpu, Placement

__all__ = ["check"]


def check(trace: SimulationTrace, outcomes: Sequence[Outcome]) -> list[str]:
    """Every rule the outcomes break, one sentence each, naming the request; empty when they keep them all."""
    if len(outcomes) != len(trace.requests):
        return [f"{len(outcomes)} outcomes for the {len(trace.requests)} requests of the trace."]
    gpus = {gpu.id: gpu for gpu in trace.fleet.gpus}
    problems: list[str] = []
    units: list[tuple[TimedRequest, Outcome]] = []  # the trace's requests, then what was asked again
    for position, (timed, outcome) in enumerate(zip(trace.requests, outcomes, strict=True)):
        if outcome.request != timed.id:
            problems.append(
                f"Outcome {position} is of {outcome.request!r}, but request {position} is {timed.id!r}."
            )
            continue
        units.append((timed, outcome))
        problems += _requeued(trace, timed, outcome)
        again = requeued_requests(timed, outcome)
        units += zip(again, outcome.requeued[: len(again)], strict=True)
    admitted: list[tuple[int, int, int]] = []  # (admission time, queue run, unit)
    for unit, (timed, outcome) in enumerate(units):
        if outcome.admitted_at is None:
            if outcome.placement.placed:
                problems.append(f"{timed.id!r} is not admitted, yet its placement is placed.")
            continue
        if not outcome.placement.placed:
            problems.append(f"{timed.id!r} is admitted at {outcome.admitted_at} without a placement.")
            continue
        at = outcome.admitted_at
        if isinstance(at, bool) or not isinstance(at, int):
            problems.append(f"{timed.id!r}: the admission time must be whole seconds, not {at!r}.")
            continue
        problems += [f"{_name(timed, outcome)}: {p}" for p in _admission(trace, timed, outcome)]
        problems += [f"{_name(timed, outcome)}: {p}" for p in _fulfils(timed, outcome.placement, gpus)]
        admitted.append((at, outcome.run or 0, unit))
    events = {timed.arrive for timed, _outcome in units}
    events |= {held_until(*units[unit]) for _at, _run, unit in admitted}
    for at, _run, unit in admitted:
        if at not in events:
            problems.append(
                f"{_name(*units[unit])}: nothing arrived or was released at {at}, so no queue ran then."
            )
    return problems + _replay(trace.fleet, units, sorted(admitted))


def _requeued(trace: SimulationTrace, timed: TimedRequest, outcome: Outcome) -> list[str]:
    """What is asked again follows each reclaim of the request's pool, where the trace requeues them."""
    chain = (outcome, *outcome.requeued)
    if not trace.requeue_reclaimed:
        if outcome.requeued:
            return [f"{timed.id!r} was asked again, but the trace does not requeue reclaimed pools."]
        return []
    for before, after in pairwise(chain):
        if before.admitted_at is None or before.reclaimed_at is None:
            return [f"{timed.id!r} was asked again after an admission that was not reclaimed."]
        if after.request != timed.id:
            return [f"{timed.id!r} was asked again as {after.request!r}."]
    last, asked = chain[-1], [timed, *requeued_requests(timed, outcome)][-1]
    if (
        last.admitted_at is not None
        and last.reclaimed_at is not None
        and requeued_request(asked, last.admitted_at, last.reclaimed_at).hold > 0
    ):
        return [f"{timed.id!r} was reclaimed at {last.reclaimed_at} and not asked again."]
    return []


def _name(timed: TimedRequest, outcome: Outcome) -> str:
    return f"{timed.id!r} (admitted at {outcome.admitted_at})"


def _admission(trace: SimulationTrace, timed: TimedRequest, outcome: Outcome) -> list[str]:
    at = outcome.admitted_at
    problems = []
    if outcome.placement.request != timed.id:
        problems.append(f"its placement is of {outcome.placement.request!r}.")
    if at < timed.arrive:
        problems.append(f"admitted before it arrived at {timed.arrive}.")
    if at > trace.horizon:
        problems.append(f"admitted after the horizon {trace.horizon}.")
    return problems


def _fulfils(timed: TimedRequest, placement: Placement, gpus: dict[str, Gpu]) -> list[str]:
    """Exactly the instances asked for, in one cluster, on schedulable GPUs of the request's group."""
    named = [a.gpu for a in placement.assignments] + [c.gpu for c in placement.reconfigure]
    unknown = sorted({gpu for gpu in named if gpu not in gpus})
    if unknown:
        return [f"it names GPUs not in the fleet: {', '.join(unknown)}."]
    problems = []
    asked: Counter[tuple[str, str]] = Counter()
    for item in timed.items:
        asked[item.model, item.profile] += item.count
    got = Counter((gpus[a.gpu].model, a.profile) for a in placement.assignments)
    if got != asked:
        problems.append(f"it asked for {_listed(asked)} and was given {_listed(got)}.")
    if len({gpus[gpu].cluster for gpu in named}) > 1:
        problems.append("its GPUs span more than one cluster.")
    # A node's share mode changes for all its MIG-off GPUs, drained ones too: only what the request is
    # given, and the MIG changes it asks, must be on schedulable GPUs.
    used = [a.gpu for a in placement.assignments] + [
        c.gpu for c in placement.reconfigure if c.mig or gpus[c.gpu].mig
    ]
    for gpu in dict.fromkeys(used):
        if not gpus[gpu].schedulable:
            problems.append(f"GPU {gpu} is drained or unhealthy, yet the request uses it.")
        if timed.group is not None and gpus[gpu].group != timed.group:
            problems.append(f"GPU {gpu} is not in its group {timed.group!r}.")
    for assignment in placement.assignments:
        if assignment.profile not in {profile for _model, profile in asked}:
            continue  # said above: nothing asked for it
        if kind_of(assignment.profile).takes_whole_gpu != (assignment.start is None):
            problems.append(
                f"the assignment on {assignment.gpu} gives {assignment.profile} at {assignment.start}."
            )
    return problems


def _listed(counts: Counter[tuple[str, str]]) -> str:
    listed = [f"{n} × {model} {profile}" for (model, profile), n in sorted(counts.items())]
    return ", ".join(listed) or "nothing"


def _replay(
    fleet: Fleet, units: Sequence[tuple[TimedRequest, Outcome]], admitted: list[tuple[int, int, int]]
) -> list[str]:
    outcomes = [outcome for _timed, outcome in units]
    problems: list[str] = []
    holding: list[tuple[int, int]] = []  # heap of (release time, position) of what the fleet holds now
    number = 0
    while number < len(admitted):
        at, run = admitted[number][:2]
        fleet = _release_until(fleet, holding, at, outcomes, problems)
        left = []
        while number < len(admitted) and admitted[number][:2] == (at, run):
            left.append(admitted[number][2])
            number += 1
        # In the order they were admitted where the outcomes say it; else re-cuts first (an admission on a GPU
        # re-cut in the same second came after the re-cut).
        left.sort(key=lambda p: (outcomes[p].sequence is None, outcomes[p].sequence or 0))
        if any(outcomes[p].sequence is None for p in left):
            left.sort(key=lambda position: not outcomes[position].placement.reconfigure)
        failed: dict[int, str] = {}
        while left:
            failed = {}
            for position in left:
                try:
                    fleet = apply(fleet, outcomes[position].placement)
                except ValueError as error:
                    failed[position] = str(error)
                    continue
                heapq.heappush(holding, (held_until(*units[position]), position))
            if len(failed) == len(left):
                break
            left = list(failed)
        for position, error in failed.items():  # the rule each breaks; the rest is replayed without them
            problems.append(f"{_name(*units[position])}: {error}")
        fleet = _release_until(fleet, holding, at, outcomes, problems)
    return problems


def _release_until(
    fleet: Fleet, holding: list[tuple[int, int]], at: int, outcomes: Sequence[Outcome], problems: list[str]
) -> Fleet:
    while holding and holding[0][0] <= at:
        _until, position = heapq.heappop(holding)
        try:
            fleet = release(fleet, outcomes[position].placement)
        except ValueError as error:
            problems.append(f"{outcomes[position].request!r} cannot be released: {error}")
    return fleet
