"""GPU faults: a GPU the portal stopped trusting, from the event that showed it until an operator clears it.

- GpuFault: one per GPU at a time while open (a partial unique constraint), opened by the first fatal event
  (an uncorrected ECC error, a fatal XID, a GPU gone from its host) and closed by an operator after repair.
  `drained_by_portal` says whether opening it drained the GPU, so that clearing it undrains only what the
  portal drained, never an operator's own drain.
  `notified_at` says when who hears of it was recorded (monitoring.notifications), once: until then the
  next alert evaluation records it, with the alert its event fires.
- FaultNotice: a pool that held capacity on the GPU when the fault opened, flagged with the fault in the
  same transaction: what the faults page lists, and what the fault's e-mails tell of.
"""

from __future__ import annotations

from django.db import models
from django.db.models import F, Q
from django.utils.translation import gettext_lazy as _

from monitoring.conf import settings
from monitoring.models.samples import GpuEvent


class GpuFaultQuerySet(models.QuerySet):
    def open(self) -> GpuFaultQuerySet:
        return self.filter(cleared_at__isnull=True)


class GpuFault(models.Model):
    gpu = models.ForeignKey(
        "pools.GpuCapacity", on_delete=models.CASCADE, related_name="faults", verbose_name=_("GPU")
    )
    event = models.ForeignKey(
        "monitoring.GpuEvent",
        on_delete=models.SET_NULL,
        null=True,
        blank=True,
        related_name="+",
        verbose_name=_("event"),
        help_text=_("The event that opened the fault."),
    )
    # What the event said, kept here too: events may be pruned before the fault is cleared.
    kind = models.CharField(_("kind"), max_length=8, choices=GpuEvent.Kind.choices)
    code = models.BigIntegerField(_("code"), null=True, blank=True)
    detail = models.CharField(_("detail"), max_length=500, blank=True)
    at = models.DateTimeField(_("at"))
    drained_by_portal = models.BooleanField(
        _("drained by the portal"), help_text=_("False when the GPU was drained already.")
    )
    notified_at = models.DateTimeField(_("notified"), null=True, blank=True)
    cleared_at = models.DateTimeField(_("cleared"), null=True, blank=True)
    cleared_by = models.ForeignKey(
        settings.AUTH_USER_MODEL,
        on_delete=models.SET_NULL,
        null=True,
        blank=True,
        related_name="+",
        verbose_name=_("cleared by"),
    )

    objects = GpuFaultQuerySet.as_manager()

    class Meta:
        ordering = ["-at", "-pk"]
        verbose_name = _("GPU fault")
        verbose_name_plural = _("GPU faults")
        constraints = [
            models.UniqueConstraint(
                fields=["gpu"], condition=Q(cleared_at__isnull=True), name="gpu_fault_one_open_per_gpu"
            ),
            models.CheckConstraint(
                condition=Q(cleared_at__isnull=True) | Q(cleared_at__gte=F("at")),
                name="gpu_fault_cleared_after_it_began",
            ),
        ]

    def __str__(self) -> str:
        return f"{self.kind} {self.code or ''} on GPU {self.gpu_id} at {self.at:%Y-%m-%d %H:%M:%S}"

    @property
    def is_open(self) -> bool:
        return self.cleared_at is None


class FaultNotice(models.Model):
    fault = models.ForeignKey(
        GpuFault, on_delete=models.CASCADE, related_name="notices", verbose_name=_("fault")
    )
    pool = models.ForeignKey("pools.Pool", on_delete=models.CASCADE, related_name="+", verbose_name=_("pool"))
    flagged_at = models.DateTimeField(_("flagged"))

    class Meta:
        ordering = ["flagged_at", "pk"]
        verbose_name = _("GPU fault notice")
        verbose_name_plural = _("GPU fault notices")
        constraints = [models.UniqueConstraint(fields=["fault", "pool"], name="fault_notice_once_per_pool")]

    def __str__(self) -> str:
        return f"fault {self.fault_id}, pool {self.pool_id}"
