"""Reads of pool requests and pools for tenant pages and the API, already filtered by who may see
them, with why a request waits in the reader's language."""

from __future__ import annotations

from typing import TYPE_CHECKING

from django.db.models import Case, Count, OuterRef, Prefetch, QuerySet, Subquery, Value, When
from django.db.models.functions import Coalesce
from django.shortcuts import get_object_or_404

from pools.models import (
    Allocation,
    Pool,
    PoolEvent,
    PoolRequest,
    PoolState,
    RequestState,
)
from portal import audit

if TYPE_CHECKING:
    from portal.models import Project, Tenant

# Pools that still hold (or are about to hold, or give back) capacity: the project page lists them first.
LIVE_POOL_STATES = (PoolState.PROVISIONING, PoolState.ACTIVE, PoolState.RECLAIMING, PoolState.RELEASING)
# Pools on their way in or out: their pages refresh themselves until the pool settles.
MOVING_POOL_STATES = (PoolState.PROVISIONING, PoolState.RELEASING)
# Requests not decided, or decided and not placed yet: they wait on an approver or on the queue.
WAITING_REQUEST_STATES = (RequestState.SUBMITTED, RequestState.APPROVED, RequestState.QUEUED)


def _request_rows(queryset: QuerySet[PoolRequest]) -> QuerySet[PoolRequest]:
    """Requests as lists show them, newest first: a fixed number of queries however many rows."""
    return (
        queryset.select_related("project", "submitted_by")
        .prefetch_related("items")
        .order_by("-submitted_at", "-pk")
    )


def _pool_rows(queryset: QuerySet[Pool]) -> QuerySet[Pool]:
    """Pools as lists show them, newest first: a fixed number of queries however many rows."""
    return (
        queryset.select_related("project", "cluster", "request")
        .prefetch_related("items")
        .order_by("-reserved_at", "-pk")
    )


def project_requests(*, project: Project) -> QuerySet[PoolRequest]:
    return _request_rows(project.pool_requests.all())


def project_pools(*, project: Project) -> QuerySet[Pool]:
    """The project's pools, live ones first: those are what its people come to the page for."""
    live_first = Case(When(state__in=LIVE_POOL_STATES, then=Value(0)), default=Value(1))
    return _pool_rows(project.pools.all()).alias(gone=live_first).order_by("gone", "-reserved_at", "-pk")


def tenant_requests(
    *, user, tenant: Tenant, state: str = "", project: Project | None = None
) -> QuerySet[PoolRequest]:
    """The tenant's pool requests that the user may see, newest first; of one state or project if given."""
    return _request_rows(_narrowed(PoolRequest.objects.visible_to(user), tenant, state, project))


def tenant_pools(*, user, tenant: Tenant, state: str = "", project: Project | None = None) -> QuerySet[Pool]:
    """The tenant's pools that the user may see, newest first; of one state or project if given."""
    return _pool_rows(_narrowed(Pool.objects.visible_to(user), tenant, state, project))


def tenant_live_pools(*, user, tenant: Tenant) -> QuerySet[Pool]:
    """The tenant's pools that hold capacity or are on their way in or out, that the user may see, newest
    first; each with `since`, when it entered its state (its latest event into it, else its reservation)."""
    entered = PoolEvent.objects.filter(pool=OuterRef("pk"), to_state=OuterRef("state")).order_by("-at", "-pk")
    return (
        tenant_pools(user=user, tenant=tenant)
        .filter(state__in=LIVE_POOL_STATES)
        .annotate(since=Coalesce(Subquery(entered.values("at")[:1]), "active_at", "reserved_at"))
    )


def tenant_waiting_requests(*, user, tenant: Tenant) -> QuerySet[PoolRequest]:
    """The tenant's requests that wait on an approver or on the queue, that the user may see, newest first."""
    return tenant_requests(user=user, tenant=tenant).filter(state__in=WAITING_REQUEST_STATES)


def tenant_counts(*, user, tenant_ids) -> dict[int, tuple[int, int]]:
    """Per tenant id, (live pools, waiting requests) of those the user may see: one query for all tenants."""
    from portal.models import Tenant

    pools = Pool.objects.visible_to(user).filter(project__tenant=OuterRef("pk"), state__in=LIVE_POOL_STATES)
    requests = PoolRequest.objects.visible_to(user).filter(
        project__tenant=OuterRef("pk"), state__in=WAITING_REQUEST_STATES
    )
    rows = Tenant.objects.filter(pk__in=tenant_ids).annotate(
        live_pools=_count(pools), waiting_requests=_count(requests)
    )
    return {row.pk: (row.live_pools, row.waiting_requests) for row in rows}


def _count(rows: QuerySet) -> Coalesce:
    """How many of `rows` (filtered on an outer row) there are, as a subquery of that row's query."""
    counted = rows.order_by().values("project__tenant").annotate(n=Count("pk")).values("n")
    return Coalesce(Subquery(counted), 0)


def _narrowed(queryset: QuerySet, tenant: Tenant, state: str, project: Project | None) -> QuerySet:
    """The tenant's rows of a request or pool queryset; of one state or project if given."""
    queryset = queryset.filter(project__tenant=tenant)
    if state:
        queryset = queryset.filter(state=state)
    if project is not None:
        queryset = queryset.filter(project=project)
    return queryset


def queue_positions() -> dict[int, int]:
    """Position (1-based) of every waiting request, in admission order."""
    ids = PoolRequest.objects.waiting().values_list("pk", flat=True)
    return {pk: n for n, pk in enumerate(ids, start=1)}


def visible_request(*, user, tenant_slug: str, pk: int) -> PoolRequest:
    return get_object_or_404(
        PoolRequest.objects.visible_to(user)
        .select_related("project__tenant", "cluster", "submitted_by", "decided_by")
        .prefetch_related("items", "events__actor"),
        project__tenant__slug=tenant_slug,
        pk=pk,
    )


def visible_pool(*, user, tenant_slug: str, pk: int) -> Pool:
    return get_object_or_404(
        Pool.objects.visible_to(user)
        .select_related("project__tenant", "cluster", "request")
        .prefetch_related(
            "items",
            "events__actor",
            Prefetch("allocations", queryset=Allocation.objects.select_related("gpu__node").order_by("pk")),
        ),
        project__tenant__slug=tenant_slug,
        pk=pk,
    )


def render_reason(data) -> str:
    """A stored reason (its template and values) in the language of the current request: read as the
    audit trail reads its summaries, which are stored alike."""
    return audit.render_data(data)


def event_reason(event: PoolEvent, request: PoolRequest | None) -> str:
    """An event's why, in the reader's language where it was stored with its template; an older queue
    event's is shown translated while it is still the request's waiting reason."""
    if event.reason_data:
        return render_reason(event.reason_data)
    if request is not None and request.waiting_reason_data and event.reason == request.waiting_reason:
        return render_reason(request.waiting_reason_data)
    return event.reason


def waiting_reason(request: PoolRequest) -> str:
    return (
        render_reason(request.waiting_reason_data) if request.waiting_reason_data else request.waiting_reason
    )
