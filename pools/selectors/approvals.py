"""Reads of the approvers' workspace: requests awaiting a decision, approved ones still in the queue, one
request as the approver weighs it, and what its tenant already holds. Platform staff only: the views
check the permission before calling these."""

from __future__ import annotations

from typing import TYPE_CHECKING

from django.db.models import QuerySet
from django.shortcuts import get_object_or_404

from pools.models import Pool, PoolRequest, RequestState
from pools.selectors.requests import LIVE_POOL_STATES

if TYPE_CHECKING:
    from portal.models import Tenant


def _rows(queryset: QuerySet[PoolRequest]) -> QuerySet[PoolRequest]:
    return queryset.select_related("project__tenant", "submitted_by", "cluster").prefetch_related("items")


def awaiting_decision() -> QuerySet[PoolRequest]:
    """Submitted requests, oldest first: the order they were asked in is the order they are decided in."""
    return _rows(PoolRequest.objects.filter(state=RequestState.SUBMITTED)).order_by("submitted_at", "pk")


def awaiting_decision_count() -> int:
    """How many requests wait for a decision: one COUNT on the state index."""
    return PoolRequest.objects.filter(state=RequestState.SUBMITTED).count()


def approved_waiting() -> QuerySet[PoolRequest]:
    """Approved requests the queue has not admitted yet, in the queue's own order."""
    return _rows(PoolRequest.objects.waiting())


def request_to_decide(*, pk: int) -> PoolRequest:
    """Any tenant's request, with what its page shows; 404 when there is none."""
    return get_object_or_404(
        _rows(PoolRequest.objects.all()).select_related("decided_by").prefetch_related("events__actor"),
        pk=pk,
    )


def tenant_holdings(*, tenant: Tenant) -> QuerySet[Pool]:
    """The tenant's live pools (provisioning, active or releasing), newest first, each with its project,
    cluster and the items it was asked with."""
    return (
        Pool.objects.filter(project__tenant=tenant, state__in=LIVE_POOL_STATES)
        .select_related("project", "cluster", "request")
        .prefetch_related("items")
        .order_by("-reserved_at", "-pk")
    )
