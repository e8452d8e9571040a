"""E-mail preferences become per topic: the pools' on/off choice becomes the topic "pools" turned off."""

from django.db import migrations, models


def to_topics(apps, schema_editor):
    Preferences = apps.get_model("portal", "Preferences")
    Preferences.objects.filter(pool_emails=False).update(emails_off=["pools"])


def to_flag(apps, schema_editor):
    Preferences = apps.get_model("portal", "Preferences")
    Preferences.objects.filter(emails_off__contains=["pools"]).update(pool_emails=False)


class Migration(migrations.Migration):
    dependencies = [("portal", "0004_api_tokens")]

    operations = [
        migrations.AddField(
            model_name="preferences",
            name="emails_off",
            field=models.JSONField(
                blank=True,
                default=list,
                help_text="Keys of the e-mail topics this person does not want.",
                verbose_name="e-mail topics turned off",
            ),
        ),
        migrations.RunPython(to_topics, to_flag),
        migrations.RemoveField(model_name="preferences", name="pool_emails"),
    ]
