"""Placement plans for bench/placement.py: the book that checks them, and the first-fit baseline.

Words used here (the trace's words are in placement_trace.py):
- plan: what a method decided for one request: layout changes, then the instances (or whole GPUs) it takes.
- change: a new layout for one GPU, or MIG switched off; allowed only on a wholly free GPU.
- take: one unit of a request: a free instance, named by GPU, profile and start, or a free whole GPU.
- book: the fleet as it stands while plans are applied in queue order. Applying a plan checks it first and
  applies nothing when any check fails, so a bad plan is reported and not scored.
- first fit: the baseline. For each unit, a free instance of the profile on the first GPU that has one; else
  the first wholly free GPU turned into as many instances of that one profile as fit. A whole GPU comes from
  the first free MIG-off GPU, else from the first wholly free MIG GPU switched off.
"""

from __future__ import annotations

import copy
from collections import Counter
from dataclasses import dataclass, field
from functools import cache

from bench.placement_trace import Trace, TraceGpu, TraceInstance, TraceRequest, request_compute_slices
from pools import mig


@dataclass(frozen=True)
class Change:
    gpu: str
    mig: bool
    instances: tuple[mig.Instance, ...] = ()


@dataclass(frozen=True)
class Take:
    gpu: str
    profile: str
    start: int | None = None  # None for a whole GPU


@dataclass(frozen=True)
class Plan:
    request: str
    placed: bool
    changes: tuple[Change, ...] = ()
    takes: tuple[Take, ...] = ()
    reason: str = ""


@dataclass
class BookSlot:
    profile: str
    start: int
    allocated: bool = False


@dataclass
class BookGpu:
    id: str
    node: str
    model: str
    cluster: str
    mig: bool
    allocated: bool
    slots: list[BookSlot]

    @property
    def wholly_free(self) -> bool:
        return not self.allocated and not any(slot.allocated for slot in self.slots)

    def layout(self) -> list[mig.Instance]:
        return [mig.Instance(slot.start, slot.profile) for slot in self.slots]


@dataclass
class Book:
    gpus: dict[str, BookGpu]  # in fleet order
    problems: list[str] = field(default_factory=list)

    @classmethod
    def of(cls, gpus: tuple[TraceGpu, ...]) -> Book:
        return cls(
            {
                gpu.id: BookGpu(
                    gpu.id,
                    gpu.node,
                    gpu.model,
                    gpu.cluster,
                    gpu.mig,
                    gpu.allocated,
                    [BookSlot(i.profile, i.start, i.allocated) for i in gpu.instances],
                )
                for gpu in gpus
            }
        )

    def as_trace_gpus(self) -> tuple[TraceGpu, ...]:
        """The fleet as it stands now, in the trace's words."""
        return tuple(
            TraceGpu(
                gpu.id,
                gpu.node,
                gpu.model,
                gpu.mig,
                gpu.allocated,
                tuple(TraceInstance(slot.profile, slot.start, slot.allocated) for slot in gpu.slots),
                gpu.cluster,
            )
            for gpu in self.gpus.values()
        )

    def apply(self, request: TraceRequest, plan: Plan) -> bool:
        """Check the plan against the book and apply it when it holds; every broken rule is kept in
        `problems`. True when the request is now placed."""
        # Only the GPUs the plan names can change; copying just those keeps a 4,000-GPU replay quick.
        named = {change.gpu for change in plan.changes} | {take.gpu for take in plan.takes}
        scratch = {gpu: copy.deepcopy(self.gpus[gpu]) for gpu in named if gpu in self.gpus}
        found = _apply(scratch, request, plan)
        if found:
            self.problems.extend(f"{plan.request}: {problem}" for problem in found)
            return False
        self.gpus.update(scratch)
        return plan.placed

    def layout_problems(self) -> list[str]:
        problems = []
        for gpu in self.gpus.values():
            errors = mig.layout_errors(mig.gpu_model(gpu.model), gpu.layout()) if gpu.mig else []
            if not gpu.mig and gpu.slots:
                errors.append("MIG is off but the GPU has instances.")
            problems.extend(f"{gpu.id}: {error}" for error in errors)
        return problems


