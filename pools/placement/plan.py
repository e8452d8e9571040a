"""Plans one request on an indexed fleet: which free instances it takes, which free GPUs get new layouts.

The order of preference, per GPU model of the request, in one cluster, on GPUs whose group offers the item's
kind (pools/kinds: `offer_of`):
1. `full` items: free MIG-disabled GPUs, then wholly free MIG GPUs switched off, then the GPUs of a shared
   node none of whose shares is in use, its sharing turned off; on one node if one can take them all
   (NVLink), else on the fewest nodes.
2. Shares (time-sliced, MPS): free shares of GPUs that already hold work (as MIG instances below), then
   wholly free GPUs already shared that way, then nodes switched to that share mode. The device plugin shares
   every MIG-off GPU of a node alike, so a node changes mode only when none of its MIG-off GPUs holds work;
   nodes shared another way go first, then nodes of whole GPUs.
3. MIG items: free instances on GPUs that already hold a tenant, whose layout is fixed anyway; on those
   whose busy time the request's end extends least first, then on those whose work ends soonest after it
   (pools/placement/ends.py), then on those holding the most tenants. Work that may not be reclaimed
   (within a guarantee) goes last to GPUs whose work all may (borrowed), so that a reclaim frees such a
   GPU whole.
4. Free instances of wholly free GPUs, when their layout is nearly as good as a new one would be.
5. New layouts on as few wholly free GPUs as possible: MIG GPUs first, then MIG-disabled ones switched on,
   on nodes being re-partitioned already, then on as few nodes as it can (see pools/placement/layouts.py).
Each cluster that holds the request's models is planned; the plan that changes least wins.

Plain data in and out: positions in the fleet, (profile, start) pairs. pools/placement/engine.py wraps them.
Where a step chooses among many nodes or GPUs, it reads them through pools/placement/choices.py, which gives
what a read of every one gave, in the same order, without reading every one of a large fleet.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING

from pools.kinds import MIG, WHOLE, kind_of, share_kind
from pools.mig import COMPUTE_SLICES
from pools.placement.choices import (
    Choice,
    blank_entry,
    blank_tiers,
    convertible,
    full_choice,
    full_entry,
    node_sharing,
    partial_order,
    usable_tiers,
    whole_shared,
    whole_slot_order,
)
from pools.placement.index import Bucket, FleetIndex
from pools.placement.layouts import (
    Counts,
    Recent,
    best_filler_score,
    catalogue,
    filler_score,
    layout_instances,
    plan_layouts,
    recent_demand,
)
from pools.placement.ranks import BLANK_TABLES
from pools.placement.reasons import unplaced_reason

if TYPE_CHECKING:
    from pools.placement.types import Request

# The queue is read this far ahead: more than enough demand to fill the few GPUs one request re-partitions.
QUEUE_WINDOW = 64
# Score units (see pools/placement/layouts.py): a provisioned layout is kept unless a new one would serve
# later demand better by more than this (one and a half generic compute slices), as re-cutting pauses a node.
KEEP_LAYOUT_SLACK = 150
# Wholly free GPUs whose provisioned layout is compared with a new one, per profile asked for.
LAYOUT_CANDIDATES = 16

Wanted = dict[str, tuple[int, dict[str, int]]]  # model -> (full GPUs, {profile: instances})


Change = tuple[bool, tuple[tuple[str, int], ...], str]  # MIG on, (profile, start) of each slot, share mode


@dataclass
class Plan:
    reconfigure: dict[int, Change] = field(default_factory=dict)
    assignments: list[tuple[int, str, int | None]] = field(default_factory=list)
    taken: set[int] = field(default_factory=set)  # GPUs given whole, re-partitioned or newly in use
    slots: set[tuple[int, int]] = field(default_factory=set)  # provisioned instances assigned: (GPU, start)
    used_free: dict[tuple[str, str], int] = field(default_factory=dict)  # (model, profile) -> from free ones
    nodes: dict[str, None] = field(default_factory=dict)  # nodes re-partitioned or re-shared, in order
    sharing: dict[str, str] = field(default_factory=dict)  # node -> the share mode this plan puts it in
    switched_on: int = 0  # MIG-disabled GPUs turned to MIG

    def copy(self) -> Plan:
        return replace(
            self,
            reconfigure=dict(self.reconfigure),
            assignments=list(self.assignments),
            taken=set(self.taken),
            slots=set(self.slots),
            used_free=dict(self.used_free),
            nodes=dict(self.nodes),
            sharing=dict(self.sharing),
        )

    def cost(self, index: FleetIndex) -> tuple[int, int, int, int]:
        full_nodes = {
            index.gpus[gpu].node for gpu, profile, _ in self.assignments if kind_of(profile).takes_whole_gpu
        }
        paused = sum(node not in index.reconfiguring for node in self.nodes)
        return (len(self.reconfigure), self.switched_on, paused, len(full_nodes))


@dataclass
class _Context:
    index: FleetIndex
    group: str | None
    upcoming: Sequence[Request]
    demand: Mapping[tuple[str, str], float] | None
    recent_weight: int
    reclaimable: bool = False  # the request's work may be reclaimed
    ends: int | None = None  # when the request's pool ends
    _queue: dict[str, dict[str, int]] = field(default_factory=dict)

    def queue(self, model: str) -> dict[str, int]:
        """Instances of `model` that the waiting requests which may share these GPUs ask for."""
        if model not in self._queue:
            counts: dict[str, int] = {}
            for request in self.upcoming:
                if request.group is not None and self.group is not None and request.group != self.group:
                    continue
                for item in request.items:
                    if item.model == model and not kind_of(item.profile).takes_whole_gpu and item.count > 0:
                        counts[item.profile] = counts.get(item.profile, 0) + item.count
            self._queue[model] = counts
        return self._queue[model]

    def recent(self, model: str) -> Recent:
        return recent_demand(model, self.demand, self.recent_weight)

    def queue_net(self, model: str, buckets: list[Bucket], plan: Plan) -> Counts:
        """Queue demand that free instances do not cover yet."""
        cat = catalogue(model)
        wanted = self.queue(model)
        net = []
        for name in cat.names:
            free = sum(b.free.get(name, 0) for b in buckets) - plan.used_free.get((model, name), 0)
            net.append(max(0, wanted.get(name, 0) - free))
        return tuple(net)


def wanted_by_model(request: Request) -> Wanted:
    wanted: Wanted = {}
    for item in request.items:
        full, mig = wanted.get(item.model, (0, {}))
        if kind_of(item.profile).takes_whole_gpu:
            full += item.count
        else:
            mig[item.profile] = mig.get(item.profile, 0) + item.count
        wanted[item.model] = (full, mig)
    return wanted


def plan_request(
    index: FleetIndex,
    request: Request,
    upcoming: Sequence[Request],
    demand: Mapping[tuple[str, str], float] | None,
    recent_weight: int,
) -> Plan | str:
    """The best plan in any one cluster, or the reason no cluster can take the request whole."""
    wanted = wanted_by_model(request)
    context = _Context(
        index, request.group, upcoming, demand, recent_weight, request.reclaimable, request.ends
    )
    best: tuple[tuple[int, int, int, int], Plan] | None = None
    failed: dict[str, str] = {}  # cluster -> the first model it cannot take
    for cluster in index.clusters():
        plan = Plan()
        for model, (full, mig) in wanted.items():
            if not _plan_model(context, plan, cluster, model, full, mig):
                failed[cluster] = model
                break
        else:
            cost = plan.cost(index)
            if best is None or cost < best[0]:
                best = (cost, plan)
                if cost[:3] == (0, 0, 0) and cost[3] <= 1:
                    break  # nothing changes and no better NVLink locality exists: no cluster beats it
    if best is None:
        return unplaced_reason(index, request.group, wanted, failed)
    return best[1]


def offering(buckets: list[Bucket], offer: str) -> list[Bucket]:
    """The buckets whose GPU group offers `offer` (a kind's name, or a share profile)."""
    return [bucket for bucket in buckets if offer in bucket.offers]


def _plan_model(
    context: _Context, plan: Plan, cluster: str, model: str, full: int, parts: dict[str, int]
) -> bool:
    buckets = context.index.buckets_for(cluster, model, context.group)
    if not buckets or (
        full and not _place_full(context.index, plan, offering(buckets, WHOLE.name), model, full)
    ):
        return False
    need: dict[str, int] = {}
    for profile, count in parts.items():
        if not count:
            continue
        if kind_of(profile) is not MIG:
            if not _place_shares(context, plan, offering(buckets, profile), model, profile, count):
                return False
        else:
            need[profile] = count
    if not need:
        return True
    buckets = offering(buckets, MIG.name)
    if not buckets:
        return False
    _use_partial(context, plan, buckets, model, need)
    if not need:
        return True
    before, need_before = plan.copy(), dict(need)
    _use_whole_layouts(context, plan, buckets, model, need)
    if not need or _repartition(context, plan, buckets, model, need):
        return True
    # A kept layout can hold fewer of the instances than a new one would: try again re-cutting instead.
    _restore(plan, before)
    return _repartition(context, plan, buckets, model, need_before)


def _restore(plan: Plan, saved: Plan) -> None:
    for name in (
        "reconfigure",
        "assignments",
        "taken",
        "slots",
        "used_free",
        "nodes",
        "sharing",
        "switched_on",
    ):
        setattr(plan, name, getattr(saved, name))


def _pick_by_nodes(
    count: int, tiers: list[Choice], size: Callable[[tuple], int], gpus_of: Callable[[str], list[int]]
) -> list[int]:
    """Up to `count` GPUs: tier by tier; in a tier the smallest node that takes the rest whole (which keeps
    larger nodes whole for multi-GPU work), else the largest node, and again. A node's class gives its
    `size`, `gpus_of` its GPUs."""
    chosen: list[int] = []
    for tier in tiers:
        while len(chosen) < count:
            remaining = count - len(chosen)
            node = tier.best(lambda cls, remaining=remaining: size(cls) if size(cls) >= remaining else None)
            if node is None:
                node = tier.best(lambda cls: -size(cls))
                if node is None:
                    break
            tier.remove(node)
            chosen.extend(gpus_of(node)[:remaining])
    return chosen


def _place_full(index: FleetIndex, plan: Plan, buckets: list[Bucket], model: str, count: int) -> bool:
    """Whole GPUs: one node if any can hold them all, else the fewest nodes; MIG-disabled GPUs before
    switching wholly free MIG GPUs off or turning a node's sharing off (with its GPUs that it frees), and
    switching on nodes being re-partitioned already. A MIG GPU switched off on a shared node would be shared,
    so on a shared node only a node turned to whole GPUs gives any. A node's class is what
    pools/placement/choices.py's `full_entry` reads: (MIG-disabled GPUs, GPUs a switch gives, quiet)."""
    choice = full_choice(index, plan, buckets, model)
    if choice.weight(lambda cls: cls[0] + cls[1]) < count:
        return False
    chosen: list[int] = []

    def rank(cls: tuple[int, int, bool], need: int) -> tuple[int, int, int] | None:
        off, switched, quiet = cls
        if off + switched < need:
            return None
        switches = max(0, need - off)
        return (switches, int(switches > 0 and not quiet), off + switched)

    while len(chosen) < count:
        need = count - len(chosen)
        node = choice.best(lambda cls, need=need: rank(cls, need))
        if node is None:
            node = choice.best(lambda cls: (-cls[0] - cls[1], -cls[0]))
        choice.remove(node)
        _cls, _order, off, whole = full_entry(index, buckets, node, plan, model)
        chosen.extend((off + whole)[:need])
    for gpu in chosen:
        node = index.gpus[gpu].node
        if node_sharing(index, node, plan):
            _share_node(index, plan, node, "")
        if index.gpus[gpu].mig:
            _switch_off(index, plan, gpu, "")
        plan.taken.add(gpu)
        plan.assignments.append((gpu, WHOLE.profile, None))
    return True


def _share_node(index: FleetIndex, plan: Plan, node: str, sharing: str) -> None:
    """Every MIG-off GPU of the node put in share mode `sharing` ("" for none), as the device plugin does."""
    slots = share_slots(sharing)
    for gpu in index.nodes[node]:
        if not index.gpus[gpu].mig:
            plan.reconfigure[gpu] = (False, slots, sharing)
            plan.taken.add(gpu)
    plan.nodes[node] = None
    plan.sharing[node] = sharing


def _switch_off(index: FleetIndex, plan: Plan, gpu: int, sharing: str) -> None:
    """A wholly free MIG GPU switched off, into its node's share mode `sharing`."""
    plan.reconfigure[gpu] = (False, share_slots(sharing), sharing)
    plan.taken.add(gpu)
    plan.nodes[index.gpus[gpu].node] = None


def share_slots(sharing: str) -> tuple[tuple[str, int], ...]:
    """The shares of one GPU in share mode `sharing` ("" for none: no shares)."""
    return tuple((sharing, i) for i in range(share_kind(sharing).replicas(sharing))) if sharing else ()


def _place_shares(
    context: _Context, plan: Plan, buckets: list[Bucket], model: str, profile: str, count: int
) -> bool:
    """Shares of one mode: free shares of GPUs in use, then of wholly free GPUs in that mode, then wholly free
    MIG GPUs of nodes in that mode switched off, then nodes put in that mode (nodes shared another way first,
    then nodes of whole GPUs; chosen as `_pick_by_nodes` chooses)."""
    if not buckets:
        return False
    index, need = context.index, {profile: count}
    _use_partial(context, plan, buckets, model, need)
    left = need.get(profile, 0)
    replicas = share_kind(profile).replicas(profile)

    def take(gpu: int) -> None:
        nonlocal left
        taken = min(left, replicas)
        plan.assignments.extend((gpu, profile, start) for start in range(taken))
        left -= taken

    for gpu in whole_slot_order(index, buckets, profile):
        if not left:
            break
        if gpu not in plan.taken:
            plan.taken.add(gpu)
            left -= _take_slots(index, plan, model, gpu, profile, left)
    if left:
        for bucket, node in whole_shared(index, plan, buckets, profile):
            for gpu in bucket.whole.ordered(node):
                if left and gpu not in plan.taken:
                    _switch_off(index, plan, gpu, profile)
                    take(gpu)
            if not left:
                break
    if not left:
        return True
    # Nodes shared another way first, then nodes of whole GPUs; a node's class is (share mode, GPUs).
    tiers = usable_tiers(index, plan, buckets, model, profile)
    chosen = _pick_by_nodes(
        -(-left // replicas),
        tiers,
        lambda cls: cls[1],
        lambda node: convertible(index, plan, node, profile, model),
    )
    for gpu in chosen:
        node = index.gpus[gpu].node
        if node_sharing(index, node, plan) != profile:
            _share_node(index, plan, node, profile)
        if index.gpus[gpu].mig:
            _switch_off(index, plan, gpu, profile)
        take(gpu)
    return not left


def _take_slots(index: FleetIndex, plan: Plan, model: str, gpu: int, profile: str, count: int) -> int:
    taken = 0
    for slot in index.gpus[gpu].instances:
        if taken == count:
            break
        if slot.profile == profile and not slot.allocated and (gpu, slot.start) not in plan.slots:
            plan.slots.add((gpu, slot.start))
            plan.assignments.append((gpu, profile, slot.start))
            taken += 1
    key = (model, profile)
    plan.used_free[key] = plan.used_free.get(key, 0) + taken
    return taken


def _use_partial(
    context: _Context, plan: Plan, buckets: list[Bucket], model: str, need: dict[str, int]
) -> None:
    """Free instances of GPUs that already hold work: a GPU is wholly free (and so can be re-cut, or given
    whole) only once its last tenant leaves. So those of the GPUs whose busy time the request's end extends
    least first, and among those it does not extend, those whose work ends soonest after it (the fit of
    pools/placement/ends.py); then those holding the most instances, where one more tenant delays that
    least as several stay anyway. Work that may not be reclaimed goes to GPUs whose work may all be
    reclaimed last: a reclaim frees such a GPU whole."""
    index = context.index
    apart = not context.reclaimable
    for profile in list(need):
        for gpu in partial_order(index, buckets, profile, apart, context.ends):
            need[profile] -= _take_slots(index, plan, model, gpu, profile, need[profile])
            if not need[profile]:
                del need[profile]
                break


def _use_whole_layouts(
    context: _Context, plan: Plan, buckets: list[Bucket], model: str, need: dict[str, int]
) -> None:
    """Provisioned instances of wholly free GPUs, GPU by GPU, while their layout is about as good as new."""
    index, cat = context.index, catalogue(model)
    candidates: dict[int, None] = {}
    for profile in need:
        for gpu in whole_slot_order(index, buckets, profile):
            if len(candidates) >= LAYOUT_CANDIDATES * len(need):
                break
            if gpu not in plan.taken:
                candidates[gpu] = None
    if not candidates:
        return
    queue, recent = (
        context.queue_net(model, buckets, plan),
        recent_demand(model, context.demand, context.recent_weight),
    )
    while need and candidates:
        wanted = cat.counts(need)
        best: tuple[int, int, int] | None = None
        for gpu in candidates:
            have = cat.counts(_profile_counts(index.gpus[gpu].instances))
            part = tuple(min(h, w) for h, w in zip(have, wanted, strict=True))
            covered = cat.compute_of(part)
            ideal = best_filler_score(model, part, queue, recent) if covered else None
            if ideal is None:
                continue
            filler = tuple(h - p for h, p in zip(have, part, strict=True))
            margin = filler_score(cat, filler, queue, recent) - ideal
            if margin + KEEP_LAYOUT_SLACK >= 0 and (best is None or (covered, margin) > best[:2]):
                best = (covered, margin, gpu)
        if best is None:
            return
        gpu = best[2]
        del candidates[gpu]
        plan.taken.add(gpu)
        for profile in list(need):
            need[profile] -= _take_slots(index, plan, model, gpu, profile, need[profile])
            if not need[profile]:
                del need[profile]


def _profile_counts(instances: Sequence) -> dict[str, int]:
    counts: dict[str, int] = {}
    for slot in instances:
        counts[slot.profile] = counts.get(slot.profile, 0) + 1
    return counts


def _repartition(
    context: _Context, plan: Plan, buckets: list[Bucket], model: str, need: dict[str, int]
) -> bool:
    index, cat = context.index, catalogue(model)
    # Per table, nodes in tiers, classed by (wholly free GPUs there, being re-partitioned).
    tiers = {table: blank_tiers(index, plan, buckets, table) for table in BLANK_TABLES}
    available = sum(tier.weight(lambda cls: cls[0]) for found in tiers.values() for tier in found)
    wanted = cat.counts(need)
    # Bounds first, so that an absurd count fails fast instead of planning thousands of layouts.
    fewest = max(
        -(-cat.compute_of(wanted) // COMPUTE_SLICES),
        *(-(-n // most) for n, most in zip(wanted, cat.most, strict=True)),
    )
    if fewest > available:
        return False
    queue, recent = (
        context.queue_net(model, buckets, plan),
        recent_demand(model, context.demand, context.recent_weight),
    )
    layouts = plan_layouts(model, wanted, queue, recent)
    chosen: list[int] = []
    # MIG-disabled GPUs are what `full` work and shares want: switched on only when no MIG GPU is left.
    for table in BLANK_TABLES:

        def gpus_of(node: str, table: str = table) -> list[int]:
            return blank_entry(index, buckets, table, node, plan)[2]

        chosen += _pick_by_nodes(len(layouts) - len(chosen), tiers[table], lambda cls: cls[0], gpus_of)
        if len(chosen) == len(layouts):
            break
    else:
        return False
    for gpu, (counts, part) in zip(chosen, layouts, strict=True):
        instances = layout_instances(model, counts)
        current = index.gpus[gpu]
        provisioned = tuple(sorted(((s.profile, s.start) for s in current.instances), key=lambda i: i[1]))
        plan.taken.add(gpu)
        plan.switched_on += not current.mig
        if not current.mig or provisioned != instances:
            plan.reconfigure[gpu] = (True, instances, "")
            plan.nodes[current.node] = None
        left = dict(zip(cat.names, part, strict=True))
        for profile, start in instances:
            if left[profile]:
                left[profile] -= 1
                plan.assignments.append((gpu, profile, start))
    need.clear()
    return True
