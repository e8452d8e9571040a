"""The placement engine's plain data: GPUs and their slots, the fleet, requests and their items, and the
answer for a request (its reconfigures and assignments). Words as in pools/placement/engine.py; no behaviour
here, so every module of the engine can use these without importing the engine. (A fleet the engine makes
from another only reads its GPUs when they are first asked for: `Fleet.made`.)

Ends (`ends`) are plain whole numbers in one clock that the caller chooses (the queue epoch seconds, the
simulator its trace's seconds); None is no end known, which placement counts as far away."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from pools.kinds import DEFAULT_OFFERS


@dataclass(frozen=True)
class Slot:
    profile: str
    start: int
    allocated: bool = False
    reclaimable: bool = False  # allocated to work that may be reclaimed (borrowed beyond a guarantee)
    ends: int | None = None  # allocated: when the work on it ends; None: no end known


@dataclass(frozen=True)
class Gpu:
    id: str
    node: str
    model: str  # catalogue name, e.g. "H100-80GB"
    mig: bool  # MIG mode on
    allocated: bool = False  # for a MIG-disabled, unshared GPU: the whole GPU is in use
    ends: int | None = None  # for a MIG-disabled GPU in use: when the work on it ends; None: no end known
    instances: tuple[Slot, ...] = ()  # its MIG instances, or its shares
    group: str | None = None
    cluster: str = ""  # items of one request stay in one cluster
    schedulable: bool = True  # False when drained or unhealthy: gets nothing new
    reconfiguring: bool = False  # its node is being re-partitioned right now (prefer that node)
    # Its node's share mode (pools/kinds/shares.py), which every MIG-off GPU of the node is in: "" for none.
    sharing: str = ""
    offers: tuple[str, ...] = DEFAULT_OFFERS  # what its GPU group offers (pools/kinds: offer_of)


@dataclass(frozen=True)
class Fleet:
    gpus: tuple[Gpu, ...]

    @classmethod
    def made(cls, read: Callable[[], tuple[Gpu, ...]]) -> Fleet:
        """A fleet whose GPUs `read` gives when they are first asked for: pools/placement/engine.py makes
        the fleet after a change so, from the index it shares with the fleet before, copying nothing."""
        fleet = cls.__new__(cls)
        object.__setattr__(fleet, "_read_gpus", read)
        return fleet

    def __getattr__(self, name: str) -> tuple[Gpu, ...]:
        read = self.__dict__.get("_read_gpus")
        if name != "gpus" or read is None:
            raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")
        gpus = read()
        object.__setattr__(self, "gpus", gpus)
        del self.__dict__["_read_gpus"]
        return gpus

    def __reduce__(self) -> tuple:
        return (type(self), (self.gpus,))  # its GPUs, not the index it may share


@dataclass(frozen=True)
class Item:
    model: str
    profile: str  # a MIG profile of that model, or "full"
    count: int


@dataclass(frozen=True)
class Request:
    id: str
    items: tuple[Item, ...]
    group: str | None = None
    reclaimable: bool = False  # its work may be reclaimed: kept apart from work that may not
    ends: int | None = None  # when its pool ends; None: no end known


@dataclass(frozen=True)
class Reconfigure:
    gpu: str
    mig: bool
    instances: tuple[tuple[str, int], ...]  # (profile, start), sorted by start: MIG instances or shares
    sharing: str = ""  # MIG off: the share mode the GPU's node is put in ("" for none); MIG on: ""


@dataclass(frozen=True)
class Assignment:
    gpu: str
    profile: str
    start: int | None  # None for "full"


@dataclass(frozen=True)
class Placement:
    request: str
    placed: bool
    reconfigure: tuple[Reconfigure, ...] = ()
    assignments: tuple[Assignment, ...] = ()
    reason: str = ""
    reclaimable: bool = False  # the request's: its instances are marked so when applied
    ends: int | None = None  # the request's: its instances and whole GPUs carry this end when applied
