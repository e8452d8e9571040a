"""Tenancy: who owns what, and who sees it.

- Tenant: an organisation that pays for GPUs.
- Project: a tenant's unit of work; it owns one Kubernetes namespace, where its
  GPU pools are enforced by a quota.
- Membership: a user's role in a tenant (admin, member, viewer): given by hand in the portal, through a group
  of the person's identity provider, or both (the higher one holds).

Every queryset a tenant user can reach starts from `visible_to(user)`, which is
built on `visible_tenant_ids` — the one place where tenancy is enforced.
"""

from __future__ import annotations

from django.conf import settings
from django.core.exceptions import ValidationError
from django.db import models
from django.utils.translation import gettext_lazy as _

from portal.models.names import (
    DNS_LABEL_PATTERN,
    NAMESPACE_MAX_LENGTH,
    SLUG_MAX_LENGTH,
    dns_label_validator,
    reserved_pattern_of,
    validate_namespace_not_reserved,
    validate_no_control_characters,
)


class Role(models.TextChoices):
    ADMIN = "admin", _("Admin")
    MEMBER = "member", _("Member")
    VIEWER = "viewer", _("Viewer")


# Tenant roles from the least allowed to the most: each may see what those before it see.
ROLE_RANK = (Role.VIEWER, Role.MEMBER, Role.ADMIN)


def roles_at_least(role: str) -> tuple[Role, ...]:
    """`role` and the roles above it, e.g. member and admin for member."""
    return ROLE_RANK[ROLE_RANK.index(Role(role)) :]


def higher_role(*roles: str) -> str:
    """The highest of these roles ("" counts as none), or "" when none is given."""
    given = [Role(role) for role in roles if role]
    return max(given, key=ROLE_RANK.index) if given else ""


def visible_tenant_ids(
    user, *, staff_permission: str = "portal.view_tenant", role: str = Role.VIEWER
) -> models.QuerySet | None:
    """Ids of the tenants `user` may see, or None when the user sees every tenant.

    Superusers, and platform staff who hold `staff_permission` (by default `portal.view_tenant`, which
    approvers, operators and finance hold), see every tenant; anyone else sees the tenants where they
    hold `role` or a higher one (by default: the tenants they belong to). An app narrows what its own
    rows show with both, e.g. finance's `billing.view_invoice` and the admin role for invoices.
    """
    if not user.is_authenticated or not user.is_active:
        return Tenant.objects.none().values("id")
    if user.is_superuser or (user.is_staff and user.has_perm(staff_permission)):
        return None
    return Membership.objects.filter(user=user, role__in=roles_at_least(role)).values("tenant_id")


class TenantQuerySet(models.QuerySet):
    def visible_to(self, user) -> TenantQuerySet:
        ids = visible_tenant_ids(user)
        return self if ids is None else self.filter(id__in=ids)


class Tenant(models.Model):
    name = models.CharField(
        _("name"), max_length=100, unique=True, validators=[validate_no_control_characters]
    )
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

    def clean(self) -> None:
        """A new short name must leave room for namespaces and not reach into another tenant's."""
        if not self.slug or not self._state.adding:
            return
        pattern = reserved_pattern_of(f"{self.slug}-x")
        if pattern:
            message = _("Namespaces matching %(pattern)s are reserved; choose another short name.")
            raise ValidationError({"slug": ValidationError(message, params={"pattern": pattern})})
        if Project.objects.filter(namespace__startswith=f"{self.slug}-").exists():
            message = _("Existing namespaces start with %(prefix)s; choose another short name.")
            raise ValidationError({"slug": ValidationError(message, params={"prefix": f"{self.slug}-"})})


def validate_project_namespace(namespace: str, tenant: Tenant) -> None:
    """A project's namespace is `<tenant short name>-<suffix>`, and the suffix may not make it
    another tenant's: with tenants `acme` and `acme-labs`, `acme-labs-x` is only acme-labs'."""
    prefix = f"{tenant.slug}-"
    if not namespace.startswith(prefix) or len(namespace) == len(prefix):
        message = _("The namespace must start with %(prefix)s (the tenant's short name and a hyphen).")
        raise ValidationError(
            {"namespace": ValidationError(message, code="tenant_prefix", params={"prefix": prefix})}
        )
    parts = namespace.split("-")
    own = len(tenant.slug.split("-"))
    longer = ["-".join(parts[:n]) for n in range(own + 1, len(parts) + 1)]
    if Tenant.objects.filter(slug__in=longer).exclude(pk=tenant.pk).exists():
        message = _("The namespace %(ns)s is reserved for another tenant.")
        raise ValidationError(
            {"namespace": ValidationError(message, code="other_tenant", params={"ns": namespace})}
        )


def namespace_problem(project: Project) -> str | None:
    """Why a project's namespace may not be used (one made before these rules, say), or None."""
    try:
        validate_namespace_not_reserved(project.namespace)
        validate_project_namespace(project.namespace, project.tenant)
    except ValidationError as error:
        return " ".join(error.messages)
    return None


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
    name = models.CharField(_("name"), max_length=100, validators=[validate_no_control_characters])
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

    def clean(self) -> None:
        # Checked when a project is made: a namespace never changes afterwards (its pools live there).
        if self._state.adding and self.tenant_id and self.namespace:
            validate_project_namespace(self.namespace, self.tenant)


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
    # The role in force: the higher of the one given in the portal by hand and the one the person's identity
    # provider gives through a group (portal/sso/roles.py); a sign-in changes only the provider's.
    role = models.CharField(_("role"), max_length=16, choices=Role.choices, default=Role.MEMBER)
    hand_role = models.CharField(
        _("role given by hand"), max_length=16, choices=Role.choices, blank=True, default=""
    )
    provider_role = models.CharField(
        _("role from the identity provider"), max_length=16, choices=Role.choices, blank=True, default=""
    )
    created_at = models.DateTimeField(_("joined"), auto_now_add=True)

    objects = TenantOwnedQuerySet.as_manager()

    class Meta:
        ordering = ["tenant__name", "user__username"]
        verbose_name = _("membership")
        verbose_name_plural = _("memberships")
        constraints = [
            models.UniqueConstraint(fields=["user", "tenant"], name="one_membership_per_tenant"),
            models.CheckConstraint(condition=models.Q(role__in=Role.values), name="membership_role_valid"),
            models.CheckConstraint(
                condition=models.Q(hand_role__in=["", *Role.values])
                & models.Q(provider_role__in=["", *Role.values])
                & ~models.Q(hand_role="", provider_role=""),
                name="membership_role_sources_valid",
            ),
        ]

    def __str__(self) -> str:
        return f"{self.user} @ {self.tenant} ({self.role})"

    def save(self, *args, **kwargs) -> None:
        # Without a role from the identity provider, the role in force is the one given by hand; with one, the
        # higher of the two.
        if not self.provider_role:
            self.hand_role = self.role
        else:
            self.role = higher_role(self.hand_role, self.provider_role)
        update_fields = kwargs.get("update_fields")
        if update_fields is not None and "role" in update_fields:
            kwargs["update_fields"] = {*update_fields, "hand_role", "provider_role", "role"}
        super().save(*args, **kwargs)
