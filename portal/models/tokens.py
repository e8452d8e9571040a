"""API tokens: a key a person (or their script) sends as `Authorization: Token <key>`; only its SHA-256
digest is stored, and it dies with a password change."""

from __future__ import annotations

import secrets

from django.conf import settings
from django.db import models
from django.utils import timezone
from django.utils.translation import gettext_lazy as _


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
