"""What monitoring reads of pools: the GPUs where they are, the clusters, the allocations with what they
hold and for whom, the pools on a GPU, and the open trespasses. Pools names its own tables and states here,
so that monitoring's SQL, which joins these to its own figures in one query, never does.

Words:
- relation: a queryset compiled to SQL (a SELECT, for a CTE or a subquery) with its parameters, named
  `<relation>_<n>` so that they sit beside the caller's own `%(name)s` parameters in one statement. Its
  columns are those its function lists.
- start: the first memory slice a MIG instance occupies; NULL for a whole GPU.
- compute: the compute slices an allocation holds: all of a whole GPU's, a MIG profile's as the catalogue
  says (`pools.mig`), none for a profile the catalogue does not know.
- live: an allocation not released yet.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from decimal import Decimal

from django.db.models import Case, DecimalField, F, IntegerField, QuerySet, Value, When

from pools import mig
from pools.kinds import SHARE_KINDS, WHOLE
from pools.models import IN_USE_STATES, Allocation, Cluster, GpuCapacity, Trespass
from pools.selectors.requests import LIVE_POOL_STATES


@dataclass(frozen=True)
class Relation:
    """A query's SQL and its named parameters (see the module's words)."""

    sql: str
    params: dict[str, object]


def relation(queryset: QuerySet, name: str) -> Relation:
    """`queryset` as a relation whose parameters are named `{name}_0`, `{name}_1`, ..."""
    sql, params = queryset.query.sql_with_params()
    names = [f"{name}_{n}" for n in range(len(params))]
    # %-formatting turns each %s into a named placeholder; a literal %% must come out as %% again.
    named = sql.replace("%%", "%%%%") % tuple(f"%({n})s" for n in names)
    return Relation(named, dict(zip(names, params, strict=True)))


def gpus() -> Relation:
    """Every GPU of the inventory, present or not, and where it is. Columns: gpu_id, node_id, cluster_id,
    group_id (the node's GPU group, or NULL), cluster_name, node_name, index, uuid, model, present (the
    GPU's own flag) and node_present."""
    return relation(
        GpuCapacity.objects.order_by().values(
            "node_id",
            "index",
            "uuid",
            "model",
            "present",
            gpu_id=F("id"),
            cluster_id=F("node__cluster_id"),
            group_id=F("node__group_id"),
            cluster_name=F("node__cluster__name"),
            node_name=F("node__name"),
            node_present=F("node__present"),
        ),
        "gpus",
    )


def clusters() -> Relation:
    """Every cluster. Columns: id, name."""
    return relation(Cluster.objects.order_by().values("id", "name"), "clusters")


# Compute slices to three decimals: a share counts its fraction of its GPU's.
COMPUTE = DecimalField(max_digits=6, decimal_places=3)
MILLI = Decimal("0.001")
# The profiles whose figures are their whole GPU's (pools/kinds: `gpu_figures`): a whole GPU, a share.
GPU_FIGURES = [WHOLE.profile, *(profile for kind in SHARE_KINDS for profile in kind.every_profile())]


def _share_of_seven(replicas: int) -> Decimal:
    return (Decimal(mig.COMPUTE_SLICES) / replicas).quantize(MILLI)


def _compute() -> Case:
    catalogue = [
        When(gpu__model=model.name, profile=profile.name, then=Value(profile.compute_slices))
        for model in mig.GPU_MODELS.values()
        for profile in model.profiles.values()
    ]
    shares = [
        When(
            profile=profile,
            then=Value((Decimal(mig.COMPUTE_SLICES) / kind.replicas(profile)).quantize(MILLI)),
        )
        for kind in SHARE_KINDS
        for profile in kind.every_profile()
    ]
    return Case(
        When(profile=WHOLE.profile, then=Value(mig.COMPUTE_SLICES)),
        *catalogue,
        *shares,
        default=Value(0),
        output_field=COMPUTE,
    )


def allocations(*, live: bool = False, active_pools: bool = False) -> Relation:
    """Allocations: every one, the `live` ones, or (`active_pools`) the live ones of active pools, those
    billed now. Columns: id, pool_id, gpu_id, profile, start, compute, allocated_at, released_at,
    tenant_id, tenant_slug, tenant_name and project_slug (the pool's)."""
    found = Allocation.objects.order_by()
    if live or active_pools:
        found = found.filter(released_at__isnull=True)
    if active_pools:
        found = found.filter(pool__state__in=IN_USE_STATES, pool__released_at__isnull=True)
    return relation(
        found.values(
            "id",
            "pool_id",
            "gpu_id",
            "profile",
            "allocated_at",
            "released_at",
            start=Case(
                When(profile__in=GPU_FIGURES, then=Value(None)),
                default=F("slices__startswith"),
                output_field=IntegerField(),
            ),
            compute=_compute(),
            tenant_id=F("pool__project__tenant_id"),
            tenant_slug=F("pool__project__tenant__slug"),
            tenant_name=F("pool__project__tenant__name"),
            project_slug=F("pool__project__slug"),
        ),
        "allocations",
    )


def live_pools_on(gpu_ids: Iterable[int]) -> dict[int, set[int]]:
    """The pools (provisioning, active or releasing) holding live capacity on each of the GPUs, by GPU id;
    one query."""
    held: dict[int, set[int]] = {}
    for gpu_id, pool_id in Allocation.objects.filter(
        gpu_id__in=list(gpu_ids), released_at__isnull=True, pool__state__in=LIVE_POOL_STATES
    ).values_list("gpu_id", "pool_id"):
        held.setdefault(gpu_id, set()).add(pool_id)
    return held


def open_trespasses() -> list[Trespass]:
    """The GPUs in use by namespaces that hold no allocation on them, as the last syncs saw them."""
    return list(
        Trespass.objects.filter(ended_at__isnull=True).select_related("cluster", "node").order_by("pk")
    )
