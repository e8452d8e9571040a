from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("pools", "0016_dra_binding"),
    ]

    operations = [
        migrations.AddField(
            model_name="cluster",
            name="watch_versions",
            field=models.JSONField(blank=True, default=dict, editable=False, verbose_name="watched from"),
        ),
        migrations.AddField(
            model_name="cluster",
            name="listed_at",
            field=models.DateTimeField(blank=True, editable=False, null=True, verbose_name="last listed"),
        ),
    ]
