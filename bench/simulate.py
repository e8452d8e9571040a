#!/usr/bin/env python
"""Benchmark: placement over time, the portal's engine against homogeneous first fit in the what-if simulator.

On seeded week-long traces (bench/simulate_trace.py: 8 nodes × 8 GPUs, half H100 and half H200, all whole,
free and MIG off at the start; about 600 requests arriving as a Poisson process, items drawn as in
bench/placement.py, holds log-uniform over a 72:1 range stretched to make the expected offered load
1.3 × the fleet's compute slices, about 1.7 hours to 5 days) it simulates each trace twice under the same
queue policy (FIFO with backfill, the portal's default grace of 1800 s, then again with no grace):
- with the engine, pools.placement.engine.place, the simulator's default placer;
- with homogeneous first fit (bench/simulate_first_fit.py): it cuts a wholly free GPU only into as many
  instances of the asked profile as fit, at their lowest starts, takes free instances of the asked profile
  first in GPU order, and gives a whole GPU from a wholly free MIG-off GPU (else switches a wholly free MIG
  GPU off).
It reports, per seed and in total, the compute-slice-hours each served before the horizon and their ratio
(the figure that matters), the requests admitted, mean and p95 waits (and those of requests with whole
GPUs, which the backfill rule of pools/placement/backfill.py makes wait longer), the mean stranded compute
slices over the week (time-weighted, as the capacity pages count them), the fleet's compute-slice-hours by
use (allocated, in idle instances, unprovisioned on GPUs in use, wholly free), and the simulator's run time
per trace. Unprovisioned slices on a GPU in use are lost until it is wholly free again, since only then may
its layout change; the pages' stranded count does not include them when some profile could still fit there.

Then, unless --declared is 0, the same seeds' weeks again with a share of the requests declaring their hold
(an end date, bench/simulate_trace.py: on time or early, never late), each simulated three times under the
same queue policies: the engine told the declared ends (the simulator's way: a request admitted at t ends at
t + its declared hold), the engine told none (the same placer with every end taken away, as placement was
before it knew ends), and first fit. The gain from ends is the first's served compute-slice-hours over the
second's. `--slack` sets how much longer than the true hold a declared one may be (bench/simulate_trace.py;
0: every declared end exact), to measure what exact knowledge of ends would be worth.

Every simulated answer is replayed by pools.placement.replay.check; a broken rule is printed as a line
starting "ENGINE BUG" or "BENCH BUG" and the benchmark exits with status 1. Targets are printed, not asserted.

Run from the repository root; no database, no Django:
    .venv/bin/python bench/simulate.py [--seeds 5] [--first-seed 1] [--requests 600] [--nodes 8]
        [--horizon 604800] [--no-null-grace] [--declared 0.8] [--slack 0.25]
Prints the table per seed, then one figure per line.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
import traceback
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.simulate_first_fit import first_fit  # noqa: E402
from bench.simulate_trace import (  # noqa: E402
    BACKFILL_GRACE_SECONDS,
    DECLARED_SLACK,
    HOLD_MAX,
    HOLD_MIN,
    HOUR,
    LOAD,
    NODES,
    REQUESTS,
    WEEK,
    hold_stretch,
    offered_load,
    random_simulation_trace,
)
from pools import mig  # noqa: E402
from pools.placement.engine import apply, place  # noqa: E402
from pools.placement.index import has_allocation  # noqa: E402
from pools.placement.replay import check  # noqa: E402
from pools.placement.simulation import (  # noqa: E402
    Placer,
    SimulationResult,
    SimulationTrace,
    release,
    simulate,
    stranded_slices,
)
from pools.placement.types import Fleet, Placement, Request  # noqa: E402

SEEDS = 5
TARGET_RATIO = 1.07
DECLARED = 0.8  # the share of requests that declare their hold, in the weeks with declared holds
TARGET_DECLARED_RATIO = 1.10
TARGET_SECONDS = 120.0
USES = (
    ("allocated", "allocated"),
    ("idle_instances", "idle instances"),
    ("unprovisioned", "unprovisioned on GPUs in use"),
    ("wholly_free", "wholly free"),
)


# --- measuring ------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Run:
    result: SimulationResult | None  # None when the placer's answer could not even be simulated
    seconds: float
    problems: list[str]

    @property
    def served(self) -> float:
        return self.result.summary.served_slice_hours


def simulated(trace: SimulationTrace, placer: Placer) -> Run:
    began = time.perf_counter()
    try:
        result = simulate(trace, placer=placer)
    except Exception:
        return Run(None, time.perf_counter() - began, [f"it raised {traceback.format_exc(limit=-3)}"])
    seconds = time.perf_counter() - began
    return Run(result, seconds, check(trace, result.outcomes))


def mean_stranded(trace: SimulationTrace, result: SimulationResult) -> float:
    """Stranded compute slices averaged over the horizon: each event time's count holds until the next."""
    total, at, now = 0, 0, stranded_slices(trace.fleet)
    for time_, stranded in result.summary.stranded:
        total += now * (time_ - at)
        at, now = time_, stranded
    total += now * (trace.horizon - at)
    return total / trace.horizon


