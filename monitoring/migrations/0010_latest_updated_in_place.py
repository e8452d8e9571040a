"""The newest figures are updated in place (heap-only tuples): no index on their time, which every upsert
changes, and a third of each page left free for the next version of its rows."""

from django.db import migrations


class Migration(migrations.Migration):
    dependencies = [("monitoring", "0009_trespass")]

    operations = [
        migrations.RemoveIndex(model_name="latest", name="latest_at"),
        migrations.RunSQL(
            "ALTER TABLE monitoring_latest SET (fillfactor = 70)",
            reverse_sql="ALTER TABLE monitoring_latest RESET (fillfactor)",
        ),
    ]
