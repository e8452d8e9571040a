"""Where a fleet's free GPU capacity is: its GPUs indexed by cluster, model, group and state.

Built once per fleet lineage and changed in place as `apply` (and release, fence and the like) makes the next
fleet, each change journalled (pools/placement/journal.py): placing one request costs what that request
touches rather than the size of the fleet, and an older fleet read again gets its own index back (checked
out). Fleets of one lineage share the index, so they are read by one thread at a time, as every caller reads
the fleets it made itself.

States of a schedulable GPU (a drained or unhealthy one is only counted, for the reasons):
- off: MIG disabled, not shared and free: what a `full` item wants.
- whole: MIG enabled and nothing on it allocated: its layout may be re-cut.
- shared: MIG disabled, shared (its node's share mode) and none of its shares allocated.
- partial: MIG enabled or shared, and something on it allocated: its free instances or shares can be used,
  its layout or share mode is fixed.
- busy: MIG disabled, not shared and in use.

Order: where the engine takes one of equally good GPUs or nodes, it takes the one that came into the table
it reads first (`seq`): at build in fleet order; a GPU that changes leaves its tables and comes back in after
all others; a node comes into a table with its first GPU there and leaves it with its last. The tables keep
that order as numbers, which a checkout gives back with the rest.

What the engine reads to choose among many nodes or GPUs at once is derived from these tables, per bucket,
by pools/placement/ranks.py, and kept up to date with them.

Reads GPUs by attribute (id, node, model, mig, sharing, offers, allocated, instances, group, cluster,
schedulable, reconfiguring), so it needs nothing from the engine at run time.
"""

from __future__ import annotations

import gc
from collections.abc import Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from itertools import count
from typing import TYPE_CHECKING, Protocol

from pools.placement.journal import Journal, Version

if TYPE_CHECKING:
    from pools.placement.types import Gpu

BucketKey = tuple[str, str, "str | None"]  # cluster, model, group


class Ranks(Protocol):
    """What pools/placement/ranks.py derives from a bucket's tables, read again as its nodes change."""

    def refresh(self, node: str) -> None: ...


@contextmanager
def building() -> Iterator[None]:
    """Building an index makes many containers and frees none: a collection meanwhile would walk the whole
    fleet again and again for nothing, which costs more than the building itself."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


def has_allocation(gpu: Gpu) -> bool:
    return gpu.allocated or any(slot.allocated for slot in gpu.instances)


def _state(gpu: Gpu) -> str:
    if not gpu.schedulable:
        return "drained"
    if gpu.mig:
        return "partial" if has_allocation(gpu) else "whole"
    if gpu.sharing:
        return "partial" if has_allocation(gpu) else "shared"
    return "busy" if gpu.allocated else "off"


def _free_slots(gpu: Gpu) -> dict[str, int]:
    free: dict[str, int] = {}
    for slot in gpu.instances:
        if not slot.allocated:
            free[slot.profile] = free.get(slot.profile, 0) + 1
    return free


class NodeTable:
    """The GPUs of one state, per node: node -> {GPU position: seq}; `since` holds each node that has any,
    with the seq it came in with. A node's dict is made with its first GPU here and kept when it empties."""

    __slots__ = ("gpus", "since")

    def __init__(self) -> None:
        self.gpus: dict[str, dict[int, int]] = {}
        self.since: dict[str, int] = {}

    def __contains__(self, node: str) -> bool:
        return node in self.since

    def __len__(self) -> int:
        return len(self.since)

    def nodes(self) -> Iterable[str]:
        """The nodes in, in no particular order."""
        return self.since.keys()

    def ordered_nodes(self) -> list[str]:
        return sorted(self.since, key=self.since.__getitem__)

    def ordered(self, node: str) -> list[int]:
        """The node's GPUs in this table, in order."""
        gpus = self.gpus.get(node)
        return sorted(gpus, key=gpus.__getitem__) if gpus else []

    def count(self, node: str) -> int:
        return len(self.gpus.get(node, ()))

    def items(self) -> Iterator[tuple[str, list[int]]]:
        """(node, its GPUs) in order."""
        return ((node, self.ordered(node)) for node in self.ordered_nodes())


