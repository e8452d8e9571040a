"""One notification path for alerts and GPU faults: the alerts' deliveries (renamed Delivery) carry a
fault's e-mails too, each about an alert's event, a fault, or both; a fault says when who hears of it was
recorded (`notified_at`). The faults told before are settled by the next migration."""

import django.db.models.deletion
from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("monitoring", "0005_outbound_address_checks"),
    ]

    operations = [
        migrations.AddField(
            model_name="gpufault",
            name="notified_at",
            field=models.DateTimeField(blank=True, null=True, verbose_name="notified"),
        ),
        migrations.RenameModel(old_name="AlertDelivery", new_name="Delivery"),
        migrations.AlterModelOptions(
            name="delivery",
            options={
                "ordering": ["created_at", "pk"],
                "verbose_name": "notification",
                "verbose_name_plural": "notifications",
            },
        ),
        migrations.AlterField(
            model_name="delivery",
            name="alert",
            field=models.ForeignKey(
                blank=True,
                null=True,
                on_delete=django.db.models.deletion.CASCADE,
                related_name="deliveries",
                to="monitoring.alert",
                verbose_name="alert",
            ),
        ),
        migrations.AlterField(
            model_name="delivery",
            name="event",
            field=models.CharField(
                blank=True,
                choices=[("fired", "fired"), ("resolved", "resolved")],
                max_length=8,
                verbose_name="event",
            ),
        ),
        migrations.AddField(
            model_name="delivery",
            name="fault",
            field=models.ForeignKey(
                blank=True,
                null=True,
                on_delete=django.db.models.deletion.CASCADE,
                related_name="deliveries",
                to="monitoring.gpufault",
                verbose_name="fault",
            ),
        ),
        migrations.AddField(
            model_name="delivery",
            name="fault_pools",
            field=models.JSONField(blank=True, default=list, verbose_name="pools"),
        ),
        migrations.AddField(
            model_name="delivery",
            name="as_approver",
            field=models.BooleanField(default=False, verbose_name="as an approver"),
        ),
        migrations.AddConstraint(
            model_name="delivery",
            constraint=models.UniqueConstraint(
                condition=models.Q(("fault__isnull", False)),
                fields=("fault", "channel", "target"),
                name="fault_delivery_once_per_target",
            ),
        ),
        migrations.AddConstraint(
            model_name="delivery",
            constraint=models.CheckConstraint(
                condition=models.Q(("alert__isnull", False), ("fault__isnull", False), _connector="OR"),
                name="delivery_about_something",
            ),
        ),
        migrations.AddConstraint(
            model_name="delivery",
            constraint=models.CheckConstraint(
                condition=models.Q(
                    models.Q(("alert__isnull", True), ("event", "")),
                    models.Q(("alert__isnull", False), models.Q(("event", ""), _negated=True)),
                    _connector="OR",
                ),
                name="delivery_event_of_its_alert",
            ),
        ),
        migrations.AddConstraint(
            model_name="delivery",
            constraint=models.CheckConstraint(
                condition=models.Q(("fault__isnull", True), ("channel", "email"), _connector="OR"),
                name="fault_delivery_by_email",
            ),
        ),
    ]
