"""Tenancy: who owns what.

- Tenant: an organisation that pays for GPUs.
- Project: a tenant's unit of work; it owns one Kubernetes namespace, where its
  GPU pools are enforced by a quota.
- Membership: a user's role in a tenant (admin, member, viewer).
- Invitation: a pending membership, sent by e-mail to someone who may not have
  an account yet.

Every queryset a tenant user can reach starts from `visible_to(user)`, which is
built on `visible_tenant_ids` — the one place where tenancy is enforced.
"""

from __future__ import annotations

import secrets
from datetime import timedelta

from django.conf import settings
from django.core.exceptions import ValidationError
from django.core.validators import RegexValidator
from django.db import models
from django.db.models.functions import Lower
from django.utils import timezone
from django.utils.translation import gettext_lazy as _

# A Kubernetes namespace is an RFC 1123 DNS label: at most 63 characters of
# lower-case letters, digits and '-', starting and ending with an alphanumeric.
DNS_LABEL_PATTERN = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$"
dns_label_validator = RegexValidator(
    DNS_LABEL_PATTERN,
    _("Use lower-case letters, digits and hyphens; start and end with a letter or digit."),
    code="dns_label",
)
SLUG_MAX_LENGTH = 30  # two slugs and a hyphen still fit in a 63-character namespace
NAMESPACE_MAX_LENGTH = 63
RESERVED_NAMESPACE_PREFIXES = ("kube-", "openshift-", "gpu-operator", "nvidia-")
RESERVED_NAMESPACES = {"default", "kube-system", "kube-public", "kube-node-lease"}


def validate_namespace_not_reserved(namespace: str) -> None:
    if namespace in RESERVED_NAMESPACES or namespace.startswith(RESERVED_NAMESPACE_PREFIXES):
        raise ValidationError(
            _("The namespace %(ns)s is reserved for the cluster."), code="reserved", params={"ns": namespace}
        )


class Role(models.TextChoices):
    ADMIN = "admin", _("Admin")
    MEMBER = "member", _("Member")
    VIEWER = "viewer", _("Viewer")


def visible_tenant_ids(user) -> models.QuerySet | None:
    """Ids of the tenants `user` may see, or None when the user sees every tenant.

    Platform staff who hold `portal.view_tenant` (approvers, operators, finance)
    and superusers see all tenants; anyone else sees the tenants they belong to.
    """
    if not user.is_authenticated or not user.is_active:
        return Tenant.objects.none().values("id")
    if user.is_superuser or (user.is_staff and user.has_perm("portal.view_tenant")):
        return None
    return Membership.objects.filter(user=user).values("tenant_id")


class TenantQuerySet(models.QuerySet):
    def visible_to(self, user) -> TenantQuerySet:
        ids = visible_tenant_ids(user)
        return self if ids is None else self.filter(id__in=ids)


class Tenant(models.Model):
    name = models.CharField(_("name"), max_length=100, unique=True)
    slug = models.CharField(
        _("slug"),
        max_length=SLUG_MAX_LENGTH,
        unique=True,
        validators=[dns_label_validator],
        help_text=_("Short name used in addresses and namespaces."),
    )
    created_at = models.DateTimeField(_("created"), auto_now_add=True)

    objects = TenantQuerySet.as_manager()

    class Meta:
        ordering = ["name"]
        verbose_name = _("tenant")
        verbose_name_plural = _("tenants")
        constraints = [
            models.CheckConstraint(
                condition=models.Q(slug__regex=DNS_LABEL_PATTERN), name="tenant_slug_dns_label"
            ),
        ]

    def __str__(self) -> str:
        return self.name


class TenantOwnedQuerySet(models.QuerySet):
    """Rows that belong to a tenant through a `tenant` foreign key."""

    def visible_to(self, user):
        ids = visible_tenant_ids(user)
        return self if ids is None else self.filter(tenant_id__in=ids)


class Project(models.Model):
    tenant = models.ForeignKey(
        Tenant, on_delete=models.PROTECT, related_name="projects", verbose_name=_("tenant")
    )
    slug = models.CharField(_("slug"), max_length=SLUG_MAX_LENGTH, validators=[dns_label_validator])
    name = models.CharField(_("name"), max_length=100)
    description = models.TextField(_("description"), blank=True, max_length=2000)
    namespace = models.CharField(
        _("Kubernetes namespace"),
        max_length=NAMESPACE_MAX_LENGTH,
        unique=True,
        validators=[dns_label_validator, validate_namespace_not_reserved],
    )
    created_by = models.ForeignKey(
        settings.AUTH_USER_MODEL,
        on_delete=models.SET_NULL,
        null=True,
        blank=True,
        related_name="+",
        verbose_name=_("created by"),
    )
    created_at = models.DateTimeField(_("created"), auto_now_add=True)

    objects = TenantOwnedQuerySet.as_manager()

    class Meta:
        ordering = ["tenant__name", "name"]
        verbose_name = _("project")
        verbose_name_plural = _("projects")
        constraints = [
            models.UniqueConstraint(fields=["tenant", "slug"], name="project_slug_unique_in_tenant"),
            models.CheckConstraint(
                condition=models.Q(slug__regex=DNS_LABEL_PATTERN), name="project_slug_dns_label"
            ),
            models.CheckConstraint(
                condition=models.Q(namespace__regex=DNS_LABEL_PATTERN),
                name="project_namespace_dns_label",
            ),
        ]

    def __str__(self) -> str:
        return f"{self.tenant.slug}/{self.slug}"

    @staticmethod
    def default_namespace(tenant_slug: str, project_slug: str) -> str:
        return f"{tenant_slug}-{project_slug}"


