"""An idle pool's alert knows when its idle spell began, and its people are told of it in a notification
of its own kind (`idle`)."""

from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("monitoring", "0007_fault_notices_told"),
    ]

    operations = [
        migrations.AddField(
            model_name="alert",
            name="condition_since",
            field=models.DateTimeField(
                blank=True,
                help_text="When the condition began, where the rule knows it: the first moment of an idle pool.",
                null=True,
                verbose_name="condition since",
            ),
        ),
        migrations.AlterField(
            model_name="delivery",
            name="event",
            field=models.CharField(
                blank=True,
                choices=[("fired", "fired"), ("resolved", "resolved"), ("idle", "idle pool, to its people")],
                max_length=8,
                verbose_name="event",
            ),
        ),
    ]