class SlotTable:
    """Free instances or shares, per profile: profile -> {GPU position: (how many, seq)}, and how many in all
    (`totals`). A profile's dict is kept when it empties."""

    __slots__ = ("gpus", "totals")

    def __init__(self) -> None:
        self.gpus: dict[str, dict[int, tuple[int, int]]] = {}
        self.totals: dict[str, int] = {}

    def ordered(self, profile: str) -> list[int]:
        """The GPUs with free `profile` instances, in order."""
        gpus = self.gpus.get(profile)
        return sorted(gpus, key=lambda position: gpus[position][1]) if gpus else []

    def free(self, profile: str) -> int:
        return self.totals.get(profile, 0)

    def profiles(self) -> Iterable[str]:
        return self.gpus.keys()


def _add_fresh(table: NodeTable, node: str, position: int, seq: int) -> None:
    gpus = table.gpus.get(node)
    if gpus is None:
        gpus = table.gpus[node] = {}
        table.since[node] = seq
    gpus[position] = seq


class Bucket:
    """The GPUs of one (cluster, model, group), which its group's `offers` apply to. `number` orders the
    buckets of one cluster and model as the fleet first names them; `members` are its GPUs per node."""

    __slots__ = (
        "counts",
        "free",
        "key",
        "members",
        "number",
        "off",
        "offers",
        "partial",
        "ranks",
        "shared",
        "whole",
        "whole_slots",
    )

    def __init__(self, key: BucketKey, number: int, offers: tuple[str, ...] = ()) -> None:
        self.key, self.number, self.offers = key, number, offers
        self.partial = SlotTable()  # on GPUs that hold work
        self.whole_slots = SlotTable()  # on wholly free MIG or shared GPUs
        self.whole = NodeTable()  # wholly free MIG GPUs
        self.shared = NodeTable()  # wholly free shared GPUs
        self.off = NodeTable()  # free MIG-disabled, unshared GPUs
        self.free: dict[str, int] = {}  # profile -> free instances or shares on schedulable GPUs
        self.counts = {"total": 0, "drained": 0}
        self.members: dict[str, tuple[int, ...]] = {}  # node -> its GPUs in this bucket
        self.ranks: Ranks | None = None  # a large bucket's (pools/placement/ranks.py: `ranks_of`)

    @property
    def total(self) -> int:
        return self.counts["total"]

    @property
    def drained(self) -> int:
        return self.counts["drained"]

    def add_fresh(self, position: int, gpu: Gpu, seq: int) -> None:
        """`change(position, gpu, 1)` for a bucket being built, less its total (counted from `members`):
        the same bookkeeping written straight, because building the index of a large fleet is most of a
        first placement, and where a simulation indexes its fleet afresh for each queue run, of every run."""
        if not gpu.schedulable:
            self.counts["drained"] += 1
            return
        if not gpu.mig and not gpu.sharing:
            if not gpu.allocated:
                gpus = self.off.gpus.get(gpu.node)
                if gpus is None:
                    gpus = self.off.gpus[gpu.node] = {}
                    self.off.since[gpu.node] = seq
                gpus[position] = seq
            return
        free: dict[str, int] = {}
        busy = gpu.allocated
        for slot in gpu.instances:
            if slot.allocated:
                busy = True
            else:
                free[slot.profile] = free.get(slot.profile, 0) + 1
        if busy:
            slots = self.partial
        else:
            slots = self.whole_slots
            _add_fresh(self.whole if gpu.mig else self.shared, gpu.node, position, seq)
        for profile, n in free.items():
            self.free[profile] = self.free.get(profile, 0) + n
            slots.totals[profile] = slots.totals.get(profile, 0) + n
            gpus = slots.gpus.get(profile)
            if gpus is None:
                gpus = slots.gpus[profile] = {}
            gpus[position] = (n, seq)

    def change(self, journal: Journal, position: int, gpu: Gpu, step: int, seq: int = 0) -> None:
        """Count a GPU in (step 1, coming in as `seq`) or out (step -1), in the state it is in."""
        journal.set(self.counts, "total", self.counts["total"] + step)
        state = _state(gpu)
        if state == "drained":
            journal.set(self.counts, "drained", self.counts["drained"] + step)
            return
        if state in ("off", "whole", "shared"):
            table = getattr(self, state)
            gpus = table.gpus.get(gpu.node)
            if gpus is None:
                gpus = {}
                journal.set(table.gpus, gpu.node, gpus)  # kept from now on, empty or not
            if step > 0:
                if not gpus:
                    journal.set(table.since, gpu.node, seq)
                journal.set(gpus, position, seq)
            else:
                journal.delete(gpus, position)
                if not gpus:
                    journal.delete(table.since, gpu.node)
        if state in ("partial", "whole", "shared"):
            slots = self.partial if state == "partial" else self.whole_slots
            for profile, n in _free_slots(gpu).items():
                journal.set(self.free, profile, self.free.get(profile, 0) + step * n)
                journal.set(slots.totals, profile, slots.totals.get(profile, 0) + step * n)
                if profile not in slots.gpus:
                    journal.set(slots.gpus, profile, {})
                if step > 0:
                    journal.set(slots.gpus[profile], position, (n, seq))
                else:
                    journal.delete(slots.gpus[profile], position)