class Membership(models.Model):
    user = models.ForeignKey(
        settings.AUTH_USER_MODEL,
        on_delete=models.CASCADE,
        related_name="memberships",
        verbose_name=_("user"),
    )
    tenant = models.ForeignKey(
        Tenant, on_delete=models.CASCADE, related_name="memberships", verbose_name=_("tenant")
    )
    role = models.CharField(_("role"), max_length=16, choices=Role.choices, default=Role.MEMBER)
    created_at = models.DateTimeField(_("joined"), auto_now_add=True)

    objects = TenantOwnedQuerySet.as_manager()

    class Meta:
        ordering = ["tenant__name", "user__username"]
        verbose_name = _("membership")
        verbose_name_plural = _("memberships")
        constraints = [
            models.UniqueConstraint(fields=["user", "tenant"], name="one_membership_per_tenant"),
            models.CheckConstraint(condition=models.Q(role__in=Role.values), name="membership_role_valid"),
        ]

    def __str__(self) -> str:
        return f"{self.user} @ {self.tenant} ({self.role})"


def new_invitation_token() -> str:
    return secrets.token_urlsafe(32)


def invitation_expiry():
    return timezone.now() + timedelta(days=settings.INVITATION_VALID_DAYS)


class InvitationStatus(models.TextChoices):
    PENDING = "pending", _("pending")
    ACCEPTED = "accepted", _("accepted")
    REVOKED = "revoked", _("revoked")
    EXPIRED = "expired", _("expired")


class InvitationQuerySet(TenantOwnedQuerySet):
    def pending(self) -> InvitationQuerySet:
        return self.filter(accepted_at__isnull=True, revoked_at__isnull=True, expires_at__gt=timezone.now())


class Invitation(models.Model):
    tenant = models.ForeignKey(
        Tenant, on_delete=models.CASCADE, related_name="invitations", verbose_name=_("tenant")
    )
    email = models.EmailField(_("e-mail"))
    role = models.CharField(_("role"), max_length=16, choices=Role.choices, default=Role.MEMBER)
    token = models.CharField(max_length=64, unique=True, default=new_invitation_token, editable=False)
    invited_by = models.ForeignKey(
        settings.AUTH_USER_MODEL,
        on_delete=models.SET_NULL,
        null=True,
        related_name="+",
        verbose_name=_("invited by"),
    )
    created_at = models.DateTimeField(_("created"), auto_now_add=True)
    expires_at = models.DateTimeField(_("expires"), default=invitation_expiry)
    sent_at = models.DateTimeField(_("sent"), null=True, blank=True)
    accepted_at = models.DateTimeField(_("accepted"), null=True, blank=True)
    accepted_by = models.ForeignKey(
        settings.AUTH_USER_MODEL,
        on_delete=models.SET_NULL,
        null=True,
        blank=True,
        related_name="+",
        verbose_name=_("accepted by"),
    )
    revoked_at = models.DateTimeField(_("revoked"), null=True, blank=True)

    objects = InvitationQuerySet.as_manager()

    class Meta:
        ordering = ["-created_at"]
        verbose_name = _("invitation")
        verbose_name_plural = _("invitations")
        constraints = [
            # One open invitation per address and tenant; accepted or revoked ones are history.
            models.UniqueConstraint(
                "tenant",
                Lower("email"),
                condition=models.Q(accepted_at__isnull=True, revoked_at__isnull=True),
                name="one_open_invitation_per_email",
            ),
            models.CheckConstraint(condition=models.Q(role__in=Role.values), name="invitation_role_valid"),
        ]

    def __str__(self) -> str:
        return f"{self.email} → {self.tenant}"

    @property
    def status(self) -> InvitationStatus:
        if self.accepted_at:
            return InvitationStatus.ACCEPTED
        if self.revoked_at:
            return InvitationStatus.REVOKED
        if self.expires_at <= timezone.now():
            return InvitationStatus.EXPIRED
        return InvitationStatus.PENDING

    @property
    def is_pending(self) -> bool:
        return self.status == InvitationStatus.PENDING


class Preferences(models.Model):
    """A person's choices about the portal itself, e.g. which e-mails they want."""

    user = models.OneToOneField(
        settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="preferences", verbose_name=_("user")
    )
    pool_emails = models.BooleanField(
        _("e-mail me about my GPU requests and pools"),
        default=True,
        help_text=_("Decisions, activation, failure and release."),
    )

    class Meta:
        verbose_name = _("preferences")
        verbose_name_plural = _("preferences")

    def __str__(self) -> str:
        return f"preferences of {self.user}"

    @classmethod
    def wants_pool_emails(cls, user) -> bool:
        found = cls.objects.filter(user=user).values_list("pool_emails", flat=True).first()
        return True if found is None else found
