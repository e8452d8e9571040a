"""Alert webhooks reach only addresses the portal may send requests to (portal/outbound.py); names that
go into e-mail subjects (alert rules, agent tokens) hold no control characters; a rule's extra addresses
are e-mail addresses."""

import django.core.validators
from django.db import migrations, models

import monitoring.models.alerts
import portal.models
import portal.outbound


class Migration(migrations.Migration):
    dependencies = [
        ("monitoring", "0004_platform_roles"),
    ]

    operations = [
        migrations.AlterField(
            model_name="agenttoken",
            name="name",
            field=models.CharField(
                help_text="Where the agent runs, e.g. a node.",
                max_length=100,
                validators=[portal.models.validate_no_control_characters],
                verbose_name="name",
            ),
        ),
        migrations.AlterField(
            model_name="alertrule",
            name="extra_emails",
            field=models.TextField(
                blank=True,
                help_text="Addresses besides the operators', one per line or comma.",
                validators=[monitoring.models.alerts.validate_email_list],
                verbose_name="also e-mail",
            ),
        ),
        migrations.AlterField(
            model_name="alertrule",
            name="name",
            field=models.CharField(
                max_length=100,
                unique=True,
                validators=[portal.models.validate_no_control_characters],
                verbose_name="name",
            ),
        ),
        migrations.AlterField(
            model_name="alertrule",
            name="webhook_url",
            field=models.URLField(
                blank=True,
                help_text="Posted to as well as the portal-wide webhook, if any. Only public addresses are accepted unless the portal's settings allow others.",
                validators=[
                    django.core.validators.URLValidator(schemes=["http", "https"]),
                    portal.outbound.validate_outbound_url,
                ],
                verbose_name="webhook URL",
            ),
        ),
    ]
