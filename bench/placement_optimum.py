"""The offline optimum of a placement trace for bench/placement.py, from an exact CP-SAT model.

It chooses which requests to admit (their order ignored) and a layout for every wholly free GPU, to admit
the most compute slices. The model is exact and small because it counts instead of naming:
- request kind: requests asking for the same units are interchangeable, so the model counts how many of
  each kind it admits (per cluster) instead of deciding each request.
- pool: the wholly free GPUs of one model in one cluster are interchangeable too (nothing in the objective
  or the rules depends on which node a unit lands on), so the model counts how many of them take each
  layout instead of giving each GPU a layout.
- layout: a maximal multiset of the requested profiles that fits on an empty GPU (mig.place_profiles,
  which searches every start), or MIG off for one whole GPU. Maximal ones are enough: an instance nobody
  takes costs nothing.
- fixed supply: the free instances of GPUs with something allocated; their layouts cannot change.
Per cluster, model and profile: units admitted ≤ fixed supply + instances of the layouts chosen.
"""

from __future__ import annotations

import itertools
import math
import time
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass
from functools import cache

from ortools.sat.python import cp_model

from bench.placement_plans import Change, Plan, Take
from bench.placement_trace import Trace, TraceGpu, TraceItem, TraceRequest, request_compute_slices
from pools import mig

Units = tuple[
    tuple[tuple[str, str], int], ...
]  # ((model, profile), count), sorted: what a request kind asks for
Layout = tuple[tuple[str, int], ...]  # (profile, count) of one GPU


@dataclass(frozen=True)
class Optimum:
    value: int  # best admitted compute slices found
    bound: int  # no plan admits more
    proven: bool
    seconds: float
    plans: list[Plan]  # a witness of `value`, in queue order


@cache
def maximal_layouts(model_name: str, profiles: tuple[str, ...]) -> tuple[Layout, ...]:
    """Every maximal multiset of these MIG profiles that fits on an empty GPU, plus MIG off."""
    model = mig.gpu_model(model_name)
    mig_profiles = tuple(p for p in profiles if p != mig.FULL_GPU)
    fitting = []
    for counts in itertools.product(*(range(model.profile(p).max_count + 1) for p in mig_profiles)):
        layout = mig.place_profiles(model, dict(zip(mig_profiles, counts, strict=True)))
        if layout is not None:
            mig.validate_layout(model, layout)
            fitting.append(counts)
    maximal = [
        counts
        for counts in fitting
        if not any(
            other != counts and all(o >= c for o, c in zip(other, counts, strict=True)) for other in fitting
        )
    ]
    layouts = [tuple((p, n) for p, n in zip(mig_profiles, counts, strict=True) if n) for counts in maximal]
    return (*layouts, ((mig.FULL_GPU, 1),))


def _units(items: Iterable[TraceItem]) -> Units:
    units: Counter[tuple[str, str]] = Counter()
    for item in items:
        units[item.model, item.profile] += item.count
    return tuple(sorted(units.items()))


