"""The audit trail's rows: one change staff may need to account for, written by `portal.audit`."""

from __future__ import annotations

from django.conf import settings
from django.db import models
from django.utils import timezone
from django.utils.translation import gettext_lazy as _

from portal.models.tenancy import Tenant


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
