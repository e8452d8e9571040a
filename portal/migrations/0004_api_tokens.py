"""API tokens kept as digests, revocable; the earlier one-key-per-person table (keys in plain text) goes."""

import django.db.models.deletion
from django.conf import settings
from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("portal", "0003_preferences"),
        migrations.swappable_dependency(settings.AUTH_USER_MODEL),
    ]

    operations = [
        migrations.CreateModel(
            name="ApiToken",
            fields=[
                (
                    "id",
                    models.BigAutoField(
                        auto_created=True, primary_key=True, serialize=False, verbose_name="ID"
                    ),
                ),
                ("name", models.CharField(max_length=100, verbose_name="name")),
                ("prefix", models.CharField(editable=False, max_length=8, verbose_name="key starts with")),
                ("digest", models.CharField(editable=False, max_length=64, unique=True)),
                ("credential_stamp", models.CharField(editable=False, max_length=128)),
                ("created_at", models.DateTimeField(auto_now_add=True, verbose_name="created")),
                ("last_used_at", models.DateTimeField(blank=True, null=True, verbose_name="last used")),
                ("expires_at", models.DateTimeField(blank=True, null=True, verbose_name="expires")),
                ("revoked_at", models.DateTimeField(blank=True, null=True, verbose_name="revoked")),
                (
                    "revoked_reason",
                    models.CharField(
                        blank=True,
                        choices=[
                            ("owner", "revoked by its owner"),
                            ("staff", "revoked by platform staff"),
                            ("two-factor", "two-factor authentication changed"),
                            ("replaced", "replaced by newer tokens"),
                        ],
                        max_length=16,
                        verbose_name="why revoked",
                    ),
                ),
                (
                    "user",
                    models.ForeignKey(
                        on_delete=django.db.models.deletion.CASCADE,
                        related_name="api_tokens",
                        to=settings.AUTH_USER_MODEL,
                        verbose_name="user",
                    ),
                ),
            ],
            options={
                "verbose_name": "API token",
                "verbose_name_plural": "API tokens",
                "ordering": ["-created_at"],
                "constraints": [
                    models.CheckConstraint(
                        condition=models.Q(
                            models.Q(("revoked_at__isnull", True), ("revoked_reason", "")),
                            models.Q(
                                ("revoked_at__isnull", False),
                                ("revoked_reason__in", ["owner", "staff", "two-factor", "replaced"]),
                            ),
                            _connector="OR",
                        ),
                        name="api_token_revocation_has_reason",
                    )
                ],
            },
        ),
        # Keys of the former token table were stored in plain text; none of them may keep working.
        migrations.RunSQL("DROP TABLE IF EXISTS authtoken_token CASCADE", migrations.RunSQL.noop),
    ]
