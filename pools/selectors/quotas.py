"""Reads of quotas for the admission policy (pools/placement/admission.py) and the pages: the ledger of what
each tenant may hold and holds, its live pools as holdings, and guarantees against in-service capacity.

A pool's slices count in the key of its request's purpose and its GPUs' model; a request without a purpose
counts under the blank group. In-service capacity of a key is what placement could ever give there: GPUs
present, healthy and not drained (nor their node), on ready clusters; of the blank group, every such GPU of
the model (a request without a purpose may land in any group).
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Iterable, Iterator
from dataclasses import dataclass

from django.db.models import Count, QuerySet, Sum

from pools.conf import settings
from pools.kinds import counted_slices
from pools.mig import COMPUTE_SLICES
from pools.models import (
    Allocation,
    Cluster,
    GpuGroup,
    Pool,
    PoolRequest,
    PoolState,
    Quota,
    RequestItem,
    RequestState,
    TenantPolicy,
)
from pools.placement.admission import Holding, Key, Ledger, asked_slices
from pools.placement.admission import Quota as PolicyQuota
from pools.placement.types import Item
from pools.selectors.capacity import Where, fleet_figures
from pools.selectors.fleet import engine_request
from pools.selectors.kept import Kept
from portal.models import Tenant


def quota_owner(project, of_project: bool) -> str:
    """Who a limit belongs to, as its reason names it (QuotaVerdict.reason): the project, or its tenant."""
    return str(project) if of_project else project.tenant.name


def _ids(tenant_ids):
    """Tenant ids as a filter takes them: None (all), a query of ids (visible_tenant_ids), or a list."""
    return tenant_ids if tenant_ids is None or isinstance(tenant_ids, QuerySet) else list(tenant_ids)


def holdings(tenant_ids: Iterable[int] | None = None) -> list[Holding]:
    """The live pools (of these tenants, else all) with the slices each holds per key, from their live
    allocations, reclaimable where active (not provisioning, nor under notice already); in no particular
    order. Two queries: what the live allocations hold per pool, model and profile, then those pools' own
    fields, read once per pool rather than carried along each of its allocations."""
    live = Allocation.objects.filter(released_at__isnull=True).order_by()
    if tenant_ids is not None:
        live = live.filter(pool__project__tenant_id__in=_ids(tenant_ids))
    units: dict[int, list[tuple[str, str, int]]] = defaultdict(list)
    for pool, model, profile, n in live.values_list("pool", "gpu__model", "profile").annotate(n=Count("id")):
        units[pool].append((model, profile, n))
    fields = ("pk", "project__tenant_id", "project_id", "request__priority", "reserved_at", "state")
    pools = Pool.objects.filter(pk__in=live.values("pool_id")).values_list(*fields, "request__purpose")
    found = []
    for pool, tenant, project, priority, reserved, state, purpose in pools:
        held: Counter = Counter()
        for model, profile, n in units[pool]:
            held[(purpose, model)] += counted_slices(model, profile) * n
        reclaimable = state == PoolState.ACTIVE
        found.append(Holding(pool, tenant, project, priority, (reserved, pool), dict(held), reclaimable))
    return found


def ledger(
    tenant_ids: Iterable[int] | QuerySet | None = None, *, waiting: bool = False
) -> tuple[Ledger, list[Holding]]:
    """The ledger of these tenants (else all): their quotas and their projects' limits, what they hold,
    and (`waiting`) what their approved requests not yet admitted ask for, counted as held; with the live
    pools it counted."""
    ids = _ids(tenant_ids)
    rows = Quota.objects.all() if ids is None else Quota.objects.filter(tenant_id__in=ids)
    return _ledger(ids, rows, waiting=waiting)


# Every tenant's holdings as the pages show them (held and borrowed slices), kept per capacity version
# (pools/selectors/kept.py): those figures change only with live allocations, and every allocation made or
# freed bumps the version. The queue and every service read `holdings` afresh.
_HOLDINGS: Kept[list[Holding]] = Kept("holdings", holdings)


def shown_ledger(tenant_ids: Iterable[int] | QuerySet | None = None) -> tuple[Ledger, list[Holding]]:
    """`ledger` as the pages show it: of the kept holdings."""
    ids = _ids(tenant_ids)
    rows = Quota.objects.all() if ids is None else Quota.objects.filter(tenant_id__in=ids)
    return _ledger(ids, rows, waiting=False, shown=True)


def _ledger(
    ids, rows: Iterable[Quota], *, waiting: bool, shown: bool = False
) -> tuple[Ledger, list[Holding]]:
    quotas: dict[int, dict[Key, PolicyQuota]] = defaultdict(dict)
    project_limits: dict[int, dict[Key, int]] = defaultdict(dict)
    for quota in rows:
        key = (quota.group, quota.gpu_model)
        if quota.project_id is None:
            quotas[quota.tenant_id][key] = PolicyQuota(quota.guaranteed, quota.limit)
        elif quota.limit is not None:
            project_limits[quota.project_id][key] = quota.limit
    if not shown:
        found = holdings(ids)
    elif ids is None:
        found = _HOLDINGS.get()
    else:
        wanted = set(Tenant.objects.filter(pk__in=ids).values_list("pk", flat=True))
        found = [holding for holding in _HOLDINGS.get() if holding.tenant in wanted]
    books = Ledger(
        quotas=dict(quotas), project_limits=dict(project_limits), default_limit=settings.QUOTA_DEFAULT_LIMIT
    )
    for holding in found:
        books.take(holding.tenant, holding.project, holding.slices)
    if waiting:
        for tenant, project, slices in _waiting_slices(ids):
            books.take(tenant, project, slices)
    return books, found


def _waiting_slices(ids) -> Iterator[tuple[int, int, dict[Key, int]]]:
    """What approved requests not admitted yet ask for, summed per tenant, project, purpose and unit in the
    database: a tenant's submission reads as many rows however many of its requests wait."""
    waiting = PoolRequest.objects.filter(state__in=[RequestState.APPROVED, RequestState.QUEUED])
    if ids is not None:
        waiting = waiting.filter(project__tenant_id__in=ids)
    rows = (
        RequestItem.objects.filter(request__in=waiting)
        .values_list(
            "request__project__tenant_id", "request__project_id", "request__purpose", "gpu_model", "profile"
        )
        .annotate(n=Sum("count"))
        .order_by()
    )
    for tenant, project, purpose, model, profile, n in rows:
        yield tenant, project, asked_slices([Item(model, profile, n)], purpose)


