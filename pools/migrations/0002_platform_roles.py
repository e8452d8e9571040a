"""What the platform roles may do with capacity: operators run it, approvers read it."""

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


def grant(apps, schema_editor):
    grant_permissions(
        apps,
        {
            "operator": [
                *CAPACITY_VIEW,
                "pools.add_cluster",
                "pools.change_cluster",
                "pools.add_gpugroup",
                "pools.change_gpugroup",
                "pools.delete_gpugroup",
                "pools.change_nodecapacity",
                "pools.change_gpucapacity",
            ],
            "approver": CAPACITY_VIEW,
            "finance": ["pools.view_cluster"],
        },
    )


class Migration(migrations.Migration):
    dependencies = [
        ("pools", "0001_initial"),
        ("portal", "0002_platform_groups"),
    ]

    operations = [migrations.RunPython(grant, migrations.RunPython.noop)]
