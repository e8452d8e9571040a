#!/usr/bin/env python
"""Benchmark: the placement engine (pools/placement/) against a first-fit baseline and the offline optimum.

On seeded random traces (8–12 nodes × 8 GPUs, H100 and H200 mixed, some GPUs in use, some partitioned; a
queue of 100 requests that does not all fit) it reports the compute slices admitted by
- the engine, through place_all, in queue order;
- the first-fit baseline of placement_plans.py, in queue order;
- the offline optimum of placement_optimum.py (CP-SAT, order ignored), with whether it was proven.
Ratios are of the means over seeds. Then the engine's time per request on a 4,000-GPU fleet (500 nodes;
`--timing-nodes 12500` for 100,000 GPUs), one request at a time through place and apply, pinned to one core:
200 requests on the fleet as generated, and 200 more once it is nearly full (after requests asking for 95 %
of its free compute slices); and the same queue through place_all. The fleet is indexed before the timed
requests, once, as a queue run indexes its snapshot once: that time is printed on its own line; and what
building the fleet and its index left for the garbage collector is collected before them too.

Then the same on a mixed fleet of 8,000 GPUs (bench/placement_mixed.py): MIG, whole GPUs of a model without
MIG, time-sliced and MPS shares in GPU groups that offer each, 200 requests of what each group offers; each
answer is applied, which refuses any that breaks a rule, and the fleet after them is checked for the device
plugin's one share mode per node.

Every plan measured is replayed and checked (placement_plans.audit): layouts valid, changes only on wholly
free GPUs, nothing booked twice, each request given exactly what it asked for. A broken rule is printed as
a line starting "ENGINE BUG" or "BENCH BUG" and the plan is not scored. Targets are printed, not asserted.

Run from the repository root; no database, no Django:
    DEBUG=true .venv/bin/python bench/placement.py [--seeds 10] [--quick] [--verbose] [--timing-nodes 500]
Prints one figure per line.
"""

from __future__ import annotations

import argparse
import gc
import os
import statistics
import sys
import time
import traceback
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.placement_mixed import check_modes, mixed_fleet, mixed_requests  # noqa: E402
from bench.placement_optimum import Optimum, optimum, placeable  # noqa: E402
from bench.placement_plans import Audit, Book, Change, Plan, Take, audit, first_fit  # noqa: E402
from bench.placement_trace import (  # noqa: E402
    GPUS_PER_NODE,
    Trace,
    TraceGpu,
    TraceRequest,
    free_compute_slices,
    random_trace,
    request_compute_slices,
)
from pools import mig  # noqa: E402

TIMING_NODES = 500
MIXED_NODES = 1000  # 8,000 GPUs
TIMING_SEED = 4000
NEAR_FULL = 0.95  # of the free compute slices asked for before the timed requests of the second timing
ENGINE_TARGET_OVER_BASELINE = 0.05
ENGINE_TARGET_OF_OPTIMUM = 0.95
ENGINE_TARGET_MS = 20.0
ENGINE_TARGET_P95_MS = 5.0  # per request, on the timing fleet fresh and near full


def load_engine() -> tuple[ModuleType | None, str]:
    try:
        import pools.placement as engine
    except ImportError as error:
        return None, f"{error}"
    return engine, ""


def engine_fleet(engine: ModuleType, gpus: tuple[TraceGpu, ...]) -> object:
    return engine.Fleet(
        gpus=tuple(
            engine.Gpu(
                id=gpu.id,
                node=gpu.node,
                model=gpu.model,
                mig=gpu.mig,
                allocated=gpu.allocated,
                instances=tuple(engine.Slot(i.profile, i.start, i.allocated) for i in gpu.instances),
                cluster=gpu.cluster,
            )
            for gpu in gpus
        )
    )


def engine_request(engine: ModuleType, request: TraceRequest) -> object:
    items = tuple(engine.Item(model=i.model, profile=i.profile, count=i.count) for i in request.items)
    return engine.Request(id=request.id, items=items)


