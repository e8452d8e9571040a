"""What the platform roles may do with pools: approvers decide requests; operators and finance read."""

from django.db import migrations

from portal.roles import grant_permissions

POOLS_VIEW = [
    "pools.view_poolrequest",
    "pools.view_requestitem",
    "pools.view_pool",
    "pools.view_allocation",
    "pools.view_poolevent",
]


def grant(apps, schema_editor):
    grant_permissions(
        apps,
        {
            "approver": [*POOLS_VIEW, "pools.approve_poolrequest", "pools.change_poolrequest"],
            "operator": POOLS_VIEW,
            "finance": POOLS_VIEW,
        },
    )


class Migration(migrations.Migration):
    dependencies = [("pools", "0003_pools")]

    operations = [migrations.RunPython(grant, migrations.RunPython.noop)]
