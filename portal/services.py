"""Every change to tenancy: projects, invitations and memberships.

Pages, the API, admin actions and tasks call these functions; each checks the
actor's role, runs in one transaction and raises a `PortalError` the caller
turns into a 4xx.
"""

from __future__ import annotations

from django.contrib.auth import get_user_model
from django.contrib.auth.models import AbstractBaseUser
from django.core.exceptions import ValidationError
from django.db import IntegrityError, transaction
from django.utils import timezone
from django.utils.translation import gettext as _

from portal import dispatch, permissions
from portal.errors import Conflict, InvalidInput, NotAllowed
from portal.models import Invitation, Membership, Project, Role, Tenant, higher_role

# The task that e-mails an invitation (portal/tasks.py), by name: services never import a task module.
INVITATION_EMAIL = "portal.tasks.send_invitation"


def require_tenant_admin(*, user: AbstractBaseUser, tenant: Tenant) -> None:
    if not permissions.is_tenant_admin(user=user, tenant_id=tenant.pk):
        raise NotAllowed(_("Only an admin of %(tenant)s can do this.") % {"tenant": tenant.name})


def _validation_message(error: ValidationError) -> str:
    return " ".join(error.messages)


def create_project(
    *,
    tenant: Tenant,
    actor: AbstractBaseUser,
    slug: str,
    name: str,
    namespace: str = "",
    description: str = "",
) -> Project:
    """Add a project to a tenant; its namespace defaults to `<tenant>-<project>`."""
    require_tenant_admin(user=actor, tenant=tenant)
    project = Project(
        tenant=tenant,
        slug=slug,
        name=name,
        namespace=namespace or Project.default_namespace(tenant.slug, slug),
        description=description,
        created_by=actor,
    )
    try:
        project.full_clean(exclude=["tenant", "created_by"], validate_unique=False)
    except ValidationError as error:
        raise InvalidInput(_validation_message(error)) from error
    if Project.objects.filter(tenant=tenant, slug=slug).exists():
        raise Conflict(
            _("%(tenant)s already has a project %(slug)s.") % {"tenant": tenant.name, "slug": slug}
        )
    if Project.objects.filter(namespace=project.namespace).exists():
        raise Conflict(_("The namespace %(ns)s is already taken.") % {"ns": project.namespace})
    try:
        with transaction.atomic():
            project.save()
    except IntegrityError as error:  # a concurrent request took the slug or namespace
        raise Conflict(_("That project name or namespace was just taken; choose another.")) from error
    return project


def invite_member(
    *, tenant: Tenant, actor: AbstractBaseUser, email: str, role: str = Role.MEMBER
) -> Invitation:
    """Invite someone by e-mail; the e-mail is sent by a Celery task after commit."""
    require_tenant_admin(user=actor, tenant=tenant)
    if role not in Role.values:
        raise InvalidInput(_("Unknown role %(role)s.") % {"role": role})
    invitation = Invitation(tenant=tenant, email=email.strip(), role=role, invited_by=actor)
    try:
        invitation.full_clean(exclude=["tenant", "invited_by"], validate_unique=False)
    except ValidationError as error:
        raise InvalidInput(_validation_message(error)) from error
    email = invitation.email
    if Membership.objects.filter(tenant=tenant, user__email__iexact=email).exists():
        raise Conflict(
            _("%(email)s is already a member of %(tenant)s.") % {"email": email, "tenant": tenant.name}
        )
    with transaction.atomic():
        open_invitations = Invitation.objects.select_for_update().filter(
            tenant=tenant, email__iexact=email, accepted_at__isnull=True, revoked_at__isnull=True
        )
        for previous in open_invitations:
            if previous.is_pending:
                raise Conflict(_("%(email)s has already been invited.") % {"email": email})
            previous.revoked_at = timezone.now()  # expired: make room for the new one
            previous.save(update_fields=["revoked_at"])
        try:
            with transaction.atomic():
                invitation.save()
        except IntegrityError as error:
            raise Conflict(_("%(email)s has already been invited.") % {"email": email}) from error
        dispatch.after_commit(INVITATION_EMAIL, invitation.pk)
    return invitation


def revoke_invitation(*, invitation: Invitation, actor: AbstractBaseUser) -> Invitation:
    require_tenant_admin(user=actor, tenant=invitation.tenant)
    with transaction.atomic():
        invitation = Invitation.objects.select_for_update().get(pk=invitation.pk)
        if not invitation.is_pending:
            raise Conflict(_("This invitation is %(status)s.") % {"status": invitation.status.label})
        invitation.revoked_at = timezone.now()
        invitation.save(update_fields=["revoked_at"])
    return invitation