def plan_of(placement: object) -> Plan:
    """The engine's Placement in the bench's words, so that placement_plans.audit can check it."""
    changes = tuple(
        Change(
            r.gpu, mig=r.mig, instances=tuple(mig.Instance(start, profile) for profile, start in r.instances)
        )
        for r in placement.reconfigure
    )
    takes = tuple(
        Take(a.gpu, a.profile, None if a.profile == mig.FULL_GPU else a.start) for a in placement.assignments
    )
    return Plan(placement.request, placement.placed, changes, takes, placement.reason)


def fleet_differences(fleet: object, book: Book) -> list[str]:
    """Where the fleet the engine returned differs from its own plans replayed on the trace."""
    differences = []
    for gpu in fleet.gpus:
        mine = book.gpus.get(gpu.id)
        if mine is None:
            differences.append(f"{gpu.id} is not in the trace.")
            continue
        theirs = (gpu.mig, gpu.allocated, sorted((s.start, s.profile, s.allocated) for s in gpu.instances))
        replayed = (mine.mig, mine.allocated, sorted((s.start, s.profile, s.allocated) for s in mine.slots))
        if theirs != replayed:
            differences.append(
                f"{gpu.id}: returned (mig, allocated, instances) {theirs}, replayed {replayed}."
            )
    return differences


@dataclass
class EngineRun:
    audit: Audit | None
    problems: list[str]
    seconds: float
    refused: int = 0
    refused_but_fitted: list[str] = field(default_factory=list)  # request ids


def refusals(trace: Trace, plans: list[Plan]) -> tuple[int, list[str]]:
    """Requests left unplaced, and those of them that would have fitted, whole, on the fleet as it stood at
    their turn (an exact check, CP-SAT on that one request)."""
    book = Book.of(trace.gpus)
    refused, fitted = 0, []
    for request, plan in zip(trace.requests, plans, strict=True):
        if not plan.placed:
            refused += 1
            if placeable(book.as_trace_gpus(), request):
                fitted.append(request.id)
        book.apply(request, plan)
    return refused, fitted


def run_engine(engine: ModuleType, trace: Trace) -> EngineRun:
    began = time.perf_counter()
    try:
        placements, fleet = engine.place_all(
            engine_fleet(engine, trace.gpus), [engine_request(engine, r) for r in trace.requests]
        )
        plans = [plan_of(p) for p in placements]
    except Exception:
        return EngineRun(None, [f"it raised {traceback.format_exc(limit=-3)}"], time.perf_counter() - began)
    seconds = time.perf_counter() - began
    result = audit(trace, plans)
    problems = result.problems + fleet_differences(fleet, result.book)
    return EngineRun(result, problems, seconds, *refusals(trace, plans))


@dataclass
class Timing:
    per_request_ms: list[float]
    placed: int  # of the timed requests
    place_all_ms: float | None  # the same queue through place_all, per request
    problems: list[str]
    index_ms: float | None = None  # indexing the fleet as generated, once, before the timed requests


def requests_to_fill(share: float) -> int:
    """How many requests of the timing trace ask for `share` of its free compute slices."""
    trace = random_trace(TIMING_SEED, nodes=TIMING_NODES, requests=2 * TIMING_NODES * GPUS_PER_NODE)
    wanted, asked = share * free_compute_slices(trace.gpus), 0
    for count, request in enumerate(trace.requests):
        if asked >= wanted:
            return count
        asked += request_compute_slices(request)
    raise ValueError("The timing trace cannot ask for that much.")


def time_mixed(engine: ModuleType, requests: int, nodes: int) -> Timing:
    """One request at a time through place and apply on the mixed fleet, pinned to one core."""
    fleet = mixed_fleet(TIMING_SEED, nodes)
    queue = mixed_requests(TIMING_SEED, requests)
    index_ms = indexed(engine, fleet)
    cpus = os.sched_getaffinity(0)
    os.sched_setaffinity(0, {min(cpus)})
    gc.collect()  # what setting up left to collect is not the timed requests' to pay
    times, placed, problems = [], 0, []
    try:
        for index, request in enumerate(queue):
            began = time.perf_counter()
            placement = engine.place(fleet, request, upcoming=tuple(queue[index + 1 :]))
            try:
                fleet = engine.apply(fleet, placement)
            except ValueError as error:
                problems.append(f"{request.id}: {error}")
            times.append((time.perf_counter() - began) * 1000)
            placed += placement.placed
    finally:
        os.sched_setaffinity(0, cpus)
    return Timing(times, placed, None, problems + check_modes(fleet), index_ms)