@dataclass(frozen=True)
class CapacityUse:
    """The fleet's compute-slice-hours up to the horizon, by what each slice was doing."""

    allocated: float  # in instances or whole GPUs given to a request
    idle_instances: float  # in free instances on GPUs that hold work
    unprovisioned: float  # in no instance, on GPUs that hold work: unusable until they are wholly free
    wholly_free: float  # on GPUs that hold nothing

    @property
    def total(self) -> float:
        return self.allocated + self.idle_instances + self.unprovisioned + self.wholly_free


def capacity_use(trace: SimulationTrace, result: SimulationResult) -> CapacityUse:
    """The outcomes replayed in the simulator's order (at each time the releases due, then the admissions in
    arrival order, then the releases of holds of 0), each state weighted by how long it lasted."""
    events = []
    for position, (timed, outcome) in enumerate(zip(trace.requests, result.outcomes, strict=True)):
        if outcome.admitted_at is not None:
            events.append((outcome.admitted_at, 1, position, apply))
            events.append((outcome.admitted_at + timed.hold, 0 if timed.hold else 2, position, release))
    events.sort(key=lambda event: event[:3])
    fleet, since, use = trace.fleet, 0, [0.0] * 4
    for at, _, position, change in [*events, (trace.horizon, 3, 0, None)]:
        if at > trace.horizon:
            at, change = trace.horizon, None
        for share, slices in enumerate(_slices_by_use(fleet)):
            use[share] += slices * (at - since) / HOUR
        if change is None:
            break
        since, fleet = at, change(fleet, result.outcomes[position].placement)
    return CapacityUse(*use)


def _slices_by_use(fleet: Fleet) -> tuple[int, int, int, int]:
    allocated = idle = unprovisioned = free = 0
    for gpu in fleet.gpus:
        if not has_allocation(gpu):
            free += mig.COMPUTE_SLICES
            continue
        if not gpu.mig:
            allocated += mig.COMPUTE_SLICES
            continue
        model = mig.gpu_model(gpu.model)
        held = sum(model.profile(s.profile).compute_slices for s in gpu.instances if s.allocated)
        free_instances = sum(
            model.profile(s.profile).compute_slices for s in gpu.instances if not s.allocated
        )
        allocated, idle = allocated + held, idle + free_instances
        unprovisioned += mig.COMPUTE_SLICES - held - free_instances
    return allocated, idle, unprovisioned, free


def without_ends(fleet: Fleet, request: Request, **context) -> Placement:
    """The engine told no end: the request's taken away, so that nothing it places carries one either."""
    return place(fleet, replace(request, ends=None), **context)


@dataclass(frozen=True)
class SeedResult:
    seed: int
    trace: SimulationTrace
    engine: Run
    first_fit: Run
    blind: Run | None = None  # the engine told no end, on weeks with declared holds


def measure(
    seed: int,
    *,
    nodes: int,
    horizon: int,
    requests: float,
    grace: int | None,
    declared: float = 0.0,
    slack: float = DECLARED_SLACK,
) -> SeedResult:
    trace = random_simulation_trace(
        seed,
        nodes=nodes,
        horizon=horizon,
        requests=requests,
        backfill_grace_seconds=grace,
        declared=declared,
        slack=slack,
    )
    blind = simulated(trace, without_ends) if declared else None
    return SeedResult(seed, trace, simulated(trace, place), simulated(trace, first_fit), blind)