def verified_emails(user: AbstractBaseUser) -> set[str]:
    """The addresses the user has proved to hold; an address merely typed in proves nothing."""
    from allauth.account.models import EmailAddress

    return {
        e.lower()
        for e in EmailAddress.objects.filter(user=user, verified=True).values_list("email", flat=True)
    }


def verified_owner_exists(*, email: str) -> bool:
    from allauth.account.models import EmailAddress

    return EmailAddress.objects.filter(email__iexact=email, verified=True).exists()


def release_unverified_claims(*, email: str) -> int:
    """Drop every unverified claim on an address whose holder has just proved it (an invitation link).

    Anyone can type someone else's address into their account; until it is verified
    that claim must not keep the real holder from signing up.
    """
    from allauth.account.models import EmailAddress

    User = get_user_model()
    with transaction.atomic():
        dropped, _kinds = EmailAddress.objects.filter(email__iexact=email, verified=False).delete()
        User.objects.filter(email__iexact=email).exclude(
            pk__in=EmailAddress.objects.filter(email__iexact=email, verified=True).values("user_id")
        ).update(email="")
    return dropped


def accept_invitation(*, token: str, user: AbstractBaseUser) -> Membership:
    """Turn a pending invitation into a membership of the user who has verified its address."""
    with transaction.atomic():
        invitation = (
            Invitation.objects.select_for_update().select_related("tenant").filter(token=token).first()
        )
        if invitation is None:
            raise InvalidInput(_("This invitation link is not valid."))
        if not invitation.is_pending:
            raise Conflict(_("This invitation is %(status)s.") % {"status": invitation.status.label})
        if invitation.email.lower() not in verified_emails(user):
            raise NotAllowed(
                _(
                    "This invitation was sent to %(email)s. Sign in with an account that has verified "
                    "that address (Account → E-mail addresses) to accept it."
                )
                % {"email": invitation.email}
            )
        membership, created = Membership.objects.get_or_create(
            user=user, tenant=invitation.tenant, defaults={"role": invitation.role}
        )
        if not created and not membership.hand_role:  # a member only through the identity provider so far
            membership.hand_role = membership.role = invitation.role
            membership.save()
        invitation.accepted_at = timezone.now()
        invitation.accepted_by = user
        invitation.save(update_fields=["accepted_at", "accepted_by"])
    return membership


def _lock_membership(membership: Membership) -> Membership:
    """Lock the tenant first, so that concurrent role changes of one tenant run one by one."""
    Tenant.objects.select_for_update().get(pk=membership.tenant_id)
    return Membership.objects.select_for_update().get(pk=membership.pk)


def _admins_left_after(membership: Membership) -> int:
    others = Membership.objects.filter(tenant_id=membership.tenant_id, role=Role.ADMIN)
    return others.exclude(pk=membership.pk).count()


def set_member_role(*, membership: Membership, actor: AbstractBaseUser, role: str) -> Membership:
    """Change a member's role; a tenant always keeps at least one admin."""
    require_tenant_admin(user=actor, tenant=membership.tenant)
    if role not in Role.values:
        raise InvalidInput(_("Unknown role %(role)s.") % {"role": role})
    with transaction.atomic():
        membership = _lock_membership(membership)
        # The role given by hand; with a role from the identity provider as well, the higher one holds.
        after = higher_role(role, membership.provider_role)
        if membership.role == Role.ADMIN and after != Role.ADMIN and _admins_left_after(membership) == 0:
            raise Conflict(_("A tenant needs at least one admin."))
        membership.hand_role = membership.role = role
        membership.save()
    return membership


def remove_member(*, membership: Membership, actor: AbstractBaseUser) -> None:
    require_tenant_admin(user=actor, tenant=membership.tenant)
    with transaction.atomic():
        membership = _lock_membership(membership)
        if membership.provider_role:
            raise Conflict(
                _(
                    "%(user)s is a member through a group of the identity provider; the sign-ins keep that "
                    "role. Remove them from the group there."
                )
                % {"user": membership.user.get_username()}
            )
        if membership.role == Role.ADMIN and _admins_left_after(membership) == 0:
            raise Conflict(_("A tenant needs at least one admin."))
        membership.delete()
