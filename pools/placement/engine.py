"""MIG-aware placement: where each requested MIG instance or full GPU goes, which free GPUs get new layouts.

Words used here (MIG geometry words are pools/mig.py's):
- fleet: the GPUs the engine may place on, each with its MIG mode, layout and what on it is allocated.
- slot: a provisioned MIG instance on a GPU, free or allocated.
- item: so many instances of one profile of one GPU model, or so many whole GPUs ("full").
- request: items placed together or not at all, in one cluster, on GPUs of its group if it names one.
- wholly free GPU: nothing on it allocated. Only such a GPU may change layout or MIG mode, because the GPU
  Operator destroys every instance of a GPU whose layout changes.
- reconfigure: a new layout for a wholly free GPU (MIG on with instances, or MIG off).
- assignment: one instance (or one whole GPU) given to a request, after the request's reconfigures.
- placement: the answer for one request: its reconfigures and assignments, or the reason it was not placed.

The engine is pure: no Django, no I/O, no clock. The planning itself is in pools/placement/plan.py, the
choice of new layouts in pools/placement/layouts.py, the fleet index in pools/placement/index.py (with
its versions in journal.py, its ranks in ranks.py, read through choices.py), the reasons in
pools/placement/reasons.py, the JSON trace of `manage.py place` in pools/placement/trace.py,
and the plain data in pools/placement/types.py.
"""

from __future__ import annotations

import sys
import weakref
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import replace
from functools import partial
from itertools import islice

from pools.gpu_models import UnknownGpuModel, model_info
from pools.kinds import UnknownProfile, kind_of
from pools.mig import Instance, gpu_model, validate_layout
from pools.placement.index import FleetIndex, has_allocation
from pools.placement.journal import Version
from pools.placement.layouts import RECENT_WEIGHT, evidence_weight
from pools.placement.plan import QUEUE_WINDOW, plan_request, share_slots, wanted_by_model
from pools.placement.ranks import indexed
from pools.placement.reasons import shortfall as cluster_shortfall
from pools.placement.types import Assignment, Fleet, Gpu, Placement, Reconfigure, Request, Slot

__all__ = [
    "Replaced",
    "apply",
    "fleet_index",
    "place",
    "place_all",
    "shortfall",
    "validate_request",
    "with_gpus",
]


def fleet_index(fleet: Fleet) -> FleetIndex:
    """The fleet's index, built on first use and kept with the immutable fleet (a cache, not state: equality
    ignores it); shared with the fleets made from it, and brought to this fleet's version when it is read
    (pools/placement/index.py). Raises on duplicate GPU ids."""
    found = fleet.__dict__.get("_index")
    if found is None:
        index = indexed(fleet.gpus)
        _keep(fleet, index, index.journal.current)
        return index
    index, version = found
    index.checkout(version)
    return index


def _keep(fleet: Fleet, index: FleetIndex, version: Version) -> None:
    version.owner = weakref.ref(fleet)
    object.__setattr__(fleet, "_index", (index, version))


def validate_request(request: Request, fleet: Fleet | None) -> list[str]:
    """What makes the request bad input, one sentence each; empty when it is well formed.

    The fleet is not consulted: a request that names a model or group the fleet lacks, or asks for more than
    it holds, is well formed and gets a `reason` from `place` instead.
    """
    errors: list[str] = []
    if not request.items:
        errors.append(f"Request {request.id!r} asks for nothing: it has no items.")
    for number, item in enumerate(request.items, 1):
        label = f"Item {number} of request {request.id!r}"
        if isinstance(item.count, bool) or not isinstance(item.count, int) or item.count <= 0:
            errors.append(f"{label}: the count must be a whole number above 0 (got {item.count!r}).")
        try:
            kind_of(item.profile).check(model_info(item.model), item.profile)
        except (UnknownGpuModel, UnknownProfile) as error:
            errors.append(f"{label}: {error}")
    return errors


def _well_formed(request: Request) -> bool:
    """Whether `validate_request` finds nothing wrong, kept with the immutable request (a cache: equality
    ignores it), as the same waiting requests are read again as upcoming for each request before them."""
    found = request.__dict__.get("_well_formed")
    if found is None:
        found = not validate_request(request, None)
        object.__setattr__(request, "_well_formed", found)
    return found


