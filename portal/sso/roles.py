"""Groups to roles: at every sign-in through an identity provider, the roles its groups map to (GroupRole) are
applied, and those it gave before and no longer gives are taken away.

Roles given in the portal by hand are kept apart: a tenant role from the provider is its own field of the
membership (the higher of the two holds, and taking the provider's away leaves the one given by hand), and a
platform group the person held already when the provider first gave it stays when the provider stops. A
platform group makes its holder staff; staff status the provider gave goes with its last platform group.
Every change is audited, in the transaction that makes it.
"""

from __future__ import annotations

from collections.abc import Iterable

from django.contrib.auth.models import AbstractBaseUser, Group
from django.db import transaction
from django.db.models import Q
from django.utils.translation import gettext_noop

from portal import audit
from portal.models import (
    STAFF,
    GroupRole,
    Membership,
    ProviderGrant,
    Tenant,
    higher_role,
    parse_role,
)

TENANT_ROLE_GIVEN = gettext_noop("%(provider)s gave %(user)s the role %(role)s in %(tenant)s")
TENANT_ROLE_TAKEN = gettext_noop("%(provider)s no longer gives %(user)s a role in %(tenant)s")
PLATFORM_ROLE_GIVEN = gettext_noop("%(provider)s made %(user)s %(role)s")
PLATFORM_ROLE_TAKEN = gettext_noop("%(provider)s no longer makes %(user)s %(role)s")


def mapped_roles(*, provider: str, groups: Iterable[str]) -> tuple[dict[str, str], set[str]]:
    """What these groups of this provider give: the highest role per tenant (by short name), and the platform
    groups. Mappings that no longer parse are skipped."""
    tenants: dict[str, str] = {}
    platform: set[str] = set()
    rows = GroupRole.objects.filter(Q(provider="") | Q(provider=provider), group__in=list(groups))
    for role in rows.values_list("role", flat=True):
        try:
            slug, name = parse_role(role)
        except ValueError:
            continue
        if slug:
            tenants[slug] = higher_role(tenants.get(slug, ""), name)
        else:
            platform.add(name)
    return tenants, platform


def apply_provider_roles(*, user: AbstractBaseUser, provider: str, groups: Iterable[str]) -> int:
    """Make the roles the provider gives `user` those its `groups` map to now; returns how many changed."""
    tenant_roles, platform = mapped_roles(provider=provider, groups=groups)
    with transaction.atomic():
        changes = _apply_tenant_roles(user, provider, tenant_roles)
        changes += _apply_platform_roles(user, provider, platform)
    return changes


def _record(
    action: str, summary: str, user, provider: str, *, tenant: Tenant | None = None, role: str = ""
) -> None:
    values = {"provider": provider, "user": user.get_username(), "role": role}
    if tenant is not None:
        values["tenant"] = tenant.name
    audit.record(
        action,
        summary=summary,
        values=values,
        tenant_id=tenant.pk if tenant is not None else None,
        subject=("user", user.pk),
    )


def _apply_tenant_roles(user, provider: str, wanted: dict[str, str]) -> int:
    tenants = {tenant.slug: tenant for tenant in Tenant.objects.filter(slug__in=wanted)}
    held = {
        m.tenant_id: m
        for m in Membership.objects.select_for_update().select_related("tenant").filter(user=user)
    }
    changes = 0
    wanted_ids = {tenants[slug].pk: role for slug, role in wanted.items() if slug in tenants}
    for tenant_id, membership in held.items():
        if membership.provider_role and tenant_id not in wanted_ids:
            if membership.hand_role:
                membership.provider_role, membership.role = "", membership.hand_role
                membership.save()
            else:
                membership.delete()
            _record("access.provider_role_taken", TENANT_ROLE_TAKEN, user, provider, tenant=membership.tenant)
            changes += 1
    for slug, tenant in tenants.items():
        role = wanted[slug]
        membership = held.get(tenant.pk)
        if membership is None:
            Membership.objects.create(user=user, tenant=tenant, role=role, provider_role=role)
        elif membership.provider_role != role:
            membership.provider_role = role
            membership.save()
        else:
            continue
        _record("access.provider_role_given", TENANT_ROLE_GIVEN, user, provider, tenant=tenant, role=role)
        changes += 1
    return changes


def _apply_platform_roles(user, provider: str, wanted: set[str]) -> int:
    grants = {grant.grant: grant for grant in ProviderGrant.objects.select_for_update().filter(user=user)}
    held = set(user.groups.values_list("name", flat=True))
    changes = 0
    for name in sorted(wanted - set(grants)):
        group = Group.objects.filter(name=name).first()
        if group is None:
            continue
        if name not in held:
            user.groups.add(group)
        ProviderGrant.objects.create(user=user, grant=name, provider=provider, held_by_hand=name in held)
        _record("access.provider_role_given", PLATFORM_ROLE_GIVEN, user, provider, role=name)
        changes += 1
    for name, grant in sorted(grants.items()):
        if name == STAFF or name in wanted:
            continue
        if not grant.held_by_hand:
            user.groups.remove(*Group.objects.filter(name=name))
        grant.delete()
        _record("access.provider_role_taken", PLATFORM_ROLE_TAKEN, user, provider, role=name)
        changes += 1
    staff = grants.get(STAFF)
    if wanted and staff is None:
        ProviderGrant.objects.create(user=user, grant=STAFF, provider=provider, held_by_hand=user.is_staff)
        if not user.is_staff:
            user.is_staff = True
            user.save(update_fields=["is_staff"])
    elif not wanted and staff is not None:
        if not staff.held_by_hand and user.is_staff:
            user.is_staff = False
            user.save(update_fields=["is_staff"])
        staff.delete()
    return changes
