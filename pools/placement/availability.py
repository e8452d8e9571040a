"""How much of each spec one request could get now, and the most it could ever get.

Per cluster, GPU group and spec (a GPU model and a profile, or `full`), counted the
way the engine places a request of that one spec, so that what the portal offers
is what the queue admits (a property test holds the two together):

- a full GPU: each GPU with nothing allocated on it, MIG-disabled or wholly free
  (the engine switches MIG off where it must);
- a MIG profile: the free instances of it on GPUs in use, plus, on each GPU with
  nothing allocated, as many as one GPU holds (it may be re-partitioned).

Only schedulable GPUs count now. Ever counts every GPU present as if it held
nothing: what a request could get once the fleet is free and healthy again.

A request with a group is placed on that group's GPUs; one without (group None)
on every GPU of the cluster. A cluster without groups has only group None.

The waiting reasons (pools/placement/reasons.py) count what one cluster could give now with the
same `Tally` and `obtainable`, read from the engine's index instead of a list of GPUs.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field, replace

from pools.gpu_models import model_info
from pools.kinds import kind_of, profiles_of
from pools.placement.index import Bucket, has_allocation

Key = tuple[str, "str | None", str, str]  # cluster, group (None: any), model, profile


@dataclass(frozen=True)
class Availability:
    now: int
    ever: int


@dataclass
class Tally:
    """One (cluster, group, model): schedulable GPUs with nothing allocated (blank), every GPU present,
    and the free instances per profile on schedulable GPUs in use."""

    blank: int = 0
    present: int = 0
    free: dict[str, int] = field(default_factory=lambda: defaultdict(int))

    def add(self, other: Tally) -> None:
        self.blank += other.blank
        self.present += other.present
        for profile, count in other.free.items():
            self.free[profile] += count


def obtainable(tally: Tally, model: str, profile: str) -> int:
    """How many of one spec a request could get now from what the tally counts."""
    return tally.free.get(profile, 0) + tally.blank * kind_of(profile).max_per_gpu(model_info(model), profile)


def tally_of_buckets(buckets: Iterable[Bucket]) -> Tally:
    """The tally of the engine's index buckets of one model (a cluster's, in a group or all of it)."""
    tally = Tally()
    for bucket in buckets:
        tally.present += bucket.total
        tally.blank += sum(len(gpus) for gpus in bucket.off.values())
        tally.blank += sum(len(gpus) for gpus in bucket.whole.values())
        for profile, by_gpu in bucket.partial.items():
            tally.free[profile] += sum(by_gpu.values())
    return tally


def availability(gpus) -> dict[Key, Availability]:
    """Every (cluster, group, model, profile) of the GPUs given, with group None for the whole cluster."""
    tallies: dict[tuple[str, str | None, str], Tally] = defaultdict(Tally)
    for gpu in gpus:
        tally = tallies[(gpu.cluster, gpu.group, gpu.model)]
        tally.present += 1
        if not gpu.schedulable:
            continue
        if not has_allocation(gpu):
            tally.blank += 1
        elif gpu.mig:
            for slot in gpu.instances:
                if not slot.allocated:
                    tally.free[slot.profile] += 1
    whole: dict[tuple[str, str | None, str], Tally] = defaultdict(Tally)
    for (cluster, _group, model), tally in tallies.items():
        whole[(cluster, None, model)].add(tally)
    grouped = [(key, tally) for key, tally in tallies.items() if key[1] is not None]
    found: dict[Key, Availability] = {}
    for (cluster, group, model), tally in [*grouped, *whole.items()]:
        info = model_info(model)
        for profile in profiles_of(info):
            most = kind_of(profile).max_per_gpu(info, profile)
            found[(cluster, group, model, profile)] = Availability(
                tally.free.get(profile, 0) + tally.blank * most, tally.present * most
            )
    return found


def emptied(fleet):
    """The fleet with nothing allocated and every GPU schedulable: what could ever be had of it."""
    return type(fleet)(
        tuple(
            replace(
                gpu,
                allocated=False,
                schedulable=True,
                reconfiguring=False,
                instances=tuple(replace(slot, allocated=False) for slot in gpu.instances),
            )
            for gpu in fleet.gpus
        )
    )
