"""The nodes and GPUs of a large bucket ranked for the engine's choices, derived from the bucket's tables
(pools/placement/index.py) and kept up to date with them, node by node, as the index changes.

Words used here (placement words are pools/placement/plan.py's):
- class: what a choice compares a node by, e.g. for whole GPUs (free MIG-disabled GPUs, GPUs that switching
  gives, whether it is being re-partitioned); order: where it stands among equals, as the plan's tables order
  it: bucket `number`, then `seq` (pools/placement/choices.py says which table, choice by choice).
- ranks: per choice, a bucket's nodes by class, each class in order, read as if no plan had touched the
  fleet, so that a choice reads the first node of a few classes instead of every node. A node in more than
  one bucket of its model (`split`) is left out: a choice over several buckets merges its GPUs.
- holding: what `_use_partial` ranks a GPU that holds work by; GPUs with free instances of a profile are
  ranked by it, and wholly free ones by order alone.
- counts: the bucket's sums that the reasons' tally reads (pools/placement/availability.py).

A bucket of fewer than RANKED_NODES nodes has no ranks: it is read whole. A large one's are built with its
index; the others' each on first use, then changed with the nodes the index changes (`refresh`).
"""

from __future__ import annotations

import heapq
from bisect import bisect_left, insort
from collections.abc import Hashable, Iterable, Iterator, Sequence
from typing import TYPE_CHECKING

from pools.placement.ends import Fit, fit
from pools.placement.index import Bucket, FleetIndex, building

if TYPE_CHECKING:
    from pools.placement.types import Gpu

Order = tuple[int, ...]
Held = tuple[bool, "int | None", int]  # all its work reclaimable, when its last work ends, tenants
# The tables of wholly free GPUs that a new layout may go on, in the order `_repartition` takes them.
BLANK_TABLES = ("whole", "off", "shared")
# A bucket of this many nodes or more keeps ranks; of EAGER_NODES or more, all built with its index, since
# the first requests would otherwise each wait for one. Smaller, they are built as choices first read them,
# which costs about what reading every node once does: where a fleet is indexed afresh for a few requests
# (each queue run of a simulation), no more than before.
RANKED_NODES = 48
EAGER_NODES = 1000


def indexed(gpus: Sequence[Gpu]) -> FleetIndex:
    """The index of `gpus` (pools/placement/index.py), the ranks of its buckets of EAGER_NODES nodes or more
    built with it."""
    index = FleetIndex.build(gpus)
    with building():
        for bucket in index.buckets.values():
            if len(bucket.members) >= EAGER_NODES:
                bucket.ranks = BucketRanks(index, bucket, eager=True)
    return index


def ranks_of(index: FleetIndex, bucket: Bucket) -> BucketRanks | None:
    """The bucket's ranks, each built on first use; None for a bucket of fewer than RANKED_NODES nodes."""
    if bucket.ranks is None and len(bucket.members) >= RANKED_NODES:
        bucket.ranks = BucketRanks(index, bucket)
    return bucket.ranks


def holding(gpu: Gpu) -> Held:
    """What `_use_partial` ranks a GPU that holds work by: whether all its work may be reclaimed, when its
    last work ends (None: some has no end known, or none is allocated), how many tenants it holds. One pass
    over its slots."""
    tenants, reclaimable_only, far, latest = 0, True, False, None
    for slot in gpu.instances:
        if slot.allocated:
            tenants += 1
            reclaimable_only = reclaimable_only and slot.reclaimable
            if slot.ends is None:
                far = True
            elif latest is None or slot.ends > latest:
                latest = slot.ends
    return reclaimable_only, None if far else latest, tenants


def partial_rank(held: Held, apart: bool, ends: int | None) -> tuple[bool, Fit, int]:
    """The order of a GPU that holds work, lowest first: (with `apart`) whether all its work may be
    reclaimed, how a pool ending at `ends` fits beside its work, fewer tenants."""
    reclaimable_only, latest, tenants = held
    return (apart and reclaimable_only, fit(ends, latest), -tenants)


