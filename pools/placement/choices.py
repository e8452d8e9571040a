"""How the plan (pools/placement/plan.py) reads many nodes or GPUs of its buckets at once, each choice giving
what a full read of every node of the buckets gave, in the same order.

Words used here (placement words are plan.py's):
- entry: what one choice reads of one node, exactly, the plan's changes counted: its class (what the choice
  compares nodes by), its order (where it stands among equals: the first bucket that gives it, by `number`,
  then its `seq` in the table the choice reads) and its GPUs for that choice.
- ranks: the entries of a large bucket's nodes, kept by pools/placement/ranks.py as if no plan had touched
  the fleet. A choice reads the first node of a few classes there, and reads on the spot the nodes the ranks
  do not answer for: those the plan touched (GPUs taken, nodes re-partitioned or re-shared), those in more
  than one bucket of the model (`split`: their GPUs merge over the buckets) and every node of a small bucket.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any, Protocol

from pools.placement.index import Bucket, FleetIndex
from pools.placement.ranks import BucketRanks, Order, Ranked, holding, partial_rank, ranks_of

__all__ = [
    "Choice",
    "blank_entry",
    "blank_tiers",
    "convertible",
    "full_choice",
    "full_entry",
    "node_sharing",
    "partial_order",
    "usable_tiers",
    "whole_shared",
    "whole_slot_order",
]

Entry = tuple[Any, Order, list[int]]  # class, order, the node's GPUs for that choice


class Touches(Protocol):
    """What of a plan changes how nodes read: GPUs taken, nodes changed, their new share modes."""

    taken: set[int]
    nodes: dict[str, None]
    sharing: dict[str, str]


def touched_nodes(index: FleetIndex, plan: Touches) -> set[str]:
    return {index.gpus[gpu].node for gpu in plan.taken} | set(plan.nodes)


# --- one node, read exactly ------------------------------------------------------------------------------


def node_sharing(index: FleetIndex, node: str, plan: Touches) -> str:
    """The node's share mode: the one this plan puts it in, else the fleet's."""
    return plan.sharing[node] if node in plan.sharing else index.sharing(node)


def convertible(index: FleetIndex, plan: Touches, node: str, sharing: str, model: str) -> list[int]:
    """The GPUs of `model` that putting a node in share mode `sharing` ("" for none) would give now: its
    schedulable MIG-off GPUs, then its wholly free MIG GPUs (to be switched off). Empty where the node is in
    that mode already, or may not change now (pools/placement/index.py: `free_mig_off`; or this plan changes
    or takes its MIG-off GPUs)."""
    if node in plan.nodes or node_sharing(index, node, plan) == sharing:
        return []
    mig_off = index.free_mig_off(node, model)
    if mig_off is None or any(gpu in plan.taken for gpu in index.nodes[node] if not index.gpus[gpu].mig):
        return []
    return mig_off + [gpu for gpu in index.wholly_free_mig(node, model) if gpu not in plan.taken]


def _merged(
    buckets: Sequence[Bucket], table: str, node: str, taken: Iterable[int]
) -> tuple[list[int], Order]:
    """The node's GPUs in one table of each bucket, less `taken`, bucket after bucket; and where the node
    stands: (bucket number, seq) in the first bucket that gives any."""
    gpus: list[int] = []
    at: Order = ()
    for bucket in buckets:
        nodes = getattr(bucket, table)
        if node in nodes:
            free = [gpu for gpu in nodes.ordered(node) if gpu not in taken]
            if free:
                gpus += free
                at = at or (bucket.number, nodes.since[node])
    return gpus, at


def full_entry(
    index: FleetIndex, buckets: Sequence[Bucket], node: str, plan: Touches, model: str
) -> tuple[tuple[int, int, bool], Order, list[int], list[int]] | None:
    """How whole GPUs read a node: ((its free MIG-disabled GPUs, GPUs a switch gives, quiet), order, the
    former, the latter), or None where it gives none. Quiet: being re-partitioned, or by this plan. In
    order: nodes with free MIG-disabled GPUs; then unshared nodes with wholly free MIG GPUs; then shared
    nodes that turning sharing off would give GPUs, those with wholly free shared GPUs first."""
    off, off_at = _merged(buckets, "off", node, plan.taken)
    sharing = node_sharing(index, node, plan)
    at: Order = ()
    if not sharing:
        whole, whole_at = _merged(buckets, "whole", node, plan.taken)
        if whole:
            at = (1, 0, *whole_at)
    else:
        whole = []
        _gpus, shared_at = _merged(buckets, "shared", node, plan.taken)
        _gpus, whole_at = _merged(buckets, "whole", node, plan.taken)
        if shared_at or whole_at:
            whole = convertible(index, plan, node, "", model)
            at = (2, 0, *shared_at) if shared_at else (2, 1, *whole_at)
    if off:
        at = (0, 0, *off_at)
    elif not whole:
        return None
    quiet = node in index.reconfiguring or node in plan.nodes
    return (len(off), len(whole), quiet), at, off, whole


def blank_entry(
    index: FleetIndex, buckets: Sequence[Bucket], table: str, node: str, plan: Touches
) -> Entry | None:
    """How new layouts read a node in one table: ((its GPUs there, being re-partitioned), order, GPUs)."""
    gpus, at = _merged(buckets, table, node, plan.taken)
    return ((len(gpus), node in index.reconfiguring), at, gpus) if gpus else None


def usable_entry(
    index: FleetIndex, buckets: Sequence[Bucket], node: str, plan: Touches, model: str, sharing: str
) -> Entry | None:
    """How shares read a node that may be put in share mode `sharing`: ((its share mode, the GPUs that
    gives), order, those GPUs); ordered by the first bucket that has it, then its shared, off or whole
    table there."""
    at: Order = ()
    for bucket in buckets:
        for number, table in enumerate((bucket.shared, bucket.off, bucket.whole)):
            if node in table:
                at = (bucket.number, number, table.since[node])
                break
        if at:
            break
    gpus = convertible(index, plan, node, sharing, model) if at else []
    return ((node_sharing(index, node, plan), len(gpus)), at, gpus) if gpus else None


# --- choosing among many ---------------------------------------------------------------------------------


class Choice:
    """The nodes one choice picks among: the members of `ranks` whose class `admits`, less `skip`, and the
    nodes read on the spot (`extra`: node -> class and order)."""

    def __init__(
        self,
        ranks: Sequence[Ranked],
        extra: dict[str, tuple[Any, Order]],
        skip: set[str],
        admits: Callable[[Any], bool] = lambda cls: True,
    ) -> None:
        self.ranks, self.extra, self.skip, self.admits = ranks, extra, skip, admits

    def best(self, key: Callable[[Any], Any]) -> str | None:
        """The node whose (key(class), order) is least, among those whose key is not None."""
        found: tuple[Any, Order, str] | None = None
        for ranked in self.ranks:
            for cls, members in ranked.classes.items():
                rank = key(cls) if self.admits(cls) else None
                if rank is None or (found is not None and rank > found[0]):
                    continue
                for order, node in members:
                    if node not in self.skip:
                        if found is None or (rank, order) < found[:2]:
                            found = (rank, order, node)
                        break
        for node, (cls, order) in self.extra.items():
            rank = key(cls) if self.admits(cls) else None
            if rank is not None and (found is None or (rank, order) < found[:2]):
                found = (rank, order, node)
        return None if found is None else found[2]

    def remove(self, node: str) -> None:
        self.skip.add(node)
        self.extra.pop(node, None)

    def weight(self, size: Callable[[Any], int]) -> int:
        """The sum of `size(class)` over the nodes."""
        total = sum(size(cls) for cls, _order in self.extra.values() if self.admits(cls))
        for ranked in self.ranks:
            total += sum(size(cls) * len(m) for cls, m in ranked.classes.items() if self.admits(cls))
            for node in self.skip:
                entry = ranked.entries.get(node)
                if entry is not None and self.admits(entry[0]):
                    total -= size(entry[0])
        return total


def _kept_and_spot(
    index: FleetIndex, plan: Touches, buckets: Sequence[Bucket]
) -> tuple[set[str], set[str], list[BucketRanks]]:
    """The nodes the plan touched; the nodes to read on the spot (those, the split ones and every node of a
    bucket that keeps no ranks); and the ranks of the buckets that keep them, in the buckets' order."""
    touched = touched_nodes(index, plan)
    spot = touched | index.split_nodes(buckets)
    kept = []
    for bucket in buckets:
        found = ranks_of(index, bucket)
        if found is None:
            spot.update(bucket.members)
        else:
            kept.append(found)
    return touched, spot, kept


