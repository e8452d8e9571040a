"""Node agents' tokens: one per agent (or per node), for one cluster, revocable in the admin."""

from __future__ import annotations

from django.db import models
from django.utils.translation import gettext_lazy as _

from monitoring.conf import settings
from portal.models import validate_no_control_characters


class AgentToken(models.Model):
    """The key itself is shown once, when made; the portal keeps only its SHA-256."""

    cluster = models.ForeignKey(
        "pools.Cluster", on_delete=models.CASCADE, related_name="agent_tokens", verbose_name=_("cluster")
    )
    name = models.CharField(
        _("name"),
        max_length=100,
        validators=[validate_no_control_characters],
        help_text=_("Where the agent runs, e.g. a node."),
    )
    prefix = models.CharField(_("key starts with"), max_length=8, editable=False)
    digest = models.CharField(max_length=64, unique=True, editable=False)
    created_by = models.ForeignKey(
        settings.AUTH_USER_MODEL,
        on_delete=models.SET_NULL,
        null=True,
        blank=True,
        related_name="+",
        verbose_name=_("made by"),
    )
    created_at = models.DateTimeField(_("made"), auto_now_add=True)
    last_used_at = models.DateTimeField(_("last used"), null=True, blank=True)
    last_host = models.CharField(_("last host"), max_length=253, blank=True)
    revoked_at = models.DateTimeField(_("revoked"), null=True, blank=True)

    class Meta:
        ordering = ["cluster__name", "name"]
        verbose_name = _("agent token")
        verbose_name_plural = _("agent tokens")

    def __str__(self) -> str:
        return f"{self.cluster.name}: {self.name} ({self.prefix}…)"


class CollectorStatus(models.Model):
    """How the portal's own collection of a cluster's figures went (the simulated fleet, or the cluster's
    Prometheus): shown to operators, so that a collector that fails is seen, not only logged."""

    cluster = models.OneToOneField(
        "pools.Cluster", on_delete=models.CASCADE, related_name="collector_status", verbose_name=_("cluster")
    )
    source = models.CharField(_("source"), max_length=16)
    last_run_at = models.DateTimeField(_("last run"))
    last_success_at = models.DateTimeField(_("last success"), null=True, blank=True)
    last_error = models.TextField(_("last error"), blank=True)
    problems = models.JSONField(_("what was skipped"), default=list, blank=True)
    gpus = models.PositiveIntegerField(_("GPUs read"), default=0)

    class Meta:
        verbose_name = _("collector status")
        verbose_name_plural = _("collector statuses")

    def __str__(self) -> str:
        return f"{self.cluster.name} ({self.source})"