def _apply(gpus: dict[str, BookGpu], request: TraceRequest, plan: Plan) -> list[str]:
    if plan.request != request.id:
        return [f"the plan is for request {plan.request!r}, not {request.id!r}."]
    if not plan.placed:
        return ["a request left unplaced changes the fleet."] if plan.changes or plan.takes else []
    problems: list[str] = []
    for change in plan.changes:
        gpu = gpus.get(change.gpu)
        if gpu is None:
            problems.append(f"a change names unknown GPU {change.gpu}.")
        elif not gpu.wholly_free:
            problems.append(f"{gpu.id} changes its layout with something allocated on it.")
        else:
            if change.mig:
                problems.extend(
                    f"{gpu.id}: {e}" for e in mig.layout_errors(mig.gpu_model(gpu.model), change.instances)
                )
            elif change.instances:
                problems.append(f"{gpu.id} switches MIG off but keeps instances.")
            gpu.mig = change.mig
            gpu.slots = [BookSlot(i.profile, i.start) for i in change.instances]
    for take in plan.takes:
        gpu = gpus.get(take.gpu)
        if gpu is None:
            problems.append(f"a take names unknown GPU {take.gpu}.")
        elif take.profile == mig.FULL_GPU:
            if gpu.mig or gpu.allocated:
                problems.append(f"{gpu.id} is taken whole but has MIG on or is in use.")
            gpu.allocated = True
        else:
            slot = next((s for s in gpu.slots if (s.profile, s.start) == (take.profile, take.start)), None)
            if slot is None or not gpu.mig:
                problems.append(f"{gpu.id} has no {take.profile} at {take.start}.")
            elif slot.allocated:
                problems.append(f"{gpu.id}: {take.profile} at {take.start} is booked twice.")
            else:
                slot.allocated = True
    wanted: Counter[tuple[str, str]] = Counter()
    for item in request.items:
        wanted[item.model, item.profile] += item.count
    given = Counter((gpus[t.gpu].model, t.profile) for t in plan.takes if t.gpu in gpus)
    if given != wanted:
        problems.append(f"it takes {dict(given)} but asked for {dict(wanted)}.")
    if len({gpus[t.gpu].cluster for t in plan.takes if t.gpu in gpus}) > 1:
        problems.append("its units come from more than one cluster.")
    return problems


@dataclass
class Audit:
    admitted_slices: int
    placed: int
    problems: list[str]
    book: Book


def audit(trace: Trace, plans: list[Plan]) -> Audit:
    """Replays plans in queue order from the trace's fleet, checking each; scores only the plans that hold."""
    book = Book.of(trace.gpus)
    problems = [f"the trace itself: {p}" for p in book.layout_problems()]
    if len(plans) != len(trace.requests):
        problems.append(f"{len(plans)} plans for {len(trace.requests)} requests.")
    admitted = placed = 0
    for request, plan in zip(trace.requests, plans, strict=False):
        if book.apply(request, plan):
            admitted += request_compute_slices(request)
            placed += 1
    problems.extend(book.problems)
    problems.extend(f"final layout: {p}" for p in book.layout_problems())
    return Audit(admitted, placed, problems, book)


@cache
def homogeneous_layout(model_name: str, profile: str) -> tuple[mig.Instance, ...]:
    """As many instances of one profile as fit on an empty GPU."""
    model = mig.gpu_model(model_name)
    for count in range(model.profile(profile).max_count, 0, -1):
        layout = mig.place_profiles(model, {profile: count})
        if layout is not None:
            return tuple(layout)
    raise ValueError(f"{profile} does not fit on an empty {model_name}.")


def _first_fit_unit(gpus: list[BookGpu], model: str, profile: str) -> tuple[Change | None, Take] | None:
    same_model = [gpu for gpu in gpus if gpu.model == model]
    if profile == mig.FULL_GPU:
        gpu = next((g for g in same_model if not g.mig and not g.allocated), None)
        change = None
        if gpu is None:
            gpu = next((g for g in same_model if g.mig and g.wholly_free), None)
            if gpu is None:
                return None
            change = Change(gpu.id, mig=False)
            gpu.mig, gpu.slots = False, []
        gpu.allocated = True
        return change, Take(gpu.id, profile)
    for gpu in same_model:
        if not gpu.mig:
            continue
        slot = next((s for s in gpu.slots if s.profile == profile and not s.allocated), None)
        if slot is not None:
            slot.allocated = True
            return None, Take(gpu.id, profile, slot.start)
    gpu = next((g for g in same_model if g.wholly_free), None)
    if gpu is None:
        return None
    layout = homogeneous_layout(model, profile)
    gpu.mig, gpu.slots = True, [BookSlot(i.profile, i.start) for i in layout]
    gpu.slots[0].allocated = True
    return Change(gpu.id, mig=True, instances=layout), Take(gpu.id, profile, layout[0].start)


def _first_fit_in(gpus: list[BookGpu], request: TraceRequest) -> Plan | None:
    changes: list[Change] = []
    takes: list[Take] = []
    for item in request.items:
        for _ in range(item.count):
            unit = _first_fit_unit(gpus, item.model, item.profile)
            if unit is None:
                return None
            change, take = unit
            if change is not None:
                changes.append(change)
            takes.append(take)
    return Plan(request.id, placed=True, changes=tuple(changes), takes=tuple(takes))


def first_fit_plan(book: Book, request: TraceRequest) -> Plan:
    """The baseline's plan for one request, all or nothing, in the first cluster (in fleet order) that holds
    all of it; the book is not changed."""
    for cluster in dict.fromkeys(gpu.cluster for gpu in book.gpus.values()):
        scratch = [copy.deepcopy(gpu) for gpu in book.gpus.values() if gpu.cluster == cluster]
        plan = _first_fit_in(scratch, request)
        if plan is not None:
            return plan
    return Plan(request.id, placed=False, reason="first fit found no room in any cluster")


def first_fit(trace: Trace) -> list[Plan]:
    book = Book.of(trace.gpus)
    plans = []
    for request in trace.requests:
        plan = first_fit_plan(book, request)
        book.apply(request, plan)
        plans.append(plan)
    return plans