def place(
    fleet: Fleet,
    request: Request,
    *,
    upcoming: Sequence[Request] = (),
    demand: Mapping[tuple[str, str], float] | None = None,
) -> Placement:
    """Where one request goes, whole, or why it cannot; `upcoming` is the rest of the waiting queue and
    `demand` the recent demand per (model, profile), both used to choose the layouts of re-partitioned GPUs.
    Without `demand`, the request itself is the only recent demand known, and weak evidence."""
    if demand is None:
        return _place(fleet, request, upcoming, _tally({}, request), evidence_weight(1))
    return _place(fleet, request, upcoming, demand, RECENT_WEIGHT)


def _place(
    fleet: Fleet,
    request: Request,
    upcoming: Sequence[Request],
    demand: Mapping[tuple[str, str], float],
    recent_weight: int,
) -> Placement:
    errors = validate_request(request, fleet)
    if errors:
        return Placement(request.id, False, reason=" ".join(errors))
    index = fleet_index(fleet)
    window = [r for r in islice(upcoming, QUEUE_WINDOW) if _well_formed(r)]
    plan = plan_request(index, request, window, demand, recent_weight)
    if isinstance(plan, str):
        return Placement(request.id, False, reason=plan)
    gpus = index.gpus
    return Placement(
        request.id,
        True,
        reclaimable=request.reclaimable,
        ends=request.ends,
        reconfigure=tuple(
            Reconfigure(gpus[position].id, mig, instances, sharing)
            for position, (mig, instances, sharing) in sorted(plan.reconfigure.items())
        ),
        assignments=tuple(
            Assignment(gpus[position].id, profile, start) for position, profile, start in plan.assignments
        ),
    )


def shortfall(fleet: Fleet, request: Request) -> int:
    """Compute slices of a valid request that the fleet's closest cluster cannot give now (0 when one
    might); ranks where a request that does not fit comes nearest, e.g. to name that cluster."""
    if validate_request(request, fleet):
        return sys.maxsize  # malformed here: no cluster of this fleet comes close
    index = fleet_index(fleet)
    wanted = wanted_by_model(request)
    return min(
        cluster_shortfall(index, cluster, request.group, wanted) for cluster in index.clusters() or [""]
    )


def apply(fleet: Fleet, placement: Placement) -> Fleet:
    """The fleet after the placement: new layouts and share modes, assigned instances, shares and GPUs
    allocated (carrying the request's end), and the nodes changed marked as reconfiguring. Raises ValueError
    for a placement that breaks a rule."""
    if not placement.placed:
        return fleet
    index = fleet_index(fleet)
    gpus = Replaced(index.gpus)
    changed: set[int] = set()
    nodes: set[str] = set()
    shared: dict[str, str] = {}  # node -> its new share mode
    for change in placement.reconfigure:
        position = _position(index, change.gpu)
        gpu = gpus[position]
        if has_allocation(gpu):
            raise ValueError(f"GPU {gpu.id} holds allocated work: its layout or share mode cannot change.")
        _check_change(gpu, change)
        sharing = gpu.sharing if change.mig else change.sharing
        if not change.mig:
            shared[gpu.node] = sharing
        slots = tuple(Slot(profile, start) for profile, start in sorted(change.instances, key=lambda i: i[1]))
        gpus[position] = replace(
            gpu, mig=change.mig, sharing=sharing, allocated=False, ends=None, instances=slots
        )
        changed.add(position)
        nodes.add(gpu.node)
    for node, sharing in shared.items():
        for position in index.nodes[node]:
            gpu = gpus[position]
            if gpu.mig and gpu.sharing != sharing:
                gpus[position] = replace(gpu, sharing=sharing)
                changed.add(position)
            elif not gpu.mig and gpu.sharing != sharing:
                raise ValueError(
                    f"GPU {gpu.id} would stay in share mode {gpu.sharing or 'none'} while another MIG-off "
                    f"GPU of node {node} goes to {sharing or 'none'}: the device plugin shares a node's "
                    "MIG-off GPUs alike."
                )
    for assignment in placement.assignments:
        position = _position(index, assignment.gpu)
        gpus[position] = _allocate(gpus[position], assignment, placement)
        changed.add(position)
    for node in nodes:
        for position in index.nodes[node]:
            if not gpus[position].reconfiguring:
                gpus[position] = replace(gpus[position], reconfiguring=True)
    return with_gpus(fleet, gpus, changed, nodes)


