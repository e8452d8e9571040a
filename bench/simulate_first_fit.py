"""The baseline of bench/simulate.py: homogeneous first fit, in the what-if simulator's Placer shape.

It cuts a wholly free GPU only into as many instances of the asked profile as fit, at their lowest starts,
takes free instances of the asked profile first in GPU order, and gives a whole GPU from a wholly free MIG-off
GPU (else switches a wholly free MIG GPU off). A request goes whole into the first cluster (in fleet order)
that holds all of it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from functools import cache

from pools import mig
from pools.placement.engine import validate_request
from pools.placement.index import has_allocation
from pools.placement.types import Assignment, Fleet, Gpu, Item, Placement, Reconfigure, Request

NO_ROOM = "first fit found no room in any cluster"


@cache
def homogeneous_layout(model: str, profile: str) -> tuple[tuple[str, int], ...]:
    """As many instances of `profile` as one empty GPU of `model` holds, at their lowest valid starts, as
    (profile, start) sorted by start."""
    gpu_model = mig.gpu_model(model)
    for count in range(gpu_model.profile(profile).max_count, 0, -1):
        layout = mig.place_profiles(gpu_model, {profile: count})
        if layout is not None:
            return tuple((i.profile, i.start) for i in layout)
    raise ValueError(f"No {profile} fits on an empty {model}.")


class _Scratch:
    """One GPU as first fit sees it while placing one request: its layout and what is taken on it."""

    __slots__ = ("gpu", "mig", "slots", "whole_taken")

    def __init__(self, gpu: Gpu) -> None:
        self.gpu = gpu
        self.mig = gpu.mig
        self.whole_taken = gpu.allocated
        self.slots = [[slot.profile, slot.start, slot.allocated] for slot in gpu.instances]

    @property
    def wholly_free(self) -> bool:
        return not self.whole_taken and not any(taken for _, _, taken in self.slots)


def first_fit(
    fleet: Fleet,
    request: Request,
    *,
    upcoming: Sequence[Request] = (),
    demand: Mapping[tuple[str, str], float] | None = None,
) -> Placement:
    """Homogeneous first fit in the simulator's Placer shape; `upcoming` and `demand` are not looked at.
    The request goes whole into the first cluster (in fleet order) that holds all of it."""
    errors = validate_request(request, fleet)
    if errors:
        return Placement(request.id, False, reason=" ".join(errors))
    for cluster in dict.fromkeys(gpu.cluster for gpu in fleet.gpus):
        usable = [
            gpu
            for gpu in fleet.gpus
            if gpu.cluster == cluster and gpu.schedulable and request.group in (None, gpu.group)
        ]
        placement = _first_fit_in(usable, request)
        if placement is not None:
            return placement
    return Placement(request.id, False, reason=NO_ROOM)


def _first_fit_in(gpus: list[Gpu], request: Request) -> Placement | None:
    # Most tries are of waiting requests that do not fit: a cheap bound turns most of them away.
    if any(_room(gpus, item) < item.count for item in request.items):
        return None
    models = {item.model for item in request.items}
    scratch = [_Scratch(gpu) for gpu in gpus if gpu.model in models]
    reconfigure: dict[int, Reconfigure] = {}
    assignments: list[Assignment] = []
    for item in request.items:
        mine = [(n, s) for n, s in enumerate(scratch) if s.gpu.model == item.model]
        take = _take_whole if item.profile == mig.FULL_GPU else _take_instances
        taken = take(mine, item, reconfigure)
        if len(taken) < item.count:
            return None
        assignments += taken
    ordered = tuple(reconfigure[n] for n in sorted(reconfigure))
    return Placement(request.id, True, reconfigure=ordered, assignments=tuple(assignments))


def _room(gpus: list[Gpu], item: Item) -> int:
    """What first fit could give this item alone: the free instances of its profile, and the wholly free
    GPUs that hold none (each cut into the homogeneous layout, or given whole). Exact for a request of one
    item; for more, a bound, since its items may want the same wholly free GPUs."""
    whole = item.profile == mig.FULL_GPU
    per_gpu = 1 if whole else len(homogeneous_layout(item.model, item.profile))
    room = 0
    for gpu in gpus:
        if gpu.model != item.model:
            continue
        free = 0 if whole else sum(not s.allocated and s.profile == item.profile for s in gpu.instances)
        if free:
            room += free
        elif not has_allocation(gpu):
            room += per_gpu
    return room


def _take_whole(
    mine: list[tuple[int, _Scratch]], item: Item, reconfigure: dict[int, Reconfigure]
) -> list[Assignment]:
    free = [(n, s) for n, s in mine if s.wholly_free]
    ordered = [(n, s) for n, s in free if not s.mig] + [(n, s) for n, s in free if s.mig]
    taken = []
    for n, s in ordered[: item.count]:
        if s.mig:
            reconfigure[n] = Reconfigure(s.gpu.id, False, ())
            s.mig, s.slots = False, []
        s.whole_taken = True
        taken.append(Assignment(s.gpu.id, mig.FULL_GPU, None))
    return taken


def _take_instances(
    mine: list[tuple[int, _Scratch]], item: Item, reconfigure: dict[int, Reconfigure]
) -> list[Assignment]:
    taken: list[Assignment] = []

    def take_free(s: _Scratch) -> None:
        for slot in s.slots:
            if len(taken) < item.count and slot[0] == item.profile and not slot[2]:
                slot[2] = True
                taken.append(Assignment(s.gpu.id, item.profile, slot[1]))

    for _, s in mine:
        if s.mig:
            take_free(s)
    for n, s in mine:
        if len(taken) >= item.count:
            break
        if s.wholly_free:
            layout = homogeneous_layout(item.model, item.profile)
            reconfigure[n] = Reconfigure(s.gpu.id, True, layout)
            s.mig, s.slots = True, [[profile, start, False] for profile, start in layout]
            take_free(s)
    return taken
