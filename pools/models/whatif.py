"""What-if runs kept for the operators' page: a month of history simulated on today's fleet and on a changed
one (pools/whatif/report.py), asked for on a page, run by a worker, its report kept.

- WhatIfRun: what was asked (month, cluster, fleet changes), who asked and when, how far the worker is, and
  the report once done or why it failed. `queued` and `running` are in between: each has a deadline, past
  which the sweeper fails the run (pools/whatif/runs.py).

States move only through pools/whatif/runs.py, along WHATIF_TRANSITIONS.
"""

from __future__ import annotations

from django.db import models
from django.utils.translation import gettext_lazy as _

from pools.conf import settings


class WhatIfState(models.TextChoices):
    QUEUED = "queued", _("queued")
    RUNNING = "running", _("running")
    DONE = "done", _("done")
    FAILED = "failed", _("failed")


WHATIF_TRANSITIONS: dict[str, set[str]] = {
    WhatIfState.QUEUED: {WhatIfState.RUNNING, WhatIfState.FAILED},
    WhatIfState.RUNNING: {WhatIfState.DONE, WhatIfState.FAILED},
    WhatIfState.DONE: set(),
    WhatIfState.FAILED: set(),
}
# In between: the worker has yet to start or to finish, and a deadline says until when.
WHATIF_IN_BETWEEN = (WhatIfState.QUEUED, WhatIfState.RUNNING)


class WhatIfRun(models.Model):
    month = models.CharField(_("month"), max_length=7, help_text=_("YYYY-MM, in the billing time zone."))
    # A cluster's name, or empty for every cluster (Django's one "no value" for text, rather than two).
    cluster = models.CharField(_("cluster"), max_length=63, blank=True, help_text=_("Empty: every cluster."))
    # [[kind, text], ...]: the changes as asked (kinds add, remove, regroup), applied in this order.
    changes = models.JSONField(_("fleet changes"), default=list, blank=True)
    state = models.CharField(
        _("state"), max_length=16, choices=WhatIfState.choices, default=WhatIfState.QUEUED
    )
    progress = models.FloatField(_("progress"), default=0.0, help_text=_("From 0 to 1."))
    report = models.JSONField(_("report"), null=True, blank=True)
    error = models.TextField(_("why it failed"), blank=True)
    # Where the portal itself wrote why (a deadline missed), the same as its template and values, to show it
    # in the reader's language; a refusal of the run's input is kept in the words it came in.
    error_data = models.JSONField(null=True, blank=True, editable=False)
    requested_by = models.ForeignKey(
        settings.AUTH_USER_MODEL,
        on_delete=models.SET_NULL,
        null=True,
        blank=True,
        related_name="+",
        verbose_name=_("asked by"),
    )
    created_at = models.DateTimeField(_("asked"), auto_now_add=True)
    started_at = models.DateTimeField(_("started"), null=True, blank=True)
    finished_at = models.DateTimeField(_("finished"), null=True, blank=True)
    deadline = models.DateTimeField(
        _("deadline"), help_text=_("Queued or running past it, the run is failed by the sweeper.")
    )

    class Meta:
        ordering = ["-created_at", "-pk"]
        verbose_name = _("what-if run")
        verbose_name_plural = _("what-if runs")
        constraints = [
            models.CheckConstraint(
                condition=models.Q(state__in=WhatIfState.values), name="whatif_state_valid"
            ),
            models.CheckConstraint(
                condition=models.Q(progress__gte=0, progress__lte=1), name="whatif_progress_fraction"
            ),
            # A report exactly when done: a page never shows half of one.
            models.CheckConstraint(
                condition=models.Q(state=WhatIfState.DONE, report__isnull=False)
                | (~models.Q(state=WhatIfState.DONE) & models.Q(report__isnull=True)),
                name="whatif_report_when_done",
            ),
        ]
        indexes = [
            # The sweeper's question: which runs in between are past their deadline.
            models.Index(
                fields=["deadline"],
                condition=models.Q(state__in=WHATIF_IN_BETWEEN),
                name="whatif_in_between",
            ),
        ]

    def __str__(self) -> str:
        return f"what-if #{self.pk} {self.month}"

    @property
    def in_between(self) -> bool:
        return self.state in WHATIF_IN_BETWEEN

    @property
    def cluster_name(self) -> str | None:
        """The cluster as run_whatif takes it: None for every cluster."""
        return self.cluster or None

    @property
    def change_pairs(self) -> list[tuple[str, str]]:
        """The changes as run_whatif takes them: (kind, text) pairs, in order."""
        return [(str(kind), str(text)) for kind, text in self.changes]
