"""Alert rules and the alerts they raise (the notifications they send: monitoring/models/notifications.py).

- AlertRule: what to watch (a kind, and for thresholds a metric, a comparison and a level), for how long,
  how grave it is, and whom to tell besides the operators.
- Alert: one raising of a rule for one subject (a GPU, an instance, a node, an agent, a pool). It is open
  from `fired_at` until `resolved_at`; an operator may acknowledge it meanwhile. The database allows one open
  alert per (rule, subject), so a rule evaluated twice at once still fires once. An idle pool's alert is
  also its idle spell, which began at `condition_since` (monitoring/selectors/idle.py).
"""

from __future__ import annotations

from django.core.exceptions import ValidationError
from django.core.validators import URLValidator, validate_email
from django.db import models
from django.db.models import Q
from django.utils.translation import gettext_lazy as _

from monitoring.conf import settings
from portal.models import validate_no_control_characters
from portal.outbound import validate_outbound_url


class RuleKind(models.TextChoices):
    THRESHOLD = "threshold", _("metric over a duration")
    ECC = "ecc", _("uncorrected ECC error")
    XID = "xid", _("XID error")
    SILENT_NODE = "silent_node", _("node silent")
    SILENT_AGENT = "silent_agent", _("agent silent")
    IDLE_POOL = "idle_pool", _("billed pool idle")
    TRESPASS = "trespass", _("GPU used by another namespace")


class Severity(models.TextChoices):
    WARNING = "warning", _("warning")
    CRITICAL = "critical", _("critical")


class Comparison(models.TextChoices):
    ABOVE = "above", _("above")
    BELOW = "below", _("below")


class Scope(models.TextChoices):
    GPU = "gpu", _("whole GPU")
    INSTANCE = "instance", _("MIG instance")


# The figures a threshold rule may watch: the sample columns, and memory used as a share of the total.
MEMORY_USED_PCT = "memory_used_pct"
RULE_METRICS = (
    ("power_w", _("power (W)")),
    ("temperature_c", _("temperature (°C)")),
    ("utilisation_pct", _("utilisation (%)")),
    ("sm_active_pct", _("SM activity (%)")),
    ("memory_used_bytes", _("memory used (bytes)")),
    (MEMORY_USED_PCT, _("memory used (%)")),
)


def email_addresses(text: str) -> list[str]:
    """The addresses of a list written one per line or comma."""
    return [a.strip() for a in text.replace(",", "\n").splitlines() if a.strip()]


def validate_email_list(text: str) -> None:
    """Each address of the list is one (each becomes an e-mail's To header)."""
    for address in email_addresses(text):
        try:
            validate_email(address)
        except ValidationError as error:
            raise ValidationError(
                _("%(address)s is not an e-mail address."), code="invalid", params={"address": address}
            ) from error


class AlertRule(models.Model):
    name = models.CharField(
        _("name"), max_length=100, unique=True, validators=[validate_no_control_characters]
    )
    kind = models.CharField(_("kind"), max_length=16, choices=RuleKind.choices)
    metric = models.CharField(_("metric"), max_length=24, choices=RULE_METRICS, blank=True)
    comparison = models.CharField(
        _("comparison"), max_length=8, choices=Comparison.choices, default=Comparison.ABOVE
    )
    threshold = models.FloatField(
        _("threshold"), null=True, blank=True, help_text=_("The level: of the metric, or SM activity (%).")
    )
    scope = models.CharField(_("applies to"), max_length=8, choices=Scope.choices, default=Scope.GPU)
    duration_seconds = models.PositiveIntegerField(
        _("duration (s)"),
        default=300,
        help_text=_(
            "How long the condition must hold before the alert fires; for error rules, how long without "
            "a new error before it resolves; for silence, how long without news."
        ),
    )
    severity = models.CharField(
        _("severity"), max_length=8, choices=Severity.choices, default=Severity.WARNING
    )
    enabled = models.BooleanField(_("enabled"), default=True)
    extra_emails = models.TextField(
        _("also e-mail"),
        blank=True,
        validators=[validate_email_list],
        help_text=_("Addresses besides the operators', one per line or comma."),
    )
    webhook_url = models.URLField(
        _("webhook URL"),
        blank=True,
        validators=[URLValidator(schemes=["http", "https"]), validate_outbound_url],
        help_text=_(
            "Posted to as well as the portal-wide webhook, if any. Only public addresses are accepted "
            "unless the portal's settings allow others."
        ),
    )

    class Meta:
        ordering = ["name"]
        verbose_name = _("alert rule")
        verbose_name_plural = _("alert rules")
        constraints = [
            models.CheckConstraint(
                condition=~Q(kind=RuleKind.THRESHOLD) | (~Q(metric="") & Q(threshold__isnull=False)),
                name="alert_rule_threshold_complete",
            ),
            models.CheckConstraint(
                condition=~Q(kind=RuleKind.IDLE_POOL) | Q(threshold__isnull=False),
                name="alert_rule_idle_level",
            ),
        ]

    def __str__(self) -> str:
        return self.name

    def email_addresses(self) -> list[str]:
        return email_addresses(self.extra_emails)


