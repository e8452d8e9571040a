"""The kind of rule that watches trespasses, and the rule a portal watches them with."""

from django.db import migrations, models

RULE = {
    "name": "GPU used by another namespace",
    "kind": "trespass",
    "duration_seconds": 60,
    "severity": "critical",
}


def create_rule(apps, schema_editor):
    AlertRule = apps.get_model("monitoring", "AlertRule")
    AlertRule.objects.get_or_create(name=RULE["name"], defaults=RULE)


def remove_rule(apps, schema_editor):
    AlertRule = apps.get_model("monitoring", "AlertRule")
    AlertRule.objects.filter(name=RULE["name"], kind=RULE["kind"]).delete()


class Migration(migrations.Migration):
    dependencies = [
        ("monitoring", "0008_idle_pool_spells"),
        ("pools", "0016_dra_binding"),
    ]

    operations = [
        migrations.AlterField(
            model_name="alertrule",
            name="kind",
            field=models.CharField(
                choices=[
                    ("threshold", "metric over a duration"),
                    ("ecc", "uncorrected ECC error"),
                    ("xid", "XID error"),
                    ("silent_node", "node silent"),
                    ("silent_agent", "agent silent"),
                    ("idle_pool", "billed pool idle"),
                    ("trespass", "GPU used by another namespace"),
                ],
                max_length=16,
                verbose_name="kind",
            ),
        ),
        migrations.RunPython(create_rule, remove_rule),
    ]