class Ranked:
    """Members by class, each class's as a sorted list of (order, member)."""

    __slots__ = ("classes", "entries")

    def __init__(self, entries: Iterable[tuple[Hashable, Hashable, Order]] = ()) -> None:
        self.entries: dict[Hashable, tuple[Hashable, Order]] = {}
        self.classes: dict[Hashable, list[tuple[Order, Hashable]]] = {}
        for member, cls, order in entries:
            self.entries[member] = (cls, order)
            self.classes.setdefault(cls, []).append((order, member))
        for members in self.classes.values():
            members.sort()

    def put(self, member: Hashable, cls: Hashable, order: Order) -> None:
        old = self.entries.get(member)
        if old == (cls, order):
            return
        if old is not None:
            self.drop(member)
        self.entries[member] = (cls, order)
        insort(self.classes.setdefault(cls, []), (order, member))

    def drop(self, member: Hashable) -> None:
        old = self.entries.pop(member, None)
        if old is None:
            return
        cls, order = old
        members = self.classes[cls]
        del members[bisect_left(members, (order, member))]
        if not members:
            del self.classes[cls]

    def set(self, member: Hashable, entry: tuple[Hashable, Order] | None) -> None:
        if entry is None:
            self.drop(member)
        else:
            self.put(member, *entry)


class PartialRanks:
    """The GPUs that hold work and have free instances of one profile, classed by `holding`; which classes
    there are, by when their work ends, so that `_use_partial`'s order is read class by class."""

    __slots__ = ("by_end", "ends", "ranked")

    def __init__(self, entries: Iterable[tuple[int, Held, Order]] = ()) -> None:
        self.ranked = Ranked(entries)
        self.by_end: dict[int | None, dict[tuple[bool, int], None]] = {}  # end -> (reclaimable, tenants)
        for reclaimable_only, latest, tenants in self.ranked.classes:
            self.by_end.setdefault(latest, {})[(reclaimable_only, tenants)] = None
        self.ends = sorted(latest for latest in self.by_end if latest is not None)

    def put(self, gpu: int, held: Held, order: Order) -> None:
        old = self.ranked.entries.get(gpu)
        if old is not None and old[0] == held:
            self.ranked.put(gpu, held, order)
            return
        self.drop(gpu)
        reclaimable_only, latest, tenants = held
        if latest not in self.by_end:
            self.by_end[latest] = {}
            if latest is not None:
                insort(self.ends, latest)
        self.by_end[latest][(reclaimable_only, tenants)] = None
        self.ranked.put(gpu, held, order)

    def drop(self, gpu: int) -> None:
        old = self.ranked.entries.get(gpu)
        if old is None:
            return
        held = old[0]
        self.ranked.drop(gpu)
        if held not in self.ranked.classes:
            reclaimable_only, latest, tenants = held
            kinds = self.by_end[latest]
            del kinds[(reclaimable_only, tenants)]
            if not kinds:
                del self.by_end[latest]
                if latest is not None:
                    del self.ends[bisect_left(self.ends, latest)]

    def _ends_in_order(self, ends: int | None) -> Iterator[int | None]:
        """The ends of this profile's GPUs, best first as a pool ending at `ends` fits beside them
        (pools/placement/ends.py)."""
        if ends is None:
            if None in self.by_end:
                yield None
            yield from reversed(self.ends)
            return
        split = bisect_left(self.ends, ends)
        yield from self.ends[split:]
        if None in self.by_end:
            yield None
        yield from reversed(self.ends[:split])

    def stream(self, apart: bool, ends: int | None) -> Iterator[tuple[tuple, Order, int]]:
        """(rank, order, GPU) in `_use_partial`'s order (`partial_rank`)."""
        for reclaimable_part in (False, True) if apart else (None,):
            flags = (reclaimable_part,) if apart else (False, True)
            for latest in self._ends_in_order(ends):
                kinds = self.by_end.get(latest, {})
                tenants = {n for r, n in kinds if reclaimable_part is None or r == reclaimable_part}
                for n in sorted(tenants, reverse=True):
                    rank = partial_rank((bool(reclaimable_part), latest, n), apart, ends)
                    lists = [self.ranked.classes.get((flag, latest, n), []) for flag in flags]
                    for order, gpu in heapq.merge(*lists):
                        yield rank, order, gpu


