"""Who may do what: the tenant role checks and the platform staff checks that every app shares.

Tenant roles live on a Membership (admin, member, viewer); platform roles are Django groups
whose model permissions an app names (`pools.approve_poolrequest`, `billing.export_invoice`).
"""

from __future__ import annotations

from django.contrib.auth import get_user_model
from django.contrib.auth.models import AbstractBaseUser
from django.db.models import QuerySet
from django.http import Http404
from django.utils.translation import gettext as _

from portal.errors import NotAllowed
from portal.models import Membership, Role, roles_at_least

# Roles that may ask for GPUs (and so see the request form); viewers only look.
REQUESTING_ROLES = (Role.ADMIN, Role.MEMBER)


def tenant_role(*, user: AbstractBaseUser, tenant_id: int) -> Role | None:
    """The user's role in the tenant, or None when they are not a member."""
    if not user.is_authenticated:
        return None
    role = Membership.objects.filter(user=user, tenant_id=tenant_id).values_list("role", flat=True).first()
    return Role(role) if role else None


def tenant_roles(*, user: AbstractBaseUser) -> dict[int, Role]:
    """Tenant id → the user's role there, for each tenant they belong to."""
    if not user.is_authenticated:
        return {}
    return {
        tenant_id: Role(role)
        for tenant_id, role in Membership.objects.filter(user=user).values_list("tenant_id", "role")
    }


def holds_tenant_role(*, user: AbstractBaseUser, tenant_slug: str, role: str) -> bool:
    """The user's role in the tenant is `role` or a higher one (ROLE_RANK); a superuser counts as an admin."""
    if not user.is_authenticated:
        return False
    if user.is_superuser:
        return True
    held = Membership.objects.filter(user=user, tenant__slug=tenant_slug, role__in=roles_at_least(role))
    return held.exists()


def can_request_pools(*, user: AbstractBaseUser, tenant_id: int) -> bool:
    return tenant_role(user=user, tenant_id=tenant_id) in REQUESTING_ROLES


def acts_as_tenant_admin(*, user: AbstractBaseUser, role: Role | None) -> bool:
    """Whether a user holding `role` in a tenant (None: not a member) acts as its admin: its admins do,
    and superusers, who may act for any tenant."""
    return user.is_superuser or role == Role.ADMIN


def is_tenant_admin(*, user: AbstractBaseUser, tenant_id: int) -> bool:
    """An admin of the tenant, or a superuser (who may act for any tenant)."""
    return acts_as_tenant_admin(user=user, role=tenant_role(user=user, tenant_id=tenant_id))


def tenant_admins(*, tenant_id: int) -> QuerySet:
    """The tenant's admins whose accounts are active, by user name: those who speak for the tenant."""
    return (
        get_user_model()
        .objects.filter(memberships__tenant_id=tenant_id, memberships__role=Role.ADMIN, is_active=True)
        .order_by(get_user_model().USERNAME_FIELD)
    )


def platform_staff(*, role: str) -> QuerySet:
    """The active platform staff in the platform group `role` (`portal.roles.PlatformRole`), by id: those an
    app tells of what their role watches (operators of alerts, approvers of faults)."""
    return (
        get_user_model()
        .objects.filter(is_active=True, is_staff=True, groups__name=role)
        .distinct()
        .order_by("pk")
    )


def staff_may(*, user: AbstractBaseUser, permission: str) -> bool:
    """Platform staff holding the permission (through their group), e.g. `pools.view_gpucapacity`."""
    return bool(
        user and user.is_authenticated and user.is_active and user.is_staff and user.has_perm(permission)
    )


def require_staff(*, user: AbstractBaseUser, permission: str) -> None:
    """Platform staff's pages do not exist for anyone else: a 404, as tenants are to learn nothing."""
    if not staff_may(user=user, permission=permission):
        raise Http404


def require_any_staff(*, user: AbstractBaseUser, permissions: tuple[str, ...]) -> None:
    """Pages shared by several kinds of staff (approvers and operators, say): a 404 for anyone holding none
    of `permissions`."""
    if not any(staff_may(user=user, permission=permission) for permission in permissions):
        raise Http404


def require_staff_action(*, user: AbstractBaseUser, permission: str, refusal: str) -> None:
    """An action only platform staff holding `permission` take (decide a request, start a what-if run): anyone
    else is refused (403) with `refusal`, which says who may."""
    if not staff_may(user=user, permission=permission):
        raise NotAllowed(refusal)


def made_it_or_administers(*, user: AbstractBaseUser, made_by_id: int | None, tenant_id: int) -> bool:
    """Whether the user made the thing (`made_by_id`, e.g. who asked for a pool request) or is an admin of
    its tenant: those who may withdraw it or give it back."""
    return made_by_id == user.pk or is_tenant_admin(user=user, tenant_id=tenant_id)


def require_pool_requester(*, user: AbstractBaseUser, tenant_id: int) -> None:
    if not can_request_pools(user=user, tenant_id=tenant_id):
        raise NotAllowed(_("Viewers cannot request GPUs; ask an admin of your tenant for the member role."))
