"""Why a request was not placed, in words a tenant can act on: what is missing, and where."""

from __future__ import annotations

from pools.placement_index import Bucket, FleetIndex
from pools.placement_layouts import catalogue

Wanted = dict[str, tuple[int, dict[str, int]]]  # model -> (full GPUs, {profile: instances})


def unplaced_reason(index: FleetIndex, group: str | None, wanted: Wanted, failed: dict[str, str]) -> str:
    """`failed` names, per cluster, the first model of the request that the cluster could not take."""
    where = f" in group {group}" if group else ""
    relevant = [
        cluster
        for cluster in index.clusters()
        if any(index.buckets_for(cluster, model, group) for model in wanted)
    ]
    if not relevant:
        return f"no {next(iter(wanted))} GPU{where}"
    reasons = [
        (cluster, _model_reason(index, cluster, group, wanted, failed[cluster])) for cluster in relevant
    ]
    if len(reasons) == 1:
        cluster, reason = reasons[0]
        return f"cluster {cluster}: {reason}" if len(index.clusters()) > 1 else reason
    listed = "; ".join(f"cluster {cluster}: {reason}" for cluster, reason in reasons)
    return f"no single cluster can take the whole request: {listed}"


def _model_reason(index: FleetIndex, cluster: str, group: str | None, wanted: Wanted, model: str) -> str:
    where = f" in group {group}" if group else ""
    buckets = index.buckets_for(cluster, model, group)
    if not buckets:
        return f"no {model} GPU{where}"
    total = sum(b.total for b in buckets)
    drained = sum(b.drained for b in buckets)
    if drained == total:
        if total == 1:
            return f"the one {model} GPU{where} is drained or unhealthy"
        return f"all {total} {model} GPUs{where} are drained or unhealthy"
    blank = _count(buckets, "off") + _count(buckets, "whole")
    full, mig = wanted[model]
    if full > blank:
        return f"needs {full} × full {model}; {blank} free"
    cat = catalogue(model)
    for profile, count in mig.items():
        in_use = sum(sum(b.partial.get(profile, {}).values()) for b in buckets)
        placeable = in_use + blank * cat.most[cat.names.index(profile)]
        if placeable < count:
            return f"needs {count} × {profile}; {placeable} placeable without re-partitioning in-use GPUs"
    items = [f"{full} × full {model}"] if full else []
    items += [f"{count} × {profile}" for profile, count in mig.items()]
    return (
        f"needs {' and '.join(items)} together; the free {model} capacity{where} takes each alone "
        f"but not all at once ({blank} wholly free GPU{'' if blank == 1 else 's'}, the rest in use)"
    )


def _count(buckets: list[Bucket], table: str) -> int:
    return sum(len(gpus) for b in buckets for gpus in getattr(b, table).values())
