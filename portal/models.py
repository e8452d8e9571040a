"""Tenancy: who owns what.

- Tenant: an organisation that pays for GPUs.
- Project: a tenant's unit of work; it owns one Kubernetes namespace, where its
  GPU pools are enforced by a quota.
- Membership: a user's role in a tenant (admin, member, viewer).
- Invitation: a pending membership, sent by e-mail to someone who may not have
  an account yet.
- ApiToken: a key a person (or their script) sends as `Authorization: Token <key>`;
  only its SHA-256 digest is stored, and it dies with a password change.

Every queryset a tenant user can reach starts from `visible_to(user)`, which is
built on `visible_tenant_ids` — the one place where tenancy is enforced.
"""

from __future__ import annotations

import fnmatch
import re
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


def reserved_namespace_patterns() -> list[str]:
    """Namespaces no project may have: the cluster's own, its add-ons', and the portal's."""
    return [*settings.RESERVED_NAMESPACES, settings.PORTAL_NAMESPACE]


def reserved_pattern_of(namespace: str) -> str | None:
    return next((p for p in reserved_namespace_patterns() if fnmatch.fnmatchcase(namespace, p)), None)


def validate_namespace_not_reserved(namespace: str) -> None:
    if reserved_pattern_of(namespace):
        raise ValidationError(
            _("The namespace %(ns)s is reserved for the cluster."), code="reserved", params={"ns": namespace}
        )


# Names that end up in e-mail subjects and headers (tenants, projects, alert rules, agents) are one line
# of text: a control character, a line break above all, makes the mail library refuse the whole message.
CONTROL_CHARACTERS = re.compile(r"[\x00-\x1f\x7f-\x9f\u2028\u2029]")


def validate_no_control_characters(value: str) -> None:
    if CONTROL_CHARACTERS.search(value):
        raise ValidationError(
            _("Use no line breaks, tabs or other control characters."), code="control_characters"
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
    """A person's choices about the portal itself, e.g. which e-mails they want.

    E-mail topics are declared by the apps that send them (`portal.shell.EmailTopic`); every topic is on
    until the person turns it off, so a topic added later reaches everyone who has not said otherwise.
    """

    user = models.OneToOneField(
        settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="preferences", verbose_name=_("user")
    )
    emails_off = models.JSONField(
        _("e-mail topics turned off"),
        default=list,
        blank=True,
        help_text=_("Keys of the e-mail topics this person does not want."),
    )
    language = models.CharField(
        _("language of e-mails"),
        max_length=10,
        choices=settings.LANGUAGES,
        blank=True,
        help_text=_("The language the portal writes to this person in; the one they last chose, if any."),
    )

    class Meta:
        verbose_name = _("preferences")
        verbose_name_plural = _("preferences")

    def __str__(self) -> str:
        return f"preferences of {self.user}"

    @classmethod
    def wants_email(cls, user, topic: str) -> bool:
        off = cls.objects.filter(user=user).values_list("emails_off", flat=True).first()
        return topic not in (off or [])


class TokenRevocation(models.TextChoices):
    """Why a token stopped working."""

    BY_OWNER = "owner", _("revoked by its owner")
    BY_STAFF = "staff", _("revoked by platform staff")
    TWO_FACTOR = "two-factor", _("two-factor authentication changed")
    REPLACED = "replaced", _("replaced by newer tokens")


class TokenStatus(models.TextChoices):
    ACTIVE = "active", _("active")
    EXPIRED = "expired", _("expired")
    REVOKED = "revoked", _("revoked")
    PASSWORD_CHANGED = "password-changed", _("password changed")


class ApiToken(models.Model):
    """An API key. The key itself is shown once, when issued; the portal keeps only its digest.

    `credential_stamp` is the owner's session hash at issue time (an HMAC of the
    password hash), so a password change, wherever it happens, ends every token.
    """

    user = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="api_tokens", verbose_name=_("user")
    )
    name = models.CharField(_("name"), max_length=100)
    prefix = models.CharField(_("key starts with"), max_length=8, editable=False)
    digest = models.CharField(max_length=64, unique=True, editable=False)
    credential_stamp = models.CharField(max_length=128, editable=False)
    created_at = models.DateTimeField(_("created"), auto_now_add=True)
    last_used_at = models.DateTimeField(_("last used"), null=True, blank=True)
    expires_at = models.DateTimeField(_("expires"), null=True, blank=True)
    revoked_at = models.DateTimeField(_("revoked"), null=True, blank=True)
    revoked_reason = models.CharField(
        _("why revoked"), max_length=16, choices=TokenRevocation.choices, blank=True
    )

    class Meta:
        ordering = ["-created_at"]
        verbose_name = _("API token")
        verbose_name_plural = _("API tokens")
        constraints = [
            models.CheckConstraint(
                condition=models.Q(revoked_at__isnull=True, revoked_reason="")
                | models.Q(revoked_at__isnull=False, revoked_reason__in=TokenRevocation.values),
                name="api_token_revocation_has_reason",
            ),
        ]

    def __str__(self) -> str:
        return f"{self.prefix}… ({self.name})"

    def status_for(self, current_stamp: str) -> TokenStatus:
        """The token's state, given its owner's current credential stamp."""
        if self.revoked_at:
            return TokenStatus.REVOKED
        if not secrets.compare_digest(self.credential_stamp, current_stamp):
            return TokenStatus.PASSWORD_CHANGED
        if self.expires_at and self.expires_at <= timezone.now():
            return TokenStatus.EXPIRED
        return TokenStatus.ACTIVE

    @property
    def status(self) -> TokenStatus:
        return self.status_for(self.user.get_session_auth_hash())


class AuditEntry(models.Model):
    """One change staff may need to account for: a decision, a provisioning step, a release, a drain, a price
    or an invoice change. Written only by `portal.audit.record`, in the transaction of the change itself.

    `summary` is the English sentence (what the free-text filter searches); `summary_data` keeps its template
    and values, so that each reader sees it in their own language."""

    at = models.DateTimeField(_("when"), default=timezone.now, db_index=True)
    actor = models.ForeignKey(
        settings.AUTH_USER_MODEL,
        on_delete=models.SET_NULL,
        null=True,
        blank=True,
        related_name="+",
        verbose_name=_("who"),
        help_text=_("Empty when the portal itself acted."),
    )
    action = models.CharField(_("action"), max_length=40, db_index=True)
    tenant = models.ForeignKey(
        Tenant,
        on_delete=models.SET_NULL,
        null=True,
        blank=True,
        related_name="+",
        verbose_name=_("tenant"),
    )
    subject_kind = models.CharField(_("subject"), max_length=20, blank=True)
    subject_id = models.CharField(_("subject id"), max_length=40, blank=True)
    summary = models.TextField(_("summary"))
    summary_data = models.JSONField(null=True, blank=True, editable=False)
    details = models.JSONField(_("details"), default=dict, blank=True)

    class Meta:
        ordering = ["-at", "-pk"]
        verbose_name = _("audit entry")
        verbose_name_plural = _("audit entries")
        indexes = [models.Index(fields=["action", "at"], name="audit_action_at")]

    def __str__(self) -> str:
        return f"{self.at:%Y-%m-%d %H:%M} {self.action}"
