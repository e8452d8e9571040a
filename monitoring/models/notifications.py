"""Notifications: one message over one channel (an e-mail, a webhook's POST) to one target, about an event
of an alert (fired or resolved, or an idle pool's alert told to the pool's own people), a GPU fault, or both
at once — the alert a fault's event fired and the fault itself, for a person who hears of both — sent once,
retried with back-off until it is sent or gives up.

A person hears of an alert's event once and of a fault once (two unique constraints), so that a fault whose
event fires an alert makes one e-mail per person, however the two are told. Faults go by e-mail only.
"""

from __future__ import annotations

from django.db import models
from django.db.models import Q
from django.utils.translation import gettext_lazy as _

from monitoring.models.alerts import Alert
from monitoring.models.faults import GpuFault


class Delivery(models.Model):
    class Event(models.TextChoices):
        FIRED = "fired", _("fired")
        RESOLVED = "resolved", _("resolved")
        # An idle pool's alert told to the pool's people (who asked, the tenant's admins), once per spell.
        IDLE = "idle", _("idle pool, to its people")

    class Channel(models.TextChoices):
        EMAIL = "email", _("e-mail")
        WEBHOOK = "webhook", _("webhook")

    alert = models.ForeignKey(
        Alert,
        on_delete=models.CASCADE,
        null=True,
        blank=True,
        related_name="deliveries",
        verbose_name=_("alert"),
    )
    event = models.CharField(_("event"), max_length=8, choices=Event.choices, blank=True)
    fault = models.ForeignKey(
        GpuFault,
        on_delete=models.CASCADE,
        null=True,
        blank=True,
        related_name="deliveries",
        verbose_name=_("fault"),
    )
    # Of a fault: the flagged pools (ids) this person hears of, and whether as an approver (of every pool,
    # with the way to re-place them) or as their tenant's.
    fault_pools = models.JSONField(_("pools"), default=list, blank=True)
    as_approver = models.BooleanField(_("as an approver"), default=False)
    channel = models.CharField(_("channel"), max_length=8, choices=Channel.choices)
    target = models.CharField(_("to"), max_length=500, help_text=_("An e-mail address or a URL."))
    attempts = models.PositiveIntegerField(_("attempts"), default=0)
    next_attempt_at = models.DateTimeField(_("next attempt"), null=True, blank=True)
    sent_at = models.DateTimeField(_("sent"), null=True, blank=True)
    gave_up_at = models.DateTimeField(_("gave up"), null=True, blank=True)
    last_error = models.CharField(_("last error"), max_length=1000, blank=True)
    created_at = models.DateTimeField(_("made"), auto_now_add=True)

    class Meta:
        ordering = ["created_at", "pk"]
        verbose_name = _("notification")
        verbose_name_plural = _("notifications")
        constraints = [
            models.UniqueConstraint(
                fields=["alert", "event", "channel", "target"], name="alert_delivery_once_per_target"
            ),
            models.UniqueConstraint(
                fields=["fault", "channel", "target"],
                condition=Q(fault__isnull=False),
                name="fault_delivery_once_per_target",
            ),
            models.CheckConstraint(
                condition=Q(alert__isnull=False) | Q(fault__isnull=False), name="delivery_about_something"
            ),
            models.CheckConstraint(
                condition=Q(alert__isnull=True, event="") | (Q(alert__isnull=False) & ~Q(event="")),
                name="delivery_event_of_its_alert",
            ),
            models.CheckConstraint(
                condition=Q(fault__isnull=True) | Q(channel="email"), name="fault_delivery_by_email"
            ),
        ]
        indexes = [
            models.Index(
                fields=["next_attempt_at"],
                condition=Q(sent_at__isnull=True, gave_up_at__isnull=True),
                name="alert_delivery_due",
            ),
        ]

    def __str__(self) -> str:
        about = " and ".join(
            part
            for part in (
                f"alert {self.alert_id} {self.event}" if self.alert_id else "",
                f"fault {self.fault_id}" if self.fault_id else "",
            )
            if part
        )
        return f"{about} by {self.channel} to {self.target}"

    @property
    def status(self) -> str:
        if self.sent_at is not None:
            return "sent"
        if self.gave_up_at is not None:
            return "gave up"
        return "pending"