class FleetIndex:
    """The index of the fleet whose GPUs are `gpus` now: the version its journal has current."""

    __slots__ = (
        "_seq",
        "buckets",
        "gpus",
        "journal",
        "layout",
        "node_buckets",
        "nodes",
        "position",
        "reconfiguring",
        "split",
    )

    def __init__(
        self,
        gpus: Sequence[Gpu],
        position: dict[str, int],
        nodes: dict[str, tuple[int, ...]],
        layout: dict[str, dict[str, dict[str | None, BucketKey]]],
        buckets: dict[BucketKey, Bucket],
        reconfiguring: dict[str, None],
        node_buckets: dict[str, tuple[BucketKey, ...]],
    ) -> None:
        self.gpus = list(gpus)  # the GPUs of the version current now
        self.position = position  # GPU id -> position in the fleet; apply never moves a GPU
        self.nodes = nodes  # node -> positions of its GPUs
        self.layout = layout  # cluster -> model -> group -> bucket key
        self.buckets = buckets
        self.reconfiguring = reconfiguring  # nodes being re-partitioned now (a dict used as a set)
        self.node_buckets = node_buckets  # node -> the keys of the buckets its GPUs are in
        self.journal = Journal()
        self._seq = count(len(gpus))
        splits: dict[tuple[str, str], set[str]] = {}  # (cluster, model) -> nodes in more than one bucket
        for node, keys in node_buckets.items():
            if len(keys) > 1:
                models = [(cluster, model) for cluster, model, _group in keys]
                for pair in models:
                    if models.count(pair) > 1:
                        splits.setdefault(pair, set()).add(node)
        self.split = {pair: frozenset(nodes) for pair, nodes in splits.items()}

    @classmethod
    def build(cls, gpus: Sequence[Gpu]) -> FleetIndex:
        """The index of `gpus`, without ranks (pools/placement/ranks.py: `indexed` gives it them)."""
        with building():
            return cls._build(gpus)

    @classmethod
    def _build(cls, gpus: Sequence[Gpu]) -> FleetIndex:
        position: dict[str, int] = {}
        nodes: dict[str, list[int]] = {}
        layout: dict[str, dict[str, dict[str | None, BucketKey]]] = {}
        buckets: dict[BucketKey, Bucket] = {}
        reconfiguring: dict[str, None] = {}
        first: dict[str, Bucket] = {}  # node -> the bucket of its first GPU
        mixed: set[str] = set()  # nodes with GPUs in more than one bucket
        node, bucket = None, None
        for index, gpu in enumerate(gpus):
            if gpu.id in position:
                raise ValueError(f"GPU {gpu.id!r} appears twice in the fleet.")
            position[gpu.id] = index
            nodes.setdefault(gpu.node, []).append(index)
            if gpu.reconfiguring:
                reconfiguring[gpu.node] = None
            key = (gpu.cluster, gpu.model, gpu.group)
            if bucket is None or bucket.key != key:
                bucket = buckets.get(key)
                if bucket is None:
                    groups = layout.setdefault(gpu.cluster, {}).setdefault(gpu.model, {})
                    bucket = buckets[key] = Bucket(key, len(groups), gpu.offers)
                    groups[gpu.group] = key
            if gpu.node != node:  # a node's GPUs mostly come one after the other
                node = gpu.node
                if first.setdefault(node, bucket) is not bucket:
                    mixed.add(node)
            elif first[node] is not bucket:
                mixed.add(node)
            bucket.add_fresh(index, gpu, index)
        frozen_nodes = {node: tuple(members) for node, members in nodes.items()}
        node_buckets: dict[str, tuple[BucketKey, ...]] = {}
        for node, positions in frozen_nodes.items():
            if node not in mixed:
                home = first[node]
                home.members[node] = positions
                home.counts["total"] += len(positions)
                node_buckets[node] = (home.key,)
                continue
            found: dict[BucketKey, list[int]] = {}
            for member in positions:
                gpu = gpus[member]
                found.setdefault((gpu.cluster, gpu.model, gpu.group), []).append(member)
            for key, members in found.items():
                buckets[key].members[node] = tuple(members)
                buckets[key].counts["total"] += len(members)
            node_buckets[node] = tuple(found)
        return cls(gpus, position, frozen_nodes, layout, buckets, reconfiguring, node_buckets)

    def updated(
        self, replaced: Mapping[int, Gpu], changed: Iterable[int], reconfiguring: Iterable[str]
    ) -> Version:
        """Change the index to that of its GPUs with those at the positions of `replaced` replaced, the
        `changed` ones among them counted again in their tables (the rest are only marked), and the nodes
        `reconfiguring` marked; returns the version that is theirs. The version it was at stays one a
        checkout brings back."""
        journal = self.journal
        journal.begin()
        touched: set[str] = set()
        try:
            for index in changed:
                old, new = self.gpus[index], replaced[index]
                bucket = self.buckets[(old.cluster, old.model, old.group)]
                bucket.change(journal, index, old, -1)
                bucket.change(journal, index, new, 1, next(self._seq))
                touched.add(old.node)
            for position, gpu in replaced.items():
                journal.set(self.gpus, position, gpu)
            for node in reconfiguring:
                if node not in self.reconfiguring:
                    journal.set(self.reconfiguring, node, None)
                    touched.add(node)
        except BaseException:
            journal.abort()
            raise
        version = journal.commit(touched)
        self._refresh(touched)
        return version

    def checkout(self, version: Version) -> None:
        """Bring the index to `version` (a fleet's of this lineage)."""
        if version is not self.journal.current:
            self._refresh(self.journal.checkout(version))

    def _refresh(self, nodes: Iterable[str]) -> None:
        """Bring the ranks of the buckets these nodes are in up to date with their tables."""
        for node in nodes:
            for key in self.node_buckets[node]:
                ranks = self.buckets[key].ranks
                if ranks is not None:
                    ranks.refresh(node)

    def split_nodes(self, buckets: Sequence[Bucket]) -> frozenset[str]:
        """Nodes with GPUs in more than one bucket of the (cluster, model) of `buckets`."""
        if not buckets:
            return frozenset()
        cluster, model, _group = buckets[0].key
        return self.split.get((cluster, model), frozenset())

    def sharing(self, node: str) -> str:
        """The node's share mode, which each of its GPUs carries ("" for none)."""
        return self.gpus[self.nodes[node][0]].sharing

    def free_mig_off(self, node: str, model: str) -> list[int] | None:
        """The schedulable MIG-off GPUs of `model` on a node whose share mode may change now (none of its
        MIG-off GPUs holds work); None when it may not. The device plugin shares every MIG-off GPU of a node
        alike, so the node changes as one. (A node being re-partitioned may change too: provisioning applies
        the changes of a node one after the other.)"""
        gpus = [position for position in self.nodes[node] if not self.gpus[position].mig]
        if any(has_allocation(self.gpus[position]) for position in gpus):
            return None
        return [p for p in gpus if self.gpus[p].schedulable and self.gpus[p].model == model]

    def wholly_free_mig(self, node: str, model: str) -> list[int]:
        """The schedulable MIG GPUs of `model` on a node with nothing allocated: each may be switched off."""
        return [
            position
            for position in self.nodes[node]
            if (gpu := self.gpus[position]).mig
            and gpu.model == model
            and gpu.schedulable
            and not has_allocation(gpu)
        ]

    def clusters(self) -> list[str]:
        return list(self.layout)

    def buckets_for(self, cluster: str, model: str, group: str | None) -> list[Bucket]:
        """The buckets a request of `group` may use: that group's, or every group's when it names none."""
        by_group = self.layout.get(cluster, {}).get(model, {})
        if group is None:
            return [self.buckets[key] for key in by_group.values()]
        key = by_group.get(group)
        return [] if key is None else [self.buckets[key]]
