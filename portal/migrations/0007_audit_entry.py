"""The audit trail: its table, the right to read it for every platform role, and the entries of the request
and pool events written before it existed."""

import django.db.models.deletion
import django.utils.timezone
from django.conf import settings
from django.db import migrations, models

from portal.roles import grant_permissions

CHUNK = 2000


def grant(apps, schema_editor):
    grant_permissions(
        apps,
        {role: ["portal.view_auditentry"] for role in ("approver", "operator", "finance")},
    )


def entries_from_pool_events(apps, schema_editor):
    """One entry per `pools.PoolEvent` that has none yet, said as a new event's entry says it."""
    from portal.audit import english, pool_event_entry

    PoolEvent = apps.get_model("pools", "PoolEvent")
    AuditEntry = apps.get_model("portal", "AuditEntry")
    # Only the entries of events carry an event id.
    done = set(AuditEntry.objects.filter(details__has_key="event").values_list("details__event", flat=True))
    events = PoolEvent.objects.order_by("pk").values(
        "pk",
        "at",
        "actor_id",
        "request_id",
        "pool_id",
        "from_state",
        "to_state",
        "reason",
        "reason_data",
        "request__project__tenant_id",
    )
    batch = []
    for event in events.iterator(chunk_size=CHUNK):
        if event["pk"] in done:
            continue
        fields = pool_event_entry(
            event_id=event["pk"],
            request_id=event["request_id"],
            pool_id=event["pool_id"],
            from_state=event["from_state"],
            to_state=event["to_state"],
            reason=event["reason"],
            reason_data=event["reason_data"],
        )
        data = {"template": fields["summary"], "params": fields["values"]}
        kind, pk = fields["subject"]
        batch.append(
            AuditEntry(
                at=event["at"],
                actor_id=event["actor_id"],
                action=fields["action"],
                tenant_id=event["request__project__tenant_id"],
                subject_kind=kind,
                subject_id=str(pk),
                summary=english(data),
                summary_data=data,
                details=fields["details"],
            )
        )
        if len(batch) >= CHUNK:
            AuditEntry.objects.bulk_create(batch)
            batch = []
    AuditEntry.objects.bulk_create(batch)


class Migration(migrations.Migration):
    dependencies = [
        ("portal", "0006_preferences_language"),
        ("pools", "0005_event_reason_data"),
        migrations.swappable_dependency(settings.AUTH_USER_MODEL),
    ]

    operations = [
        migrations.CreateModel(
            name="AuditEntry",
            fields=[
                (
                    "id",
                    models.BigAutoField(
                        auto_created=True, primary_key=True, serialize=False, verbose_name="ID"
                    ),
                ),
                (
                    "at",
                    models.DateTimeField(
                        db_index=True, default=django.utils.timezone.now, verbose_name="when"
                    ),
                ),
                ("action", models.CharField(db_index=True, max_length=40, verbose_name="action")),
                ("subject_kind", models.CharField(blank=True, max_length=20, verbose_name="subject")),
                ("subject_id", models.CharField(blank=True, max_length=40, verbose_name="subject id")),
                ("summary", models.TextField(verbose_name="summary")),
                ("summary_data", models.JSONField(blank=True, editable=False, null=True)),
                ("details", models.JSONField(blank=True, default=dict, verbose_name="details")),
                (
                    "actor",
                    models.ForeignKey(
                        blank=True,
                        help_text="Empty when the portal itself acted.",
                        null=True,
                        on_delete=django.db.models.deletion.SET_NULL,
                        related_name="+",
                        to=settings.AUTH_USER_MODEL,
                        verbose_name="who",
                    ),
                ),
                (
                    "tenant",
                    models.ForeignKey(
                        blank=True,
                        null=True,
                        on_delete=django.db.models.deletion.SET_NULL,
                        related_name="+",
                        to="portal.tenant",
                        verbose_name="tenant",
                    ),
                ),
            ],
            options={
                "verbose_name": "audit entry",
                "verbose_name_plural": "audit entries",
                "ordering": ["-at", "-pk"],
                "indexes": [models.Index(fields=["action", "at"], name="audit_action_at")],
            },
        ),
        migrations.RunPython(grant, migrations.RunPython.noop),
        migrations.RunPython(entries_from_pool_events, migrations.RunPython.noop),
    ]