def request_slices(request: PoolRequest) -> dict[Key, int]:
    """What a request asks for, per quota key (its items prefetched)."""
    return asked_slices(engine_request(request, grouped=False).items, request.purpose)


def in_service_slices() -> dict[Key, int]:
    """Per key, the compute slices of in-service GPUs; the blank group of a model counts all of them. Added up
    from the fleet's figures (pools/selectors/capacity.py: fleet_figures, kept per capacity version), so that
    neither the quotas page nor setting a quota reads every GPU."""
    ready = set(Cluster.objects.filter(status=Cluster.Status.READY).values_list("pk", flat=True))
    names = dict(GpuGroup.objects.values_list("pk", "name"))
    found: Counter = Counter()
    for (cluster_id, group_id, model), figures in fleet_figures(by=_in_service_key).items():
        if cluster_id not in ready:
            continue
        slices = (figures.gpus - figures.unschedulable_gpus) * COMPUTE_SLICES
        found[("", model)] += slices
        if group_id in names:  # a group deleted since the figures were kept counts under the blank one only
            found[(names[group_id], model)] += slices
    return dict(found)


def _in_service_key(where: Where) -> tuple[int, int | None, str]:
    return where.cluster_id, where.group_id, where.model


@dataclass(frozen=True)
class GuaranteeRow:
    """Guarantees against in-service capacity in one key, for the operators: `short` slices more are
    guaranteed than are in service, and `tenants_short` are those holding less than their guarantee."""

    group: str
    gpu_model: str
    capacity: int
    guaranteed: int
    held: int
    tenants_short: tuple[tuple[str, int, int], ...]  # (tenant name, held, guaranteed)

    @property
    def short(self) -> int:
        return max(0, self.guaranteed - self.capacity)


def guarantees_against_capacity(*, books: Ledger | None = None) -> list[GuaranteeRow]:
    """Every key where some tenant has a guarantee, with the capacity in service there (against `books`,
    every tenant's ledger, when the caller has read it already)."""
    capacity = in_service_slices()
    if books is None:
        books, _holdings = shown_ledger()
    rows = Quota.objects.filter(project__isnull=True, guaranteed__gt=0).select_related("tenant")
    by_key: dict[Key, list[Quota]] = defaultdict(list)
    for quota in rows:
        by_key[(quota.group, quota.gpu_model)].append(quota)
    found = []
    for (group, model), quotas in sorted(by_key.items()):
        held = {q.tenant_id: books.held[q.tenant_id][(group, model)] for q in quotas}
        found.append(
            GuaranteeRow(
                group=group,
                gpu_model=model,
                capacity=capacity.get((group, model), 0),
                guaranteed=sum(q.guaranteed for q in quotas),
                held=sum(held.values()),
                tenants_short=tuple(
                    (q.tenant.name, held[q.tenant_id], q.guaranteed)
                    for q in sorted(quotas, key=lambda q: q.tenant.name)
                    if held[q.tenant_id] < q.guaranteed
                ),
            )
        )
    return found