class Counts:
    """A bucket's sums for the reasons' tally (pools/placement/availability.py): GPUs in its node tables,
    wholly free MIG GPUs and what changing their nodes' share mode would give, both by share mode (that of
    `split` nodes left out: the tally counts each node once)."""

    __slots__ = ("blank", "convertible", "mig_whole", "whole")

    def __init__(self) -> None:
        self.blank = self.whole = 0
        self.mig_whole: dict[str, int] = {}
        self.convertible: dict[str, int] = {}

    def add(self, share: NodeCounts, step: int) -> None:
        """Count a node's share in (step 1) or out (step -1)."""
        sharing, off, whole, shared, gives = share
        self.blank += step * (off + whole + shared)
        self.whole += step * (off + (0 if sharing else whole))
        for table, n in ((self.mig_whole, whole), (self.convertible, gives)):
            if n:
                table[sharing] = table.get(sharing, 0) + step * n


NodeCounts = tuple[str, int, int, int, int]  # share mode, GPUs off, whole, shared; what a change gives
Entry = tuple[Hashable, Order] | None  # a node's class and order in one choice, if it is there


class BucketRanks:
    """The ranks of one bucket: per choice over nodes (`full`, `blank`, `usable`, `whole_sharing`), its
    `counts`, and per profile over GPUs (`partial`, `whole_slots`); each built on first use, or all at once
    (`eager`). A choice's ranks read each node as pools/placement/choices.py reads one that no plan touched,
    in this bucket alone: `full_entry`, `blank_entry`, `usable_entry`."""

    def __init__(self, index: FleetIndex, bucket: Bucket, *, eager: bool = False) -> None:
        self.index, self.bucket, self.model = index, bucket, bucket.key[1]
        self.split = index.split_nodes([bucket])
        self._nodes: dict[str, Ranked] = {}  # choice -> its ranks
        self._counts: Counts | None = None
        self._counted: dict[str, NodeCounts] = {}  # node -> its share of the counts
        self._partial: dict[str, PartialRanks] = {}
        self._whole_slots: dict[str, Ranked] = {}
        self._readers = {
            "full": self._full,
            "usable": self._usable,
            "whole_sharing": self._whole_sharing,
            **{table: (lambda node, table=table: self._blank(table, node)) for table in BLANK_TABLES},
        }
        if eager:
            for choice in self._readers:
                self._ranked(choice)
            self.counts  # noqa: B018 (built with the rest)
            for profile in bucket.partial.gpus:
                self.partial(profile)
            for profile in bucket.whole_slots.gpus:
                self.whole_slots(profile)

    def _ranked(self, choice: str) -> Ranked:
        if choice not in self._nodes:
            read = self._readers[choice]
            self._nodes[choice] = Ranked(
                (node, *entry)
                for node in self.bucket.members
                if node not in self.split and (entry := read(node)) is not None
            )
        return self._nodes[choice]

    @property
    def full(self) -> Ranked:
        return self._ranked("full")

    def blank(self, table: str) -> Ranked:
        return self._ranked(table)

    @property
    def usable(self) -> Ranked:
        return self._ranked("usable")

    @property
    def whole_sharing(self) -> Ranked:
        """Nodes with wholly free MIG GPUs, by their share mode."""
        return self._ranked("whole_sharing")

    @property
    def counts(self) -> Counts:
        if self._counts is None:
            self._counts = Counts()
            for node in self.bucket.members:
                self._count(node)
        return self._counts

    def partial(self, profile: str) -> PartialRanks:
        if profile not in self._partial:
            number, held = self.bucket.number, {}
            self._partial[profile] = PartialRanks(
                (gpu, held.get(gpu) or held.setdefault(gpu, holding(self.index.gpus[gpu])), (number, seq))
                for gpu, (_n, seq) in self.bucket.partial.gpus.get(profile, {}).items()
            )
        return self._partial[profile]

    def whole_slots(self, profile: str) -> Ranked:
        """Wholly free MIG or shared GPUs with free `profile` instances, in order (one class, None)."""
        if profile not in self._whole_slots:
            gpus = self.bucket.whole_slots.gpus.get(profile, {})
            self._whole_slots[profile] = Ranked(
                (gpu, None, (self.bucket.number, seq)) for gpu, (_n, seq) in gpus.items()
            )
        return self._whole_slots[profile]

    def refresh(self, node: str) -> None:
        """Read the node again, in the ranks built so far: the index changed its GPUs, or marked it as
        being re-partitioned."""
        bucket, number = self.bucket, self.bucket.number
        for gpu in bucket.members[node]:
            for name, ranks in (("partial", self._partial), ("whole_slots", self._whole_slots)):
                table = getattr(bucket, name).gpus
                for profile, ranked in ranks.items():
                    entry = table.get(profile, {}).get(gpu)
                    if entry is None:
                        ranked.drop(gpu)
                    elif name == "partial":
                        ranked.put(gpu, holding(self.index.gpus[gpu]), (number, entry[1]))
                    else:
                        ranked.put(gpu, None, (number, entry[1]))
        if node not in self.split:
            for choice, ranked in self._nodes.items():
                ranked.set(node, self._readers[choice](node))
        if self._counts is not None:
            self._counts.add(self._counted.pop(node), -1)
            self._count(node)

    def _gives(self, node: str) -> int:
        """The GPUs of the bucket's model that changing the node's share mode would give: its MIG-off ones
        and its wholly free MIG ones, where it may change now (none where it may not)."""
        mig_off = self.index.free_mig_off(node, self.model)
        return 0 if mig_off is None else len(mig_off) + len(self.index.wholly_free_mig(node, self.model))

    def _blank(self, table: str, node: str) -> Entry:
        nodes = getattr(self.bucket, table)
        n = nodes.count(node)
        return ((n, node in self.index.reconfiguring), (self.bucket.number, nodes.since[node])) if n else None

    def _whole_sharing(self, node: str) -> Entry:
        whole = self.bucket.whole
        return (self.index.sharing(node), (self.bucket.number, whole.since[node])) if node in whole else None

    def _usable(self, node: str) -> Entry:
        for number, table in enumerate((self.bucket.shared, self.bucket.off, self.bucket.whole)):
            if node in table:
                gives = self._gives(node)
                at = (self.bucket.number, number, table.since[node])
                return ((self.index.sharing(node), gives), at) if gives else None
        return None

    def _full(self, node: str) -> Entry:
        bucket, number = self.bucket, self.bucket.number
        sharing = self.index.sharing(node)
        off, whole, shared = bucket.off.count(node), bucket.whole.count(node), bucket.shared.count(node)
        switched = whole if not sharing else (self._gives(node) if shared or whole else 0)
        if off:
            at = (0, 0, number, bucket.off.since[node])
        elif switched and not sharing:
            at = (1, 0, number, bucket.whole.since[node])
        elif switched:
            at = (
                (2, 0, number, bucket.shared.since[node])
                if shared
                else (2, 1, number, bucket.whole.since[node])
            )
        else:
            return None
        return (off, switched, node in self.index.reconfiguring), at

    def _count(self, node: str) -> None:
        """Count the node's share in, as it is now."""
        bucket = self.bucket
        off, whole, shared = bucket.off.count(node), bucket.whole.count(node), bucket.shared.count(node)
        gives = self._gives(node) if node not in self.split and (off or whole or shared) else 0
        share = (self.index.sharing(node), off, whole, shared, gives)
        self._counts.add(share, 1)
        self._counted[node] = share