def indexed(engine: ModuleType, fleet: object) -> float:
    """Index a fleet (what its first request would do); the milliseconds it took."""
    began = time.perf_counter()
    engine.fleet_index(fleet)
    return (time.perf_counter() - began) * 1000


def time_engine(engine: ModuleType, requests: int, *, fill: int = 0) -> Timing:
    """One request at a time through place (with the rest of the queue as upcoming) and apply, after `fill`
    earlier requests have been placed untimed through place_all."""
    # The same seed gives the same fleet and the same queue start whatever its length.
    trace = random_trace(TIMING_SEED, nodes=TIMING_NODES, requests=fill + requests)
    queue = [engine_request(engine, r) for r in trace.requests]
    fleet = engine_fleet(engine, trace.gpus)
    index_ms = indexed(engine, fleet)
    plans = []
    if fill:
        placements, fleet = engine.place_all(fleet, queue[:fill])
        plans = [plan_of(p) for p in placements]
    cpus = os.sched_getaffinity(0)
    os.sched_setaffinity(0, {min(cpus)})
    gc.collect()  # what setting up left to collect is not the timed requests' to pay
    try:
        times = []
        for index in range(fill, len(queue)):
            began = time.perf_counter()
            placement = engine.place(fleet, queue[index], upcoming=tuple(queue[index + 1 :]))
            fleet = engine.apply(fleet, placement)
            times.append((time.perf_counter() - began) * 1000)
            plans.append(plan_of(placement))
        place_all_ms = None
        if not fill:
            fresh = engine_fleet(engine, trace.gpus)
            indexed(engine, fresh)
            gc.collect()
            began = time.perf_counter()
            engine.place_all(fresh, queue)
            place_all_ms = (time.perf_counter() - began) * 1000 / len(queue)
    finally:
        os.sched_setaffinity(0, cpus)
    result = audit(trace, plans)
    placed = sum(plan.placed for plan in plans[fill:])
    problems = result.problems + fleet_differences(fleet, result.book)
    return Timing(times, placed, place_all_ms, problems, None if fill else index_ms)


@dataclass
class SeedResult:
    trace: Trace
    engine: EngineRun | None
    baseline: Audit
    optimum: Optimum
    optimum_audit: Audit


def measure(seed: int, engine: ModuleType | None, time_limit_s: float) -> SeedResult:
    trace = random_trace(seed)
    baseline = audit(trace, first_fit(trace))
    best = optimum(trace, time_limit_s=time_limit_s, workers=min(8, os.cpu_count() or 1))
    return SeedResult(
        trace, run_engine(engine, trace) if engine else None, baseline, best, audit(trace, best.plans)
    )


def loud_lines(result: SeedResult) -> list[str]:
    seed = result.trace.seed
    lines = [f"BENCH BUG seed {seed}: baseline: {p}" for p in result.baseline.problems]
    lines += [f"BENCH BUG seed {seed}: optimum plan: {p}" for p in result.optimum_audit.problems]
    if result.optimum_audit.admitted_slices != result.optimum.value:
        lines.append(
            f"BENCH BUG seed {seed}: the optimum's plan admits {result.optimum_audit.admitted_slices} "
            f"compute slices, CP-SAT said {result.optimum.value}."
        )
    if result.baseline.admitted_slices > result.optimum.bound:
        lines.append(f"BENCH BUG seed {seed}: the baseline beats the optimum's bound.")
    run = result.engine
    if run is not None:
        lines += [f"ENGINE BUG seed {seed}: {p}" for p in run.problems]
        if run.audit and run.audit.admitted_slices > result.optimum.bound:
            lines.append(f"BENCH BUG seed {seed}: the engine beats the optimum's bound.")
        if run.refused_but_fitted:
            listed = ", ".join(run.refused_but_fitted)
            lines.append(
                f"ENGINE BUG seed {seed}: refused requests that fitted whole at their turn: {listed}."
            )
    return lines


def percent(part: float, whole: float) -> str:
    return f"{100 * part / whole:.1f} %" if whole else "n/a"


