"""Invitations: a pending membership, sent by e-mail to someone who may not have an account yet."""

from __future__ import annotations

import secrets
from datetime import timedelta

from django.conf import settings
from django.db import models
from django.db.models.functions import Lower
from django.utils import timezone
from django.utils.translation import gettext_lazy as _

from portal.models.tenancy import Role, Tenant, TenantOwnedQuerySet


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
