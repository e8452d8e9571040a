"""Kept what-if runs; operators and approvers, who see capacity, may read them in the admin too."""

import django.db.models.deletion
from django.conf import settings
from django.db import migrations, models

from portal.roles import grant_permissions


def grant(apps, schema_editor):
    grant_permissions(apps, {"operator": ["pools.view_whatifrun"], "approver": ["pools.view_whatifrun"]})


class Migration(migrations.Migration):
    dependencies = [
        ("pools", "0005_event_reason_data"),
        migrations.swappable_dependency(settings.AUTH_USER_MODEL),
    ]

    operations = [
        migrations.CreateModel(
            name="WhatIfRun",
            fields=[
                (
                    "id",
                    models.BigAutoField(
                        auto_created=True, primary_key=True, serialize=False, verbose_name="ID"
                    ),
                ),
                (
                    "month",
                    models.CharField(
                        help_text="YYYY-MM, in the billing time zone.", max_length=7, verbose_name="month"
                    ),
                ),
                (
                    "cluster",
                    models.CharField(
                        blank=True, help_text="Empty: every cluster.", max_length=63, verbose_name="cluster"
                    ),
                ),
                ("changes", models.JSONField(blank=True, default=list, verbose_name="fleet changes")),
                (
                    "state",
                    models.CharField(
                        choices=[
                            ("queued", "queued"),
                            ("running", "running"),
                            ("done", "done"),
                            ("failed", "failed"),
                        ],
                        default="queued",
                        max_length=16,
                        verbose_name="state",
                    ),
                ),
                (
                    "progress",
                    models.FloatField(default=0.0, help_text="From 0 to 1.", verbose_name="progress"),
                ),
                ("report", models.JSONField(blank=True, null=True, verbose_name="report")),
                ("error", models.TextField(blank=True, verbose_name="why it failed")),
                ("error_data", models.JSONField(blank=True, editable=False, null=True)),
                ("created_at", models.DateTimeField(auto_now_add=True, verbose_name="asked")),
                ("started_at", models.DateTimeField(blank=True, null=True, verbose_name="started")),
                ("finished_at", models.DateTimeField(blank=True, null=True, verbose_name="finished")),
                (
                    "deadline",
                    models.DateTimeField(
                        help_text="Queued or running past it, the run is failed by the sweeper.",
                        verbose_name="deadline",
                    ),
                ),
                (
                    "requested_by",
                    models.ForeignKey(
                        blank=True,
                        null=True,
                        on_delete=django.db.models.deletion.SET_NULL,
                        related_name="+",
                        to=settings.AUTH_USER_MODEL,
                        verbose_name="asked by",
                    ),
                ),
            ],
            options={
                "verbose_name": "what-if run",
                "verbose_name_plural": "what-if runs",
                "ordering": ["-created_at", "-pk"],
                "indexes": [
                    models.Index(
                        condition=models.Q(("state__in", ("queued", "running"))),
                        fields=["deadline"],
                        name="whatif_in_between",
                    )
                ],
                "constraints": [
                    models.CheckConstraint(
                        condition=models.Q(("state__in", ["queued", "running", "done", "failed"])),
                        name="whatif_state_valid",
                    ),
                    models.CheckConstraint(
                        condition=models.Q(("progress__gte", 0), ("progress__lte", 1)),
                        name="whatif_progress_fraction",
                    ),
                    models.CheckConstraint(
                        condition=models.Q(
                            models.Q(("report__isnull", False), ("state", "done")),
                            models.Q(models.Q(("state", "done"), _negated=True), ("report__isnull", True)),
                            _connector="OR",
                        ),
                        name="whatif_report_when_done",
                    ),
                ],
            },
        ),
        migrations.RunPython(grant, migrations.RunPython.noop),
    ]