def verbose_table(results: list[SeedResult]) -> None:
    columns = "seed  gpus  free  asked  engine  baseline  optimum  bound  proven  solve_s  engine_s  eng/opt"
    print(f"{columns}  base/opt")
    for r in results:
        engine = r.engine.audit.admitted_slices if r.engine and r.engine.audit else None
        print(
            f"{r.trace.seed:4d}  {len(r.trace.gpus):4d}  {free_compute_slices(r.trace.gpus):4d}  "
            f"{sum(request_compute_slices(q) for q in r.trace.requests):5d}  "
            f"{engine if engine is not None else '-':>6}  {r.baseline.admitted_slices:8d}  "
            f"{r.optimum.value:7d}  "
            f"{r.optimum.bound:5d}  {'yes' if r.optimum.proven else 'no':>6}  {r.optimum.seconds:7.2f}  "
            f"{r.engine.seconds if r.engine else 0:8.2f}  "
            f"{percent(engine, r.optimum.value) if engine is not None else '-':>7}  "
            f"{percent(r.baseline.admitted_slices, r.optimum.value):>8}"
        )


def report(results: list[SeedResult], timings: dict[str, Timing], engine_missing: str) -> None:
    gpus = [len(r.trace.gpus) for r in results]
    requests = {len(r.trace.requests) for r in results}
    over = [
        sum(request_compute_slices(q) for q in r.trace.requests) / free_compute_slices(r.trace.gpus)
        for r in results
    ]
    print(
        f"seeds: {len(results)} (fleets {min(gpus)}–{max(gpus)} GPUs, mean {statistics.mean(gpus):.0f}; "
        f"{'/'.join(map(str, sorted(requests)))} requests each)"
    )
    print(f"demand over free compute slices (mean): {statistics.mean(over):.2f} ×")
    baseline = statistics.mean(r.baseline.admitted_slices for r in results)
    best = statistics.mean(r.optimum.value for r in results)
    bound = statistics.mean(r.optimum.bound for r in results)
    proven = sum(r.optimum.proven for r in results)
    ran = [r for r in results if r.engine and r.engine.audit]
    engine = statistics.mean(r.engine.audit.admitted_slices for r in ran) if ran else None
    if engine_missing:
        print(f"ENGINE MISSING: pools.placement cannot be imported ({engine_missing}); no engine figures.")
    elif len(ran) < len(results):
        print(f"ENGINE BUG: the engine failed on {len(results) - len(ran)} of {len(results)} seeds.")
    if engine is not None:
        print(f"engine admitted compute slices (mean): {engine:.1f}")
    print(f"first-fit baseline (mean): {baseline:.1f}")
    print(f"offline optimum (mean): {best:.1f}, {proven}/{len(results)} proven optimal")
    if proven < len(results):
        print(f"offline optimum best bound (mean): {bound:.1f}")
    print(f"optimum solve time (max): {max(r.optimum.seconds for r in results):.2f} s")
    if engine is not None:
        # Compared on the seeds the engine ran, so a failed seed does not flatter it.
        same_baseline = statistics.mean(r.baseline.admitted_slices for r in ran)
        same_best = statistics.mean(r.optimum.value for r in ran)
        same_bound = statistics.mean(r.optimum.bound for r in ran)
        gain = engine / same_baseline - 1
        print(f"engine vs baseline: {100 * gain:+.1f} %")
        of_best = engine / same_best
        print(
            f"engine vs optimum: {100 * of_best:.1f} %"
            + (f" (≥ {percent(engine, same_bound)} of the bound)" if proven < len(results) else "")
        )
    print(f"baseline vs optimum: {percent(baseline, best)}")
    if ran:
        refused = sum(r.engine.refused for r in ran)
        fitted = sum(len(r.engine.refused_but_fitted) for r in ran)
        print(f"engine refusals of requests that fitted at their turn: {fitted} of {refused} refusals")
    gpus_timed = TIMING_NODES * GPUS_PER_NODE
    for label, timing in timings.items():
        on = (MIXED_NODES if label == MIXED else TIMING_NODES) * GPUS_PER_NODE
        mean_ms = statistics.mean(timing.per_request_ms)
        p95_ms = p95(timing.per_request_ms)
        print(
            f"engine time per request on {on} GPUs{label}: mean {mean_ms:.1f} ms, "
            f"p95 {p95_ms:.1f} ms, max {max(timing.per_request_ms):.1f} ms "
            f"({timing.placed} of {len(timing.per_request_ms)} requests placed; place + apply)"
        )
        if timing.place_all_ms is not None:
            print(f"engine place_all on {on} GPUs{label}: {timing.place_all_ms:.1f} ms per request")
        if timing.index_ms is not None:
            print(f"engine index of {on} GPUs{label}: built in {timing.index_ms:.0f} ms, once per fleet")
    if engine is not None:
        met = "met" if gain >= ENGINE_TARGET_OVER_BASELINE else "NOT MET"
        print(f"target engine ≥ baseline + {100 * ENGINE_TARGET_OVER_BASELINE:.0f} % (required): {met}")
        met = "met" if of_best >= ENGINE_TARGET_OF_OPTIMUM else "not met"
        print(f"target engine ≥ {100 * ENGINE_TARGET_OF_OPTIMUM:.0f} % of optimum (aim): {met}")
    if timings:
        worst = max(statistics.mean(t.per_request_ms) for label, t in timings.items() if label != MIXED)
        met = "met" if worst < ENGINE_TARGET_MS else "NOT MET"
        print(
            f"target engine < {ENGINE_TARGET_MS:.0f} ms per request on {gpus_timed} GPUs (worst mean): {met}"
        )
        worst = max(p95(t.per_request_ms) for label, t in timings.items() if label != MIXED)
        met = "met" if worst <= ENGINE_TARGET_P95_MS else "NOT MET"
        print(
            f"target engine p95 ≤ {ENGINE_TARGET_P95_MS:.0f} ms per request on {gpus_timed} GPUs, fresh and "
            f"near full (worst p95 {worst:.1f} ms): {met}"
        )


