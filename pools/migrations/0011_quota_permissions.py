"""Operators and approvers set quotas and the tenants' admission policy, and read them in the admin."""

from django.db import migrations

from portal.roles import grant_permissions

QUOTAS = [
    "pools.add_quota",
    "pools.change_quota",
    "pools.view_quota",
    "pools.add_tenantpolicy",
    "pools.change_tenantpolicy",
    "pools.view_tenantpolicy",
]


def grant(apps, schema_editor):
    grant_permissions(apps, {"operator": QUOTAS, "approver": QUOTAS})


class Migration(migrations.Migration):
    dependencies = [("pools", "0010_quotas_and_reclaim")]

    operations = [migrations.RunPython(grant, migrations.RunPython.noop)]
