"""Single sign-on: which groups of an identity provider give which roles, and the platform roles a provider
gave a person.

- GroupRole: a group the provider names in its group claim, and a role it gives: a tenant role written
  `tenant:<slug>:<admin|member|viewer>`, or a platform group (`approver`, `operator`, `finance`). Kept by the
  platform in the admin. `provider` narrows it to one provider ("" for every provider).
- ProviderGrant: a platform group (or staff status, `staff`) a person holds because their provider said so at
  their last sign-in, and whether they held it already by hand when it was granted (then a later sign-in
  that no longer grants it leaves it). Tenant roles from a provider live on the membership itself
  (`Membership.provider_role`).
"""

from __future__ import annotations

from django.conf import settings
from django.core.exceptions import ValidationError
from django.db import models
from django.utils.translation import gettext_lazy as _

from portal.models.tenancy import Role, Tenant
from portal.roles import PlatformRole

STAFF = "staff"  # the grant of staff status that comes with a platform group


def parse_role(role: str) -> tuple[str, str]:
    """A mapped role as (tenant slug, tenant role) or ("", platform group); ValueError when it is neither."""
    parts = role.strip().split(":")
    if len(parts) == 1 and parts[0] in PlatformRole.values:
        return "", parts[0]
    if len(parts) == 2 and parts[0] == "platform" and parts[1] in PlatformRole.values:
        return "", parts[1]
    if len(parts) == 3 and parts[0] == "tenant" and parts[1] and parts[2] in Role.values:
        return parts[1], parts[2]
    raise ValueError(role)


class GroupRole(models.Model):
    provider = models.CharField(
        _("provider"),
        max_length=64,
        blank=True,
        default="",
        help_text=_("The provider's id as configured (e.g. oidc); empty for every provider."),
    )
    group = models.CharField(
        _("group"), max_length=255, help_text=_("A value of the provider's group claim, as it sends it.")
    )
    role = models.CharField(
        _("role"),
        max_length=150,
        help_text=_(
            "tenant:<short name>:admin, tenant:<short name>:member, tenant:<short name>:viewer, "
            "approver, operator or finance."
        ),
    )
    created_at = models.DateTimeField(_("created"), auto_now_add=True)

    class Meta:
        ordering = ["provider", "group", "role"]
        verbose_name = _("group role")
        verbose_name_plural = _("group roles")
        constraints = [
            models.UniqueConstraint(fields=["provider", "group", "role"], name="group_role_unique"),
        ]

    def __str__(self) -> str:
        return f"{self.group} → {self.role}"

    def clean(self) -> None:
        try:
            slug, _role = parse_role(self.role)
        except ValueError:
            raise ValidationError(
                {
                    "role": _(
                        "Write a tenant role as tenant:<short name>:admin, :member or :viewer, or name a "
                        "platform group: approver, operator or finance."
                    )
                }
            ) from None
        if slug and not Tenant.objects.filter(slug=slug).exists():
            raise ValidationError({"role": _("No tenant has the short name %(slug)s.") % {"slug": slug}})


class ProviderGrant(models.Model):
    user = models.ForeignKey(
        settings.AUTH_USER_MODEL,
        on_delete=models.CASCADE,
        related_name="provider_grants",
        verbose_name=_("user"),
    )
    grant = models.CharField(_("grant"), max_length=32)  # a platform group, or STAFF
    provider = models.CharField(_("provider"), max_length=64)
    held_by_hand = models.BooleanField(_("held by hand as well"), default=False)
    granted_at = models.DateTimeField(_("granted"), auto_now_add=True)

    class Meta:
        ordering = ["user", "grant"]
        verbose_name = _("grant from an identity provider")
        verbose_name_plural = _("grants from identity providers")
        constraints = [models.UniqueConstraint(fields=["user", "grant"], name="provider_grant_unique")]

    def __str__(self) -> str:
        return f"{self.user}: {self.grant} ({self.provider})"
