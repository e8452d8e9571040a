"""How much of each spec one request could get now, and the most it could ever get.

Per cluster, GPU group and spec (a GPU model and a profile, or `full`), among the specs the group offers
(pools/kinds: `offer_of`), counted the way the engine places a request of that one spec
(pools/placement/plan.py), so that what the portal offers is what the queue admits (a property test holds the
two together):

- a full GPU: each GPU with nothing allocated on a node not shared (the engine switches MIG off where it
  must), and each GPU a shared node would give if its sharing were turned off: its MIG-off GPUs and its
  wholly free MIG GPUs, where none of its MIG-off GPUs holds work;
- a MIG profile: the free instances of it on GPUs in use, plus, on each GPU with nothing allocated, as many
  as one GPU holds (it may be re-partitioned);
- a share: its free shares, plus N for each wholly free MIG GPU of a node in that share mode (switched off),
  and N for each GPU a node in another mode would give if it were put in this one.

Only schedulable GPUs count now. Ever counts every GPU present as if it held
nothing: what a request could get once the fleet is free and healthy again.

A request with a group is placed on that group's GPUs; one without (group None)
on every GPU of the cluster whose group offers the spec. A cluster without groups has only group None.

The waiting reasons (pools/placement/reasons.py) count what one cluster could give now with the
same `Tally` and `obtainable`, read from the engine's index instead of a list of GPUs.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field, replace

from pools.gpu_models import model_info
from pools.kinds import MIG, kind_of, profiles_of
from pools.placement.index import Bucket, FleetIndex, has_allocation
from pools.placement.ranks import Counts, ranks_of

Key = tuple[str, "str | None", str, str]  # cluster, group (None: any), model, profile


@dataclass(frozen=True)
class Availability:
    now: int
    ever: int


@dataclass
class Tally:
    """One (cluster, group, model), as the engine may use it now. Node counts are keyed by the node's share
    mode ("" for none)."""

    present: int = 0  # every GPU
    blank: int = 0  # schedulable GPUs with nothing allocated: each may be re-cut for MIG
    whole: int = 0  # those of them a full GPU may be without changing a node's sharing
    free: dict[str, int] = field(default_factory=lambda: defaultdict(int))  # free instances and shares
    mig_whole: dict[str, int] = field(default_factory=lambda: defaultdict(int))  # wholly free MIG GPUs
    convertible: dict[str, int] = field(default_factory=lambda: defaultdict(int))  # a node change would give
    offers: frozenset[str] = frozenset()


def obtainable(tally: Tally, model: str, profile: str) -> int:
    """How many of one spec a request could get now from what the tally counts (0 where not offered)."""
    kind = kind_of(profile)
    if kind.offer_of(profile) not in tally.offers:
        return 0
    if kind.takes_whole_gpu:
        return tally.whole + sum(count for sharing, count in tally.convertible.items() if sharing)
    most = kind.max_per_gpu(model_info(model), profile)
    if kind is MIG:
        return tally.free.get(profile, 0) + tally.blank * most
    changed = sum(count for sharing, count in tally.convertible.items() if sharing != profile)
    return tally.free.get(profile, 0) + most * (tally.mig_whole.get(profile, 0) + changed)


def obtainable_in(index: FleetIndex, buckets: Iterable[Bucket], model: str, profile: str) -> int:
    """`obtainable` read from the engine's index: over the buckets whose group offers the profile."""
    offer = kind_of(profile).offer_of(profile)
    return obtainable(
        tally_of_buckets(index, [b for b in buckets if offer in b.offers], model), model, profile
    )


def tally_of_buckets(index: FleetIndex, buckets: Iterable[Bucket], model: str) -> Tally:
    """The tally of the engine's index buckets of one model (a cluster's, in a group or all of it): from
    the counts a large bucket keeps (pools/placement/ranks.py), else node by node. What a node's change of
    share mode would give counts once per node."""
    buckets = list(buckets)
    tally = Tally()
    nodes: dict[str, None] = {}  # nodes whose change of share mode is counted below
    split = index.split_nodes(buckets)
    for bucket in buckets:
        tally.present += bucket.total
        tally.offers |= frozenset(bucket.offers)
        for profile in bucket.partial.profiles():
            tally.free[profile] += bucket.partial.free(profile)
        for profile in bucket.whole_slots.profiles():
            if kind_of(profile) is not MIG:
                tally.free[profile] += bucket.whole_slots.free(profile)
        ranks = ranks_of(index, bucket)
        if ranks is not None:
            _add_counts(tally, ranks.counts)
            tables = (bucket.off, bucket.shared, bucket.whole)
            nodes.update((node, None) for node in split if any(node in table for table in tables))
            continue
        for table in (bucket.off, bucket.shared, bucket.whole):
            for node in table.nodes():
                tally.blank += table.count(node)
                nodes[node] = None
        tally.whole += sum(bucket.off.count(node) for node in bucket.off.nodes())
        for node in bucket.whole.nodes():
            sharing, count = index.sharing(node), bucket.whole.count(node)
            tally.mig_whole[sharing] += count
            tally.whole += 0 if sharing else count
    for node in nodes:
        mig_off = index.free_mig_off(node, model)
        if mig_off is not None:
            sharing = index.sharing(node)
            tally.convertible[sharing] += len(mig_off) + len(index.wholly_free_mig(node, model))
    return tally


def _add_counts(tally: Tally, counts: Counts) -> None:
    tally.blank += counts.blank
    tally.whole += counts.whole
    for sharing, n in counts.mig_whole.items():
        tally.mig_whole[sharing] += n
    for sharing, n in counts.convertible.items():
        tally.convertible[sharing] += n


def availability(gpus) -> dict[Key, Availability]:
    """Every (cluster, group, model, profile) the GPUs' groups offer, with group None for the cluster."""
    tallies: dict[tuple[str, str | None, str], Tally] = defaultdict(Tally)
    by_node: dict[tuple[str, str], list] = defaultdict(list)
    for gpu in gpus:
        by_node[(gpu.cluster, gpu.node)].append(gpu)
    for members in by_node.values():
        sharing = members[0].sharing
        changeable = not any(has_allocation(g) for g in members if not g.mig)
        for gpu in members:
            tally = tallies[(gpu.cluster, gpu.group, gpu.model)]
            tally.present += 1
            tally.offers = frozenset(gpu.offers)
            if not gpu.schedulable:
                continue
            busy = has_allocation(gpu)
            if gpu.mig or sharing:
                for slot in gpu.instances:
                    if not slot.allocated and (busy or not gpu.mig):
                        tally.free[slot.profile] += 1
            if busy:
                continue
            tally.blank += 1
            if gpu.mig:
                tally.mig_whole[sharing] += 1
            if not sharing:
                tally.whole += 1
            if changeable:
                tally.convertible[sharing] += 1
    found: dict[Key, Availability] = {}
    for (cluster, group, model), tally in tallies.items():
        info = model_info(model)
        for profile in profiles_of(info):
            kind = kind_of(profile)
            if kind.offer_of(profile) not in tally.offers:
                continue
            most = kind.max_per_gpu(info, profile)
            here = Availability(obtainable(tally, model, profile), tally.present * most)
            if group is not None:
                found[(cluster, group, model, profile)] = here
            wide = found.get((cluster, None, model, profile), Availability(0, 0))
            found[(cluster, None, model, profile)] = Availability(wide.now + here.now, wide.ever + here.ever)
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
