"""Reads of tenancy data for pages and the API, already filtered by who may see what: every tenant,
project and membership here is reached through `visible_to(user)`, built on `portal.models.visible_tenant_ids`
(the one door of tenancy), or is the person's own."""

from __future__ import annotations

from datetime import date, datetime, time, timedelta

from django.db.models import Prefetch, QuerySet
from django.shortcuts import get_object_or_404
from django.utils import timezone

from portal.models import ApiToken, AuditEntry, Invitation, Membership, Project, Tenant


def my_memberships(*, user) -> QuerySet[Membership]:
    """The user's own memberships, each with its tenant's projects and members, in a fixed number of
    queries: the tenants they belong to, whoever else may see more (`visible_tenant_ids`)."""
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


def audit_entries(
    *,
    action: str = "",
    tenant: str = "",
    actor: str = "",
    since: date | None = None,
    until: date | None = None,
    text: str = "",
) -> QuerySet[AuditEntry]:
    """Audit entries newest first, filtered: `action` is a code or, without a dot, a family of codes;
    `tenant` a short name; `actor` a user name; `since` and `until` whole days (both included) in the
    portal's time zone; `text` is searched in the summaries."""
    entries = AuditEntry.objects.select_related("actor", "tenant").order_by("-at", "-pk")
    if action:
        entries = (
            entries.filter(action=action)
            if "." in action
            else entries.filter(action__startswith=f"{action}.")
        )
    if tenant:
        entries = entries.filter(tenant__slug=tenant)
    if actor:
        entries = entries.filter(actor__username=actor)
    if since:
        entries = entries.filter(at__gte=_start_of(since))
    if until:
        entries = entries.filter(at__lt=_start_of(until + timedelta(days=1)))
    if text:
        entries = entries.filter(summary__icontains=text)
    return entries


def _start_of(day: date) -> datetime:
    return timezone.make_aware(datetime.combine(day, time.min))


def audit_actions() -> list[str]:
    """The action codes the trail holds, for the filter's suggestions."""
    return sorted(AuditEntry.objects.order_by().values_list("action", flat=True).distinct())