def _check_change(gpu: Gpu, change: Reconfigure) -> None:
    if change.mig:
        if change.sharing:
            raise ValueError(f"GPU {gpu.id} is switched to MIG on but given share mode {change.sharing}.")
        validate_layout(
            gpu_model(gpu.model), [Instance(start, profile) for profile, start in change.instances]
        )
    elif tuple(change.instances) != share_slots(change.sharing):
        raise ValueError(
            f"GPU {gpu.id} in share mode {change.sharing or 'none'} holds exactly "
            f"{len(share_slots(change.sharing))} shares, numbered from 0, not {list(change.instances)}."
        )


class Replaced(dict):
    """GPUs replaced, by position; reading a position not replaced reads the fleet's GPU there."""

    def __init__(self, gpus: Sequence[Gpu]) -> None:
        super().__init__()
        self.gpus = gpus

    def __missing__(self, position: int) -> Gpu:
        return self.gpus[position]


def with_gpus(
    fleet: Fleet, replaced: Mapping[int, Gpu], changed: Iterable[int], reconfiguring: Iterable[str] = ()
) -> Fleet:
    """The fleet with the GPUs at the positions of `replaced` replaced, the `changed` ones among them in a
    new state (the rest only marked reconfiguring), and the nodes `reconfiguring` marked as being
    re-partitioned: how apply, release and the like make a fleet. It shares `fleet`'s index, changed to it
    (pools/placement/index.py), and reads its GPUs from there when they are first asked for, so that making
    it costs what changed."""
    index = fleet_index(fleet)
    version = index.updated(dict(replaced), changed, reconfiguring)
    after = Fleet.made(partial(_gpus_of, index, version))
    _keep(after, index, version)
    return after


def _gpus_of(index: FleetIndex, version: Version) -> tuple[Gpu, ...]:
    index.checkout(version)
    return tuple(index.gpus)


def _position(index: FleetIndex, gpu_id: str) -> int:
    try:
        return index.position[gpu_id]
    except KeyError:
        raise ValueError(f"The placement names GPU {gpu_id!r}, which is not in the fleet.") from None


def _allocate(gpu: Gpu, assignment: Assignment, placement: Placement) -> Gpu:
    """The GPU with the assigned instance (or itself, whole) allocated, marked as the placement's request."""
    if kind_of(assignment.profile).takes_whole_gpu:
        if gpu.mig or gpu.allocated:
            raise ValueError(f"GPU {gpu.id} is not a free MIG-disabled GPU: it cannot be given whole.")
        return replace(gpu, allocated=True, ends=placement.ends)
    slots = list(gpu.instances)
    for number, slot in enumerate(slots):
        if slot.start == assignment.start and slot.profile == assignment.profile and not slot.allocated:
            slots[number] = replace(
                slot, allocated=True, reclaimable=placement.reclaimable, ends=placement.ends
            )
            return replace(gpu, instances=tuple(slots))
    raise ValueError(f"GPU {gpu.id} has no free {assignment.profile} instance at {assignment.start}.")


def place_all(
    fleet: Fleet,
    requests: Sequence[Request],
    *,
    demand: Mapping[tuple[str, str], float] | None = None,
) -> tuple[list[Placement], Fleet]:
    """Requests in the given order, each whole or not at all, each seeing what the earlier ones took and
    the requests after it; returns the placements and the fleet after them. Without `demand`, the requests
    seen so far (placed or not) are the recent demand."""
    queue = list(requests)
    placements: list[Placement] = []
    seen: dict[tuple[str, str], float] = {}
    for number, request in enumerate(queue):
        upcoming = queue[number + 1 : number + 1 + QUEUE_WINDOW]
        if demand is None:
            placement = _place(fleet, request, upcoming, _tally(seen, request), evidence_weight(number + 1))
        else:
            placement = _place(fleet, request, upcoming, demand, RECENT_WEIGHT)
        fleet = apply(fleet, placement)
        placements.append(placement)
    return placements, fleet


def _tally(counts: dict[tuple[str, str], float], request: Request) -> dict[tuple[str, str], float]:
    """Adds the request's instances to `counts` (whole GPUs too, which layout choice ignores)."""
    for item in request.items:
        if isinstance(item.count, int):
            key = (item.model, item.profile)
            counts[key] = counts.get(key, 0) + item.count
    return counts