def _read(
    index: FleetIndex,
    buckets: Sequence[Bucket],
    plan: Touches,
    ranked: Callable[[BucketRanks], Ranked],
    entry: Callable[[str], tuple | None],
) -> tuple[list[Ranked], dict[str, tuple], set[str]]:
    """The ranks of the buckets that keep them; the nodes read on the spot, with their entries; and the
    nodes the plan touched, which the ranks read as they were."""
    touched, spot, kept = _kept_and_spot(index, plan, buckets)
    ranks = [ranked(found) for found in kept]
    extra = {}
    for node in spot:
        read = entry(node)
        if read is not None:
            extra[node] = read
    return ranks, extra, touched


def full_choice(index: FleetIndex, plan: Touches, buckets: Sequence[Bucket], model: str) -> Choice:
    """The nodes whole GPUs may come from, classed as `full_entry` classes them."""
    ranks, extra, touched = _read(
        index,
        buckets,
        plan,
        lambda found: found.full,
        lambda node: full_entry(index, buckets, node, plan, model),
    )
    return Choice(ranks, {node: entry[:2] for node, entry in extra.items()}, touched)


def blank_tiers(index: FleetIndex, plan: Touches, buckets: Sequence[Bucket], table: str) -> list[Choice]:
    """The nodes with wholly free GPUs in one table, classed as `blank_entry` classes them, in tiers: nodes
    this plan re-partitions already (in its order), nodes being re-partitioned, the rest."""
    ranks, extra, touched = _read(
        index,
        buckets,
        plan,
        lambda found: found.blank(table),
        lambda node: blank_entry(index, buckets, table, node, plan),
    )
    mine = {node: (extra[node][0], (number,)) for number, node in enumerate(plan.nodes) if node in extra}
    others = {node: entry[:2] for node, entry in extra.items() if node not in plan.nodes}
    return [
        Choice((), mine, set()),
        Choice(ranks, {n: e for n, e in others.items() if e[0][1]}, touched, lambda cls: cls[1]),
        Choice(ranks, {n: e for n, e in others.items() if not e[0][1]}, set(touched), lambda cls: not cls[1]),
    ]


