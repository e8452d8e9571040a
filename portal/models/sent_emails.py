"""The shell's record of the e-mails sent, so that each is sent once per subject and recipient."""

from __future__ import annotations

from django.db import models
from django.utils import timezone
from django.utils.translation import gettext_lazy as _


class SentEmail(models.Model):
    """One e-mail sent about one thing (`key`, such as "billing.invoice:7") to one address: the record that
    keeps every e-mail of the portal to once per subject and recipient. Written only by
    `portal.mail.send_once`, in the transaction that sends."""

    key = models.CharField(max_length=200)
    address = models.CharField(max_length=254)  # lower-case, so that one person is one address
    sent_at = models.DateTimeField(default=timezone.now)

    class Meta:
        constraints = [models.UniqueConstraint(fields=["key", "address"], name="sent_email_once")]
        verbose_name = _("sent e-mail")
        verbose_name_plural = _("sent e-mails")

    def __str__(self) -> str:
        return f"{self.key} → {self.address}"