def optimum(trace: Trace, *, time_limit_s: float = 30.0, workers: int = 8) -> Optimum:
    began = time.perf_counter()
    kinds: Counter[Units] = Counter()
    value: dict[Units, int] = {}
    for request in trace.requests:
        kind = _units(request.items)
        kinds[kind] += 1
        value[kind] = request_compute_slices(request)
    clusters = sorted({gpu.cluster for gpu in trace.gpus})
    wanted: dict[str, set[str]] = {}  # model -> profiles some request asks for
    for kind in kinds:
        for (model, profile), _ in kind:
            wanted.setdefault(model, set()).add(profile)

    fixed: Counter[tuple[str, str, str]] = Counter()  # (cluster, model, profile) -> free instances
    pools: Counter[tuple[str, str]] = Counter()  # (cluster, model) -> wholly free GPUs
    for gpu in trace.gpus:
        if gpu.wholly_free:
            pools[gpu.cluster, gpu.model] += 1
        else:
            for instance in gpu.instances:
                if not instance.allocated:
                    fixed[gpu.cluster, gpu.model, instance.profile] += 1

    model = cp_model.CpModel()
    admitted = {
        (kind, cluster): model.new_int_var(0, count, f"admit[{i},{cluster}]")
        for i, (kind, count) in enumerate(kinds.items())
        for cluster in clusters
    }
    for kind in kinds:  # a request is admitted once, in one cluster
        model.add(sum(admitted[kind, cluster] for cluster in clusters) <= kinds[kind])
    supply: dict[tuple[str, str, str], list] = {}
    layout_vars: dict[tuple[str, str], list] = {}
    for (cluster, gpu_model), free_gpus in pools.items():
        if gpu_model not in wanted:
            continue
        layouts = maximal_layouts(gpu_model, tuple(sorted(wanted[gpu_model])))
        chosen = [
            model.new_int_var(0, free_gpus, f"layout[{cluster},{gpu_model},{i}]") for i in range(len(layouts))
        ]
        model.add(sum(chosen) <= free_gpus)
        layout_vars[cluster, gpu_model] = list(zip(layouts, chosen, strict=True))
        for layout, gpus in zip(layouts, chosen, strict=True):
            for profile, count in layout:
                supply.setdefault((cluster, gpu_model, profile), []).append(count * gpus)
    for cluster in clusters:
        for gpu_model, profiles in wanted.items():
            for profile in profiles:
                demand = [
                    count * admitted[kind, cluster]
                    for kind in kinds
                    for (m, p), count in kind
                    if (m, p) == (gpu_model, profile)
                ]
                key = (cluster, gpu_model, profile)
                model.add(sum(demand) <= fixed[key] + sum(supply.get(key, [])))
    model.maximize(sum(value[kind] * var for (kind, _), var in admitted.items()))

    solver = cp_model.CpSolver()
    solver.parameters.max_time_in_seconds = time_limit_s
    solver.parameters.num_workers = workers
    solver.parameters.random_seed = trace.seed
    status = solver.solve(model)
    if status not in (cp_model.OPTIMAL, cp_model.FEASIBLE):
        raise RuntimeError(f"CP-SAT found no plan for seed {trace.seed}: {solver.status_name(status)}")
    layouts_chosen = {
        pool: [(layout, solver.value(var)) for layout, var in chosen] for pool, chosen in layout_vars.items()
    }
    admitted_count = {key: solver.value(var) for key, var in admitted.items()}
    return Optimum(
        value=round(solver.objective_value),
        # The objective is whole slices, so the whole part of the bound is a bound too.
        bound=math.floor(solver.best_objective_bound + 1e-6),
        proven=status == cp_model.OPTIMAL,
        seconds=time.perf_counter() - began,
        plans=_witness(trace, layouts_chosen, admitted_count),
    )


def placeable(gpus: tuple[TraceGpu, ...], request: TraceRequest) -> bool:
    """Whether the request, alone, fits on the fleet as it stands."""
    return optimum(Trace(0, gpus, (request,)), workers=1).value > 0


def _witness(
    trace: Trace,
    layouts: dict[tuple[str, str], list[tuple[Layout, int]]],
    admitted: dict[tuple[Units, str], int],
) -> list[Plan]:
    """Plans in queue order that realise the solution, for placement_plans.audit to check on its own.

    Every change goes into the first admitted request's plan: nothing has been allocated on a wholly free GPU
    before it. Any unit of the right profile serves, since the model only bounds units by supply."""
    changes: list[Change] = []
    free: dict[tuple[str, str, str], list[Take]] = {}
    pool_gpus: dict[tuple[str, str], list[TraceGpu]] = {}
    for gpu in trace.gpus:
        if gpu.wholly_free:
            pool_gpus.setdefault((gpu.cluster, gpu.model), []).append(gpu)
        else:
            for i in gpu.instances:
                if not i.allocated:
                    free.setdefault((gpu.cluster, gpu.model, i.profile), []).append(
                        Take(gpu.id, i.profile, i.start)
                    )
    for (cluster, gpu_model), chosen in layouts.items():
        gpus = iter(pool_gpus[cluster, gpu_model])
        for layout, count in chosen:
            for gpu in itertools.islice(gpus, count):
                if layout == ((mig.FULL_GPU, 1),):
                    changes.append(Change(gpu.id, mig=False))
                    free.setdefault((cluster, gpu_model, mig.FULL_GPU), []).append(Take(gpu.id, mig.FULL_GPU))
                    continue
                instances = mig.place_profiles(mig.gpu_model(gpu_model), dict(layout))
                assert instances is not None  # maximal_layouts kept only placeable ones
                changes.append(Change(gpu.id, mig=True, instances=tuple(instances)))
                for i in instances:
                    free.setdefault((cluster, gpu_model, i.profile), []).append(
                        Take(gpu.id, i.profile, i.start)
                    )
    still = dict(admitted)
    plans = []
    for request in trace.requests:
        kind = _units(request.items)
        cluster = next((c for (k, c), n in still.items() if k == kind and n > 0), None)
        if cluster is None:
            plans.append(Plan(request.id, placed=False))
            continue
        still[kind, cluster] -= 1
        takes = [
            free[cluster, gpu_model, profile].pop()
            for (gpu_model, profile), count in kind
            for _ in range(count)
        ]
        plans.append(Plan(request.id, placed=True, changes=tuple(changes), takes=tuple(takes)))
        changes = []
    return plans
