"""What a request may take while an older one starves: the queue's backfill rule, for the queue
(pools/services/queue.py) and the what-if simulator (pools/placement/simulation.py) alike.

Words used here (placement words are pools/placement/engine.py's):
- starving request: one that has waited the backfill grace and still does not fit. Capacity collects for it:
  nothing it could use is given to a later request that competes with it.
- wanted: the (GPU model, profile) pairs a starving request asks for; "full" for whole GPUs.
- out of its way: a placement that takes only free MIG instances of GPUs that already hold work, of profiles
  the starving request does not ask for. It changes no layout and takes no wholly free GPU, so it takes
  nothing the starving request could be given now or when that GPU is re-cut: such an instance can only
  ever serve its own profile, and the GPU is not wholly free while its other tenants stay.

The price: a GPU given one more tenant may become wholly free later than it would have. On the seeded weeks
of bench/simulate.py, before and after this rule: more served and shorter waits overall, and somewhat longer
waits for whole-GPU requests (README, "Placement over time").

Pure: plain data in, a yes or no out.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable

from pools.kinds import kind_of
from pools.placement.engine import fleet_index
from pools.placement.index import has_allocation
from pools.placement.types import Fleet, Item, Placement

__all__ = ["may_keep_out_of_the_way", "out_of_the_way", "room_out_of_the_way", "wanted_pairs"]


def wanted_pairs(items: Iterable[Item]) -> frozenset[tuple[str, str]]:
    """The (model, profile) pairs of a request's items."""
    return frozenset((item.model, item.profile) for item in items)


def may_keep_out_of_the_way(asked: Collection[tuple[str, str]], wanted: Collection[tuple[str, str]]) -> bool:
    """Whether a request asking for `asked` could be placed out of the way of starving requests that want
    `wanted` at all, before it is placed: not with a whole GPU, nor with a profile they want. A queue run
    places a held-back request only when this holds, so holding back costs no more than it did."""
    return not any(kind_of(profile).takes_whole_gpu or (model, profile) in wanted for model, profile in asked)


def room_out_of_the_way(fleet: Fleet, items: Iterable[Item]) -> bool:
    """Whether the free instances of GPUs that hold work, in any cluster and group of `fleet`, are as many
    as the items ask for of each profile: without them no placement keeps out of the way, so a held-back
    request is placed only where they are. Counted from the fleet's index."""
    asked: dict[tuple[str, str], int] = {}
    for item in items:
        asked[(item.model, item.profile)] = asked.get((item.model, item.profile), 0) + item.count
    index = fleet_index(fleet)
    for (model, profile), count in asked.items():
        free = 0
        for models in index.layout.values():
            for key in models.get(model, {}).values():
                free += index.buckets[key].partial.free(profile)
        if free < count:
            return False
    return True


def out_of_the_way(fleet: Fleet, placement: Placement, wanted: Collection[tuple[str, str]]) -> bool:
    """Whether a placed placement on `fleet` (as it was before the placement) keeps out of the way of
    starving requests that ask for `wanted`: no re-partitioning, no whole GPU, and only free instances of
    GPUs that already hold work, of profiles not wanted."""
    if not placement.placed or placement.reconfigure:
        return False
    index = fleet_index(fleet)
    for assignment in placement.assignments:
        position = index.position.get(assignment.gpu)
        if position is None or kind_of(assignment.profile).takes_whole_gpu:
            return False
        gpu = index.gpus[position]
        if not gpu.mig or not has_allocation(gpu) or (gpu.model, assignment.profile) in wanted:
            return False
    return True
