"""Where a fleet's free GPU capacity is: its GPUs indexed by cluster, model, group and state.

Built once per fleet and carried forward by `apply` copy-on-write, so that placing one request costs what
that request touches rather than the size of the fleet, and an older fleet keeps an index that is right.

States of a schedulable GPU (a drained or unhealthy one is only counted, for the reasons):
- off: MIG disabled, not shared and free: what a `full` item wants.
- whole: MIG enabled and nothing on it allocated: its layout may be re-cut.
- shared: MIG disabled, shared (its node's share mode) and none of its shares allocated.
- partial: MIG enabled or shared, and something on it allocated: its free instances or shares can be used,
  its layout or share mode is fixed.
- busy: MIG disabled, not shared and in use.

Reads GPUs by attribute (id, node, model, mig, sharing, offers, allocated, instances, group, cluster,
schedulable, reconfiguring), so it needs nothing from the engine at run time.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from pools.placement.types import Gpu

BucketKey = tuple[str, str, "str | None"]  # cluster, model, group


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


class Bucket:
    """The GPUs of one (cluster, model, group), which its group's `offers` apply to. Tables map to dicts used
    as ordered sets of GPU positions."""

    __slots__ = (
        "_owned",
        "drained",
        "free",
        "off",
        "offers",
        "partial",
        "shared",
        "total",
        "whole",
        "whole_slots",
    )

    def __init__(self, offers: tuple[str, ...] = ()) -> None:
        self.offers = offers
        self.partial: dict[str, dict[int, int]] = {}  # profile -> {GPU: its free instances or shares of it}
        self.whole_slots: dict[str, dict[int, int]] = {}  # the same, on wholly free MIG or shared GPUs
        self.whole: dict[str, dict[int, None]] = {}  # node -> wholly free MIG GPUs
        self.shared: dict[str, dict[int, None]] = {}  # node -> wholly free shared GPUs
        self.off: dict[str, dict[int, None]] = {}  # node -> free MIG-disabled, unshared GPUs
        self.free: dict[str, int] = {}  # profile -> free instances or shares on schedulable GPUs
        self.total = 0
        self.drained = 0
        self._owned: set[tuple[str, str]] | None = None  # None: every inner table is this bucket's own

    def clone(self) -> Bucket:
        """A copy that shares the inner tables until it writes to one."""
        copy = Bucket(self.offers)
        copy.partial, copy.whole_slots = dict(self.partial), dict(self.whole_slots)
        copy.whole, copy.off, copy.free = dict(self.whole), dict(self.off), dict(self.free)
        copy.shared = dict(self.shared)
        copy.total, copy.drained = self.total, self.drained
        copy._owned = set()
        return copy

    def _inner(self, name: str, key: str) -> dict:
        table = getattr(self, name)
        inner = table.get(key)
        if inner is None:
            inner = table[key] = {}
            if self._owned is not None:
                self._owned.add((name, key))
        elif self._owned is not None and (name, key) not in self._owned:
            inner = table[key] = dict(inner)
            self._owned.add((name, key))
        return inner

    def _drop(self, name: str, key: str, position: int) -> None:
        inner = self._inner(name, key)
        del inner[position]
        if not inner:
            del getattr(self, name)[key]

    def add_fresh(self, position: int, gpu: Gpu) -> None:
        """`change(position, gpu, 1)` for a bucket being built, which owns all its tables: the same
        bookkeeping inlined, because building the index of a large fleet is most of a first placement."""
        self.total += 1
        if not gpu.schedulable:
            self.drained += 1
            return
        if not gpu.mig and not gpu.sharing:
            if not gpu.allocated:
                self.off.setdefault(gpu.node, {})[position] = None
            return
        free: dict[str, int] = {}
        busy = gpu.allocated
        for slot in gpu.instances:
            if slot.allocated:
                busy = True
            else:
                free[slot.profile] = free.get(slot.profile, 0) + 1
        if busy:
            table = self.partial
        else:
            table = self.whole_slots
            (self.whole if gpu.mig else self.shared).setdefault(gpu.node, {})[position] = None
        for profile, count in free.items():
            self.free[profile] = self.free.get(profile, 0) + count
            table.setdefault(profile, {})[position] = count

    def change(self, position: int, gpu: Gpu, step: int) -> None:
        """Count a GPU in (step 1) or out (step -1), in the state it is in."""
        self.total += step
        state = _state(gpu)
        if state == "drained":
            self.drained += step
            return
        if state in ("off", "whole", "shared"):
            if step > 0:
                self._inner(state, gpu.node)[position] = None
            else:
                self._drop(state, gpu.node, position)
        if state in ("partial", "whole", "shared"):
            free: dict[str, int] = {}
            for slot in gpu.instances:
                if not slot.allocated:
                    free[slot.profile] = free.get(slot.profile, 0) + 1
            table = "partial" if state == "partial" else "whole_slots"
            for profile, count in free.items():
                self.free[profile] = self.free.get(profile, 0) + step * count
                if step > 0:
                    self._inner(table, profile)[position] = count
                else:
                    self._drop(table, profile, position)


class FleetIndex:
    __slots__ = ("buckets", "gpus", "layout", "nodes", "position", "reconfiguring")

    def __init__(
        self,
        gpus: Sequence[Gpu],
        position: dict[str, int],
        nodes: dict[str, tuple[int, ...]],
        layout: dict[str, dict[str, dict[str | None, BucketKey]]],
        buckets: dict[BucketKey, Bucket],
        reconfiguring: frozenset[str],
    ) -> None:
        self.gpus = gpus
        self.position = position  # GPU id -> position in the fleet; apply never moves a GPU
        self.nodes = nodes  # node -> positions of its GPUs
        self.layout = layout  # cluster -> model -> group -> bucket key
        self.buckets = buckets
        self.reconfiguring = reconfiguring  # nodes being re-partitioned now

    @classmethod
    def build(cls, gpus: Sequence[Gpu]) -> FleetIndex:
        position: dict[str, int] = {}
        nodes: dict[str, list[int]] = {}
        layout: dict[str, dict[str, dict[str | None, BucketKey]]] = {}
        buckets: dict[BucketKey, Bucket] = {}
        reconfiguring: set[str] = set()
        for index, gpu in enumerate(gpus):
            if gpu.id in position:
                raise ValueError(f"GPU {gpu.id!r} appears twice in the fleet.")
            position[gpu.id] = index
            nodes.setdefault(gpu.node, []).append(index)
            if gpu.reconfiguring:
                reconfiguring.add(gpu.node)
            key = (gpu.cluster, gpu.model, gpu.group)
            bucket = buckets.get(key)
            if bucket is None:
                bucket = buckets[key] = Bucket(gpu.offers)
                layout.setdefault(gpu.cluster, {}).setdefault(gpu.model, {})[gpu.group] = key
            bucket.add_fresh(index, gpu)
        frozen_nodes = {node: tuple(members) for node, members in nodes.items()}
        return cls(gpus, position, frozen_nodes, layout, buckets, frozenset(reconfiguring))

    def updated(
        self, gpus: Sequence[Gpu], changed: Iterable[int], reconfiguring: Iterable[str]
    ) -> FleetIndex:
        """The index of `gpus`, which differ from this index's GPUs only at the `changed` positions."""
        buckets = dict(self.buckets)
        cloned: set[BucketKey] = set()
        for index in changed:
            old, new = self.gpus[index], gpus[index]
            key = (old.cluster, old.model, old.group)
            if key not in cloned:
                buckets[key] = buckets[key].clone()
                cloned.add(key)
            buckets[key].change(index, old, -1)
            buckets[key].change(index, new, 1)
        nodes = self.reconfiguring.union(reconfiguring)
        return FleetIndex(gpus, self.position, self.nodes, self.layout, buckets, nodes)

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
