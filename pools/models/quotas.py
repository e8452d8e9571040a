"""Quotas: what the platform guarantees each tenant, and the most it may hold.

- Quota: a tenant's, in one GPU group (the workload type requests name as their purpose; blank for requests
  that name none) and GPU model, in compute slices (a whole GPU counts all seven): `guaranteed` and
  `limit`, the most it may hold borrowing included (empty: no limit). A row with a project is that
  project's limit inside its tenant's, and guarantees nothing. The policy that reads them is
  pools/placement/admission.py; they change only through pools/services/quotas.py, audited.
- TenantPolicy: what platform staff set per tenant of the admission policy: whether a request within the
  tenant's guarantee is approved by the policy itself.
"""

from __future__ import annotations

from django.db import models
from django.utils.translation import gettext_lazy as _


class Quota(models.Model):
    tenant = models.ForeignKey(
        "portal.Tenant", on_delete=models.CASCADE, related_name="gpu_quotas", verbose_name=_("tenant")
    )
    project = models.ForeignKey(
        "portal.Project",
        on_delete=models.CASCADE,
        null=True,
        blank=True,
        related_name="gpu_quotas",
        verbose_name=_("project"),
        help_text=_("Empty: the tenant's quota. A project's is a limit inside the tenant's."),
    )
    group = models.CharField(
        _("GPU group"),
        max_length=40,
        blank=True,
        help_text=_("The workload type; empty for requests without one."),
    )
    gpu_model = models.CharField(_("GPU model"), max_length=32)
    guaranteed = models.PositiveIntegerField(_("guaranteed compute slices"), default=0)
    limit = models.PositiveIntegerField(
        _("limit in compute slices"),
        null=True,
        blank=True,
        help_text=_("Borrowing included; empty: no limit."),
    )
    updated_at = models.DateTimeField(_("changed"), auto_now=True)

    class Meta:
        ordering = ["tenant__slug", "project__slug", "group", "gpu_model"]
        verbose_name = _("quota")
        verbose_name_plural = _("quotas")
        constraints = [
            models.UniqueConstraint(
                fields=["tenant", "group", "gpu_model"],
                condition=models.Q(project__isnull=True),
                name="quota_once_per_tenant",
            ),
            models.UniqueConstraint(
                fields=["project", "group", "gpu_model"],
                condition=models.Q(project__isnull=False),
                name="quota_once_per_project",
            ),
            models.CheckConstraint(
                condition=models.Q(limit__isnull=True) | models.Q(limit__gte=models.F("guaranteed")),
                name="quota_limit_covers_guarantee",
            ),
            models.CheckConstraint(
                condition=models.Q(project__isnull=True) | models.Q(guaranteed=0),
                name="quota_project_guarantees_nothing",
            ),
        ]

    def __str__(self) -> str:
        owner = self.project or self.tenant
        where = f"{self.group}/{self.gpu_model}" if self.group else self.gpu_model
        return f"{owner}: {where} {self.guaranteed}/{'∞' if self.limit is None else self.limit}"


class TenantPolicy(models.Model):
    tenant = models.OneToOneField(
        "portal.Tenant", on_delete=models.CASCADE, related_name="admission_policy", verbose_name=_("tenant")
    )
    auto_approve_within_guarantee = models.BooleanField(
        _("approve automatically within the guarantee"),
        default=False,
        help_text=_("A request within the tenant's guarantee skips the approver, approved by the policy."),
    )
    max_duration_hours = models.PositiveIntegerField(
        _("longest a pool may live, in hours"),
        null=True,
        blank=True,
        help_text=_("Every request must then give an end within this many hours; empty: no end is required."),
    )

    class Meta:
        verbose_name = _("tenant admission policy")
        verbose_name_plural = _("tenant admission policies")

    def __str__(self) -> str:
        return f"{self.tenant}: {'auto' if self.auto_approve_within_guarantee else 'approvers'}"
