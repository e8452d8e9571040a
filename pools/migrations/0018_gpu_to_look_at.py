from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("pools", "0017_cluster_watch"),
    ]

    operations = [
        migrations.AddIndex(
            model_name="gpucapacity",
            index=models.Index(
                condition=models.Q(("health", "ok"), _negated=True) | models.Q(("drained", True)),
                fields=["node"],
                name="gpu_to_look_at",
            ),
        ),
    ]
