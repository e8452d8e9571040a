"""Starting a what-if run is an operator's: operators may add runs, approvers keep reading them."""

from django.db import migrations

from portal.roles import grant_permissions


def grant(apps, schema_editor):
    grant_permissions(apps, {"operator": ["pools.add_whatifrun"]})


class Migration(migrations.Migration):
    dependencies = [("pools", "0006_whatif_runs")]

    operations = [migrations.RunPython(grant, migrations.RunPython.noop)]
