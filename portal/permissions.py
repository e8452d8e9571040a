"""Who may do what: the tenant role checks and the platform staff checks that every app shares.

Tenant roles live on a Membership (admin, member, viewer); platform roles are Django groups
whose model permissions an app names (`pools.approve_poolrequest`, `billing.export_invoice`).
"""

from __future__ import annotations

from django.contrib.auth.models import AbstractBaseUser
from django.utils.translation import gettext as _

from portal.errors import NotAllowed
from portal.models import Membership, Role

# Roles that may ask for GPUs (and so see the request form); viewers only look.
REQUESTING_ROLES = (Role.ADMIN, Role.MEMBER)


def tenant_role(*, user: AbstractBaseUser, tenant_id: int) -> Role | None:
    """The user's role in the tenant, or None when they are not a member."""
    if not user.is_authenticated:
        return None
    role = Membership.objects.filter(user=user, tenant_id=tenant_id).values_list("role", flat=True).first()
    return Role(role) if role else None


# Tenant roles from the least allowed to the most: each may see what those before it see.
ROLE_RANK = (Role.VIEWER, Role.MEMBER, Role.ADMIN)


def holds_tenant_role(*, user: AbstractBaseUser, tenant_slug: str, role: str) -> bool:
    """The user's role in the tenant is `role` or a higher one; a superuser counts as an admin."""
    if not user.is_authenticated:
        return False
    if user.is_superuser:
        return True
    held = (
        Membership.objects.filter(user=user, tenant__slug=tenant_slug).values_list("role", flat=True).first()
    )
    return held is not None and ROLE_RANK.index(Role(held)) >= ROLE_RANK.index(Role(role))


def can_request_pools(*, user: AbstractBaseUser, tenant_id: int) -> bool:
    return tenant_role(user=user, tenant_id=tenant_id) in REQUESTING_ROLES


def is_tenant_admin(*, user: AbstractBaseUser, tenant_id: int) -> bool:
    """An admin of the tenant, or a superuser (who may act for any tenant)."""
    return user.is_superuser or tenant_role(user=user, tenant_id=tenant_id) == Role.ADMIN


def staff_may(*, user: AbstractBaseUser, permission: str) -> bool:
    """Platform staff holding the permission (through their group), e.g. `pools.view_gpucapacity`."""
    return bool(
        user and user.is_authenticated and user.is_active and user.is_staff and user.has_perm(permission)
    )


def require_pool_requester(*, user: AbstractBaseUser, tenant_id: int) -> None:
    if not can_request_pools(user=user, tenant_id=tenant_id):
        raise NotAllowed(_("Viewers cannot request GPUs; ask an admin of your tenant for the member role."))
