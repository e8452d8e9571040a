"""What the platform roles may do in the pools app.

Operators run capacity (clusters, groups, drains); approvers read capacity and decide pool
requests; finance reads clusters and pools.
"""

from django.db import migrations

from portal.roles import grant_permissions

CAPACITY_VIEW = [
    "pools.view_cluster",
    "pools.view_gpugroup",
    "pools.view_nodecapacity",
    "pools.view_gpucapacity",
    "pools.view_specandcount",
    "pools.view_workloadprofile",
]
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
            "operator": [
                *CAPACITY_VIEW,
                *POOLS_VIEW,
                "pools.add_cluster",
                "pools.change_cluster",
                "pools.add_gpugroup",
                "pools.change_gpugroup",
                "pools.delete_gpugroup",
                "pools.change_nodecapacity",
                "pools.change_gpucapacity",
            ],
            "approver": [
                *CAPACITY_VIEW,
                *POOLS_VIEW,
                "pools.approve_poolrequest",
                "pools.change_poolrequest",
            ],
            "finance": ["pools.view_cluster", *POOLS_VIEW],
        },
    )


class Migration(migrations.Migration):
    dependencies = [
        ("pools", "0001_initial"),
        ("portal", "0002_platform_groups"),
    ]

    operations = [migrations.RunPython(grant, migrations.RunPython.noop)]