def quota_rows(
    tenant_ids: Iterable[int] | QuerySet | None = None, *, books: tuple[Ledger, list[Holding]] | None = None
) -> list[dict]:
    """One row per tenant, group and model where the tenant has a quota or holds something: guaranteed,
    limit, held and borrowed slices (the API's and the tenant page's); then one per project limit, with
    what the project holds. Ordered by tenant, project (the tenant's own rows first), group and model. Of
    the kept holdings (`shown_ledger`); `books`: `shown_ledger(tenant_ids)`, when the caller has read it."""
    ids = _ids(tenant_ids)
    quotas = Quota.objects.select_related("tenant", "project")
    if ids is not None:
        quotas = quotas.filter(tenant_id__in=ids)
    quotas = list(quotas)
    books, found = books or _ledger(ids, quotas, waiting=False, shown=True)
    keys: set[tuple[int, Key]] = {
        (q.tenant_id, (q.group, q.gpu_model)) for q in quotas if q.project_id is None
    }
    keys |= {(h.tenant, key) for h in found for key in h.slices}
    borrowed: Counter = Counter()
    tenant_of = {holding.pool: holding.tenant for holding in found}
    for pool, beyond in books.borrowed(found).items():
        for key, slices in beyond.items():
            borrowed[(tenant_of[pool], key)] += slices
    names = dict(Tenant.objects.filter(pk__in={t for t, _k in keys}).values_list("pk", "slug"))
    rows = []
    for tenant, (group, model) in keys:
        quota = books.quota(tenant, (group, model))
        held = books.held[tenant][(group, model)]
        rows.append(
            _row(names.get(tenant, ""), None, group, model, quota.guaranteed, quota.limit, held)
            | {"borrowed": borrowed[(tenant, (group, model))]}
        )
    for quota in quotas:
        if quota.project_id is not None:
            held = books.project_held[quota.project_id][(quota.group, quota.gpu_model)]
            rows.append(
                _row(
                    quota.tenant.slug, quota.project.slug, quota.group, quota.gpu_model, 0, quota.limit, held
                )
            )
    return sorted(rows, key=lambda r: (r["tenant"], r["project"] or "", r["group"], r["gpu_model"]))


def tenant_quotas(tenant_id: int) -> list[dict]:
    """A tenant's quota rows where a quota is set (a guarantee or a limit): what its pages show; none where
    no quota says anything of it."""
    return [row for row in quota_rows([tenant_id]) if row["guaranteed"] or row["limit"] is not None]


def _row(tenant: str, project: str | None, group: str, model: str, guaranteed: int, limit, held: int) -> dict:
    return {
        "tenant": tenant,
        "project": project,
        "group": group,
        "gpu_model": model,
        "guaranteed": guaranteed,
        "limit": limit,
        "held": held,
        "borrowed": 0,
    }


def borrowed_pool_ids(pool_ids: Iterable[int]) -> set[int]:
    """Which of these live pools hold borrowed slices, counted over their tenants' live pools."""
    ids = set(pool_ids)
    tenants = set(
        Allocation.objects.filter(pool_id__in=ids, released_at__isnull=True).values_list(
            "pool__project__tenant_id", flat=True
        )
    )
    if not tenants:
        return set()
    books, found = ledger(tenants)
    return books.borrowed_pools(found) & ids


def approves_within_guarantee(tenant_id: int) -> bool:
    """Whether the tenant's requests within its guarantee are approved by the policy itself."""
    return TenantPolicy.objects.filter(tenant_id=tenant_id, auto_approve_within_guarantee=True).exists()


__all__ = [
    "GuaranteeRow",
    "approves_within_guarantee",
    "borrowed_pool_ids",
    "guarantees_against_capacity",
    "holdings",
    "in_service_slices",
    "ledger",
    "quota_owner",
    "quota_rows",
    "request_slices",
    "shown_ledger",
    "tenant_quotas",
]