def loud_lines(result: SeedResult, label: str) -> list[str]:
    lines = [f"ENGINE BUG seed {result.seed}{label}: {p}" for p in result.engine.problems]
    if result.blind is not None:
        lines += [f"ENGINE BUG seed {result.seed}{label}: without ends: {p}" for p in result.blind.problems]
    lines += [f"BENCH BUG seed {result.seed}{label}: first fit: {p}" for p in result.first_fit.problems]
    return lines


def whole_gpu_waits(trace: SimulationTrace, result: SimulationResult) -> tuple[float | None, int | None]:
    """Mean and p95 (nearest rank) wait of the admitted requests that asked for a whole GPU."""
    waits = sorted(
        outcome.admitted_at - timed.arrive
        for timed, outcome in zip(trace.requests, result.outcomes, strict=True)
        if outcome.admitted_at is not None and any(item.profile == mig.FULL_GPU for item in timed.items)
    )
    if not waits:
        return None, None
    return statistics.mean(waits), waits[-(-95 * len(waits) // 100) - 1]


def hours(seconds: float | None) -> str:
    return "-" if seconds is None else f"{seconds / HOUR:.2f}"


def ratio(part: float, whole: float) -> str:
    return f"{part / whole:.3f}" if whole else "n/a"


COLUMNS = (
    "grace  seed  requests  load  served_eng  served_ff  eng/ff  admit_eng  admit_ff  wait_eng_h  wait_ff_h  "
    "p95_eng_h  p95_ff_h  strand_eng  strand_ff  eng_s  ff_s"
)


def table_row(result: SeedResult) -> str:
    trace, engine, ff = result.trace, result.engine.result, result.first_fit.result
    grace = trace.backfill_grace_seconds
    return (
        f"{'none' if grace is None else grace:>5}  {result.seed:4d}  {len(trace.requests):8d}  "
        f"{offered_load(trace):4.2f}  {engine.summary.served_slice_hours:10.1f}  "
        f"{ff.summary.served_slice_hours:9.1f}  {ratio(result.engine.served, result.first_fit.served):>6}  "
        f"{engine.summary.admitted:9d}  {ff.summary.admitted:8d}  "
        f"{hours(engine.summary.mean_wait_seconds):>10}  {hours(ff.summary.mean_wait_seconds):>9}  "
        f"{hours(engine.summary.p95_wait_seconds):>9}  {hours(ff.summary.p95_wait_seconds):>8}  "
        f"{mean_stranded(trace, engine):10.2f}  {mean_stranded(trace, ff):9.2f}  "
        f"{result.engine.seconds:5.2f}  {result.first_fit.seconds:4.2f}"
    )


DECLARED_COLUMNS = (
    "declared  grace  seed  requests  load  served_ends  served_blind  served_ff  ends/ff  blind/ff  "
    "ends/blind  admit_ends  admit_blind  admit_ff  wait_ends_h  wait_blind_h  wait_ff_h  ends_s  blind_s"
)


def declared_row(result: SeedResult, declared: float) -> str:
    """A row of the weeks with declared holds: the engine with ends, without, and first fit."""
    trace, ends, blind, ff = result.trace, result.engine, result.blind, result.first_fit
    grace = trace.backfill_grace_seconds
    summaries = [run.result.summary for run in (ends, blind, ff)]
    return (
        f"{declared:8.2f}  {'none' if grace is None else grace:>5}  {result.seed:4d}  "
        f"{len(trace.requests):8d}  "
        f"{offered_load(trace):4.2f}  {ends.served:11.1f}  {blind.served:12.1f}  {ff.served:9.1f}  "
        f"{ratio(ends.served, ff.served):>7}  {ratio(blind.served, ff.served):>8}  "
        f"{ratio(ends.served, blind.served):>10}  "
        + "  ".join(f"{s.admitted:{w}d}" for s, w in zip(summaries, (10, 11, 8), strict=True))
        + "  "
        + "  ".join(f"{hours(s.mean_wait_seconds):>{w}}" for s, w in zip(summaries, (11, 12, 9), strict=True))
        + f"  {ends.seconds:6.2f}  {blind.seconds:7.2f}"
    )


def _mean(values: list[float | None]) -> float | None:
    known = [v for v in values if v is not None]
    return statistics.mean(known) if known else None


PLACERS = (("engine", "engine"), ("first fit", "first_fit"))
DECLARED_PLACERS = (
    ("engine with ends", "engine"),
    ("engine without ends", "blind"),
    ("first fit", "first_fit"),
)


def totals(results: list[SeedResult], label: str, placers: Sequence[tuple[str, str]] = PLACERS) -> list[str]:
    """The figures over every seed of one queue policy: sums of what is served and admitted, means of the
    per-seed waits and stranded slices, the slowest and mean simulation; then the ratios of what each
    placer served to the last's (first fit's)."""
    lines = []
    for name, run_of in placers:
        runs = [getattr(r, run_of) for r in results]
        summaries = [run.result.summary for run in runs]
        served = sum(s.served_slice_hours for s in summaries)
        wait = _mean([s.mean_wait_seconds for s in summaries])
        p95 = _mean([s.p95_wait_seconds for s in summaries])
        stranded = statistics.mean(
            mean_stranded(r.trace, run.result) for r, run in zip(results, runs, strict=True)
        )
        seconds = [run.seconds for run in runs]
        whole_gpu = [whole_gpu_waits(r.trace, run.result) for r, run in zip(results, runs, strict=True)]
        uses = [capacity_use(r.trace, run.result) for r, run in zip(results, runs, strict=True)]
        whole = sum(use.total for use in uses)
        shares = [
            f"{words} {100 * sum(getattr(use, field) for use in uses) / whole:.1f} %" for field, words in USES
        ]
        lines += [
            f"{name} served compute-slice-hours{label} (total): {served:.1f}",
            f"{name} admitted{label} (total): {sum(s.admitted for s in summaries)} of "
            f"{sum(s.requests for s in summaries)}",
            f"{name} mean wait{label} (mean of seeds): {hours(wait)} h",
            f"{name} p95 wait{label} (mean of seeds): {hours(p95)} h",
            f"{name} whole-GPU requests' mean and p95 wait{label} (mean of seeds): "
            f"{hours(_mean([w[0] for w in whole_gpu]))} h, {hours(_mean([w[1] for w in whole_gpu]))} h",
            f"{name} mean stranded compute slices{label} (mean of seeds): {stranded:.2f}",
            f"{name} compute-slice-hours by use{label}: {', '.join(shares)}",
            f"{name} simulation time per trace{label}: mean {statistics.mean(seconds):.2f} s, "
            f"max {max(seconds):.2f} s",
        ]
    served = {name: sum(getattr(r, run_of).served for r in results) for name, run_of in placers}
    baseline = served["first fit"]
    for name, _ in placers[:-1]:
        lines.append(
            f"{name} / first fit served compute-slice-hours{label}: {ratio(served[name], baseline)} ×"
        )
    if "engine with ends" in served:
        gain = ratio(served["engine with ends"], served["engine without ends"])
        lines.append(f"engine with ends / without ends served compute-slice-hours{label}: {gain} ×")
    return lines


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=SEEDS, help=f"traces to measure (default {SEEDS})")
    parser.add_argument("--first-seed", type=int, default=1, help="the seed of the first trace (default 1)")
    parser.add_argument(
        "--requests", type=float, default=REQUESTS, help=f"expected arrivals per trace (default {REQUESTS})"
    )
    parser.add_argument("--nodes", type=int, default=NODES, help=f"nodes of 8 GPUs (default {NODES})")
    parser.add_argument("--horizon", type=int, default=WEEK, help=f"seconds simulated (default {WEEK})")
    parser.add_argument("--no-null-grace", action="store_true", help="skip the runs without a grace")
    parser.add_argument(
        "--declared",
        type=float,
        default=DECLARED,
        help=f"share of requests that declare their hold in the weeks with declared holds; 0 skips "
        f"those weeks (default {DECLARED})",
    )
    parser.add_argument(
        "--slack",
        type=float,
        default=DECLARED_SLACK,
        help=f"how much longer than the true hold a declared one may be, as a share; 0: every declared "
        f"end is exact (default {DECLARED_SLACK})",
    )
    args = parser.parse_args(argv)
    if not 0 <= args.declared <= 1:
        parser.error(f"--declared is a share from 0 to 1, not {args.declared}")
    if args.slack < 0:
        parser.error(f"--slack is a share of 0 or more, not {args.slack}")

    began = time.perf_counter()
    graces: tuple[int | None, ...] = (
        (BACKFILL_GRACE_SECONDS,) if args.no_null_grace else (BACKFILL_GRACE_SECONDS, None)
    )
    seeds = range(args.first_seed, args.first_seed + args.seeds)
    shape = dict(nodes=args.nodes, horizon=args.horizon, requests=args.requests)
    by_grace: dict[int | None, list[SeedResult]] = {}
    declared_by_grace: dict[int | None, list[SeedResult]] = {}
    for grace in graces:
        by_grace[grace] = [measure(seed, **shape, grace=grace) for seed in seeds]
        if args.declared:
            declared_by_grace[grace] = [
                measure(seed, **shape, grace=grace, declared=args.declared, slack=args.slack)
                for seed in seeds
            ]
    labels = {grace: "" if grace == BACKFILL_GRACE_SECONDS else ", no grace" for grace in graces}
    declared_label = f", {100 * args.declared:g} % declared"
    if args.slack != DECLARED_SLACK:
        declared_label += f" (slack {args.slack:g})"
    declared_labels = {grace: f"{declared_label}{labels[grace]}" for grace in graces}
    loud = [line for grace in graces for r in by_grace[grace] for line in loud_lines(r, labels[grace])]
    loud += [
        line
        for grace, results in declared_by_grace.items()
        for r in results
        for line in loud_lines(r, declared_labels[grace])
    ]
    for line in loud:
        print(line)
    results = by_grace[BACKFILL_GRACE_SECONDS]
    gpus = len(results[0].trace.fleet.gpus)
    print(
        f"seeds: {args.seeds} ({gpus} GPUs, horizon {args.horizon} s, {args.requests:g} requests expected, "
        f"offered load {LOAD} expected)"
    )
    if loud:
        print(f"replay check: {len(loud)} problems; figures not scored")
        return 1
    print(COLUMNS)
    for grace in graces:
        for result in by_grace[grace]:
            print(table_row(result))
    print(f"offered load (mean of seeds): {statistics.mean(offered_load(r.trace) for r in results):.3f}")
    print(f"requests per trace (mean): {statistics.mean(len(r.trace.requests) for r in results):.1f}")
    stretch = hold_stretch(gpus=gpus, horizon=args.horizon, requests=args.requests, load=LOAD)
    print(f"holds: log-uniform from {stretch * HOLD_MIN / HOUR:.2f} h to {stretch * HOLD_MAX / HOUR:.1f} h")
    for grace in graces:
        for line in totals(by_grace[grace], labels[grace]):
            print(line)
    if declared_by_grace:
        print(DECLARED_COLUMNS)
        for grace in graces:
            for result in declared_by_grace[grace]:
                print(declared_row(result, args.declared))
        for grace in graces:
            for line in totals(declared_by_grace[grace], declared_labels[grace], DECLARED_PLACERS):
                print(line)
    print("replay check: no problems in any answer")
    engine = sum(r.engine.served for r in results)
    baseline = sum(r.first_fit.served for r in results)
    met = "met" if baseline and engine / baseline >= TARGET_RATIO else "NOT MET"
    print(f"target engine ≥ {TARGET_RATIO:.2f} × first fit served compute-slice-hours: {met}")
    if declared_by_grace:
        declared = declared_by_grace[BACKFILL_GRACE_SECONDS]
        engine = sum(r.engine.served for r in declared)
        baseline = sum(r.first_fit.served for r in declared)
        met = "met" if baseline and engine / baseline >= TARGET_DECLARED_RATIO else "NOT MET"
        print(
            f"target engine with ends ≥ {TARGET_DECLARED_RATIO:.2f} × first fit served compute-slice-hours"
            f"{declared_label}: {met}"
        )
    slowest = max(r.engine.seconds for runs in (results, *declared_by_grace.values()) for r in runs)
    met = "met" if slowest < TARGET_SECONDS else "NOT MET"
    print(f"target engine simulation < {TARGET_SECONDS:.0f} s per trace: {met}")
    print(f"benchmark wall time: {time.perf_counter() - began:.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
