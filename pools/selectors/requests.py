"""Reads of pool requests and pools for tenant pages and the API, already filtered by who may see
them, with why a request waits in the reader's language."""

from __future__ import annotations

from typing import TYPE_CHECKING

from django.db.models import Case, Prefetch, QuerySet, Value, When
from django.shortcuts import get_object_or_404

from pools.models import (
    Allocation,
    Pool,
    PoolEvent,
    PoolRequest,
    PoolState,
)

if TYPE_CHECKING:
    from portal.models import Project, Tenant

# Pools that still hold (or are about to hold, or give back) capacity: the project page lists them first.
LIVE_POOL_STATES = (PoolState.PROVISIONING, PoolState.ACTIVE, PoolState.RELEASING)


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
        .prefetch_related("request__items")
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
            "request__items",
            "events__actor",
            Prefetch("allocations", queryset=Allocation.objects.select_related("gpu__node").order_by("pk")),
        ),
        project__tenant__slug=tenant_slug,
        pk=pk,
    )


def render_reason(data) -> str:
    """A stored reason (its template and values) in the language of the current request."""
    from django.utils.translation import gettext

    if isinstance(data, dict):
        values = {key: render_reason(value) for key, value in data["params"].items()}
        template = data["template"]
        return (template if template == "%(text)s" else gettext(template)) % values
    if isinstance(data, list):
        return "; ".join(render_reason(item) for item in data)
    return data


def event_reason(event: PoolEvent, request: PoolRequest | None) -> str:
    """An event's why; a queue event's is shown translated while it is still the request's waiting reason."""
    if request is not None and request.waiting_reason_data and event.reason == request.waiting_reason:
        return render_reason(request.waiting_reason_data)
    return event.reason


def waiting_reason(request: PoolRequest) -> str:
    return (
        render_reason(request.waiting_reason_data) if request.waiting_reason_data else request.waiting_reason
    )
