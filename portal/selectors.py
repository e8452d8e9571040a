"""Reads of tenancy data for pages and the API, already filtered by who may see what."""

from __future__ import annotations

from django.db.models import Prefetch, QuerySet
from django.shortcuts import get_object_or_404

from portal.models import ApiToken, Invitation, Membership, Project, Tenant


def my_memberships(*, user) -> QuerySet[Membership]:
    """The user's tenants with their projects and members, in a fixed number of queries."""
    return (
        Membership.objects.filter(user=user)
        .select_related("tenant")
        .prefetch_related(
            Prefetch("tenant__projects", queryset=Project.objects.order_by("name")),
            Prefetch(
                "tenant__memberships",
                queryset=Membership.objects.select_related("user").order_by("user__username"),
            ),
        )
        .order_by("tenant__name")
    )


def visible_tenant(*, user, slug: str) -> Tenant:
    """The tenant with this slug if the user may see it; 404 otherwise, whether it exists or not."""
    return get_object_or_404(Tenant.objects.visible_to(user), slug=slug)


def tenant_projects(*, tenant: Tenant) -> QuerySet[Project]:
    return tenant.projects.order_by("name")


def tenant_members(*, tenant: Tenant) -> QuerySet[Membership]:
    return tenant.memberships.select_related("user").order_by("user__username")


def tenant_open_invitations(*, tenant: Tenant) -> QuerySet[Invitation]:
    return tenant.invitations.pending().select_related("invited_by").order_by("-created_at")


def visible_project(*, user, tenant_slug: str, slug: str) -> Project:
    return get_object_or_404(
        Project.objects.visible_to(user).select_related("tenant", "created_by"),
        tenant__slug=tenant_slug,
        slug=slug,
    )


def visible_projects(*, user) -> QuerySet[Project]:
    return Project.objects.visible_to(user).select_related("tenant").order_by("tenant__name", "name")


def my_tokens(*, user) -> QuerySet[ApiToken]:
    """The person's own API tokens, newest first; keys are never stored, so none can be shown."""
    return ApiToken.objects.filter(user=user).order_by("-created_at", "-pk")