def p95(times: list[float]) -> float:
    return statistics.quantiles(times, n=20)[-1]


MIXED = ", mixed fleet (MIG, whole, time-sliced and MPS shares)"


def set_timing_nodes(nodes: int) -> None:
    global TIMING_NODES
    TIMING_NODES = nodes


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=None, help="traces to measure (default 10, quick 3)")
    parser.add_argument("--quick", action="store_true", help="fewer seeds, a shorter CP-SAT limit and timing")
    parser.add_argument("--verbose", action="store_true", help="a table per seed")
    parser.add_argument(
        "--timing-nodes", type=int, default=TIMING_NODES, help="nodes of 8 GPUs in the timing fleet (500)"
    )
    args = parser.parse_args()
    set_timing_nodes(args.timing_nodes)
    seeds = args.seeds if args.seeds is not None else (3 if args.quick else 10)
    time_limit_s = 5.0 if args.quick else 30.0
    engine, engine_missing = load_engine()

    began = time.perf_counter()
    results = [measure(seed, engine, time_limit_s) for seed in range(1, seeds + 1)]
    timings: dict[str, Timing] = {}
    if engine is not None:
        timed = 50 if args.quick else 200
        # Fresh: the fleet as generated, with room for all. Near full: after requests that ask for 95 % of its
        # free compute slices, so that the timed ones meet fragments, the last room and refusals.
        fill = requests_to_fill(NEAR_FULL)
        for label, before in (("", 0), (f", near full (after {fill} others)", fill)):
            try:
                timings[label] = time_engine(engine, requests=timed, fill=before)
            except Exception:
                print(f"ENGINE BUG: timing run{label} raised {traceback.format_exc(limit=-3)}")
        try:
            timings[MIXED] = time_mixed(engine, requests=timed, nodes=MIXED_NODES)
        except Exception:
            print(f"ENGINE BUG: the mixed fleet's timing raised {traceback.format_exc(limit=-3)}")
    for result in results:
        for line in loud_lines(result):
            print(line)
    for label, timing in timings.items():
        for problem in timing.problems:
            print(f"ENGINE BUG on {TIMING_NODES * GPUS_PER_NODE} GPUs{label}: {problem}")
    if args.verbose:
        verbose_table(results)
    report(results, timings, engine_missing)
    print(f"benchmark wall time: {time.perf_counter() - began:.1f} s")


if __name__ == "__main__":
    main()