class AlertQuerySet(models.QuerySet):
    def open(self) -> AlertQuerySet:
        return self.filter(resolved_at__isnull=True)

    def unacknowledged(self) -> AlertQuerySet:
        return self.filter(resolved_at__isnull=True, acknowledged_at__isnull=True)


class Alert(models.Model):
    class State(models.TextChoices):
        OPEN = "open", _("open")
        ACKNOWLEDGED = "acknowledged", _("acknowledged")
        RESOLVED = "resolved", _("resolved")

    rule = models.ForeignKey(
        AlertRule, on_delete=models.CASCADE, related_name="alerts", verbose_name=_("rule")
    )
    subject = models.CharField(
        _("subject key"), max_length=64, help_text=_("What the alert is about, e.g. gpu:12 or pool:3.")
    )
    gpu = models.ForeignKey(
        "pools.GpuCapacity",
        on_delete=models.SET_NULL,
        null=True,
        blank=True,
        related_name="alerts",
        verbose_name=_("GPU"),
    )
    slot = models.SmallIntegerField(_("slot"), null=True, blank=True)
    node = models.ForeignKey(
        "pools.NodeCapacity",
        on_delete=models.SET_NULL,
        null=True,
        blank=True,
        related_name="alerts",
        verbose_name=_("node"),
    )
    pool = models.ForeignKey(
        "pools.Pool",
        on_delete=models.SET_NULL,
        null=True,
        blank=True,
        related_name="alerts",
        verbose_name=_("pool"),
    )
    agent_token = models.ForeignKey(
        "monitoring.AgentToken",
        on_delete=models.SET_NULL,
        null=True,
        blank=True,
        related_name="alerts",
        verbose_name=_("agent"),
    )
    message = models.CharField(_("message"), max_length=500)
    severity = models.CharField(
        _("severity"),
        max_length=8,
        choices=Severity.choices,
        help_text=_("The rule's, or critical where the event is (a fatal XID)."),
    )
    value = models.FloatField(_("value"), null=True, blank=True)
    fired_at = models.DateTimeField(_("fired"))
    condition_since = models.DateTimeField(
        _("condition since"),
        null=True,
        blank=True,
        help_text=_("When the condition began, where the rule knows it: the first moment of an idle pool."),
    )
    last_seen_at = models.DateTimeField(
        _("condition last seen"), help_text=_("When evaluation last found the condition, or the last event.")
    )
    acknowledged_at = models.DateTimeField(_("acknowledged"), null=True, blank=True)
    acknowledged_by = models.ForeignKey(
        settings.AUTH_USER_MODEL,
        on_delete=models.SET_NULL,
        null=True,
        blank=True,
        related_name="+",
        verbose_name=_("acknowledged by"),
    )
    resolved_at = models.DateTimeField(_("resolved"), null=True, blank=True)

    objects = AlertQuerySet.as_manager()

    class Meta:
        ordering = ["-fired_at", "-pk"]
        verbose_name = _("alert")
        verbose_name_plural = _("alerts")
        constraints = [
            models.UniqueConstraint(
                fields=["rule", "subject"],
                condition=Q(resolved_at__isnull=True),
                name="alert_one_open_per_rule_subject",
            ),
            models.CheckConstraint(
                condition=Q(resolved_at__isnull=True) | Q(resolved_at__gte=models.F("fired_at")),
                name="alert_resolved_after_fired",
            ),
        ]
        indexes = [
            models.Index(fields=["-fired_at"], name="alert_fired_at"),
            models.Index(fields=["rule", "subject", "-last_seen_at"], name="alert_rule_subject"),
        ]

    def __str__(self) -> str:
        return f"{self.rule.name}: {self.message}"

    @property
    def state(self) -> str:
        if self.resolved_at is not None:
            return self.State.RESOLVED
        if self.acknowledged_at is not None:
            return self.State.ACKNOWLEDGED
        return self.State.OPEN

    def get_state_display(self) -> str:
        return self.State(self.state).label

    @property
    def where(self) -> str:
        """The subject in words (select_related the subject's rows when listing)."""
        if self.gpu_id is not None and self.gpu is not None:
            gpu = f"{self.gpu.node.cluster.name}/{self.gpu.node.name} GPU {self.gpu.index}"
            return gpu if self.slot is None or self.slot < 0 else f"{gpu}, MIG instance at slice {self.slot}"
        if self.node_id is not None and self.node is not None:
            return f"{self.node.cluster.name}/{self.node.name}"
        if self.pool_id is not None and self.pool is not None:
            return str(_("pool #%(pk)s") % {"pk": self.pool_id})
        if self.agent_token_id is not None and self.agent_token is not None:
            return str(
                _("agent %(name)s") % {"name": f"{self.agent_token.cluster.name}: {self.agent_token.name}"}
            )
        return self.subject