def usable_tiers(
    index: FleetIndex, plan: Touches, buckets: Sequence[Bucket], model: str, sharing: str
) -> list[Choice]:
    """The nodes that putting in share mode `sharing` would give GPUs, classed as `usable_entry` classes
    them, in tiers: nodes shared another way, then nodes of whole GPUs."""
    ranks, extra, touched = _read(
        index,
        buckets,
        plan,
        lambda found: found.usable,
        lambda node: usable_entry(index, buckets, node, plan, model, sharing),
    )
    shared = {node: entry[:2] for node, entry in extra.items() if entry[0][0]}
    plain = {node: entry[:2] for node, entry in extra.items() if not entry[0][0]}
    return [
        Choice(ranks, shared, touched, lambda cls: cls[0] and cls[0] != sharing),
        Choice(ranks, plain, set(touched), lambda cls: not cls[0]),
    ]


def whole_shared(
    index: FleetIndex, plan: Touches, buckets: Sequence[Bucket], sharing: str
) -> Iterator[tuple[Bucket, str]]:
    """(bucket, node) for each node with wholly free MIG GPUs in a bucket, in share mode `sharing`, bucket
    after bucket, in order."""
    streams: list[Iterable[tuple[Order, str]]] = []
    touched, spot, kept = _kept_and_spot(index, plan, buckets)
    for found in kept:
        listed = found.whole_sharing.classes.get(sharing, [])
        streams.append((order, node) for order, node in listed if node not in touched)
    read = []
    for node in spot:
        if node_sharing(index, node, plan) == sharing:
            for bucket in buckets:
                if node in bucket.whole:
                    read.append(((bucket.number, bucket.whole.since[node]), node))
    streams.append(sorted(read))
    by_number = {bucket.number: bucket for bucket in buckets}
    for (number, _seq), node in heapq.merge(*streams):
        yield by_number[number], node


def partial_order(
    index: FleetIndex, buckets: Sequence[Bucket], profile: str, apart: bool, ends: int | None
) -> Iterator[int]:
    """The GPUs that hold work with free `profile` instances, in `_use_partial`'s order (`partial_rank`),
    equals bucket after bucket, in order."""
    streams: list[Iterable[tuple[tuple, Order, int]]] = []
    for bucket in buckets:
        found = ranks_of(index, bucket)
        if found is None:
            streams.append(
                sorted(
                    (partial_rank(holding(index.gpus[gpu]), apart, ends), (bucket.number, seq), gpu)
                    for gpu, (_n, seq) in bucket.partial.gpus.get(profile, {}).items()
                )
            )
        else:
            streams.append(found.partial(profile).stream(apart, ends))
    return (gpu for _rank, _order, gpu in heapq.merge(*streams))


def whole_slot_order(index: FleetIndex, buckets: Sequence[Bucket], profile: str) -> Iterator[int]:
    """The wholly free MIG or shared GPUs with free `profile` instances, bucket after bucket, in order."""
    for bucket in buckets:
        found = ranks_of(index, bucket)
        if found is None:
            yield from bucket.whole_slots.ordered(profile)
        else:
            yield from (gpu for _order, gpu in found.whole_slots(profile).classes.get(None, []))
