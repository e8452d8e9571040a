"""Platform roles as groups: approvers, operators and finance see every tenant and project."""

from django.db import migrations

from portal.roles import grant_permissions

TENANCY_VIEW = ["portal.view_tenant", "portal.view_project", "portal.view_membership"]


def create_groups(apps, schema_editor):
    grant_permissions(
        apps,
        {
            "approver": TENANCY_VIEW,
            "operator": TENANCY_VIEW,
            "finance": TENANCY_VIEW,
        },
    )


def delete_groups(apps, schema_editor):
    apps.get_model("auth", "Group").objects.filter(name__in=["approver", "operator", "finance"]).delete()


class Migration(migrations.Migration):
    dependencies = [
        ("portal", "0001_initial"),
        ("auth", "0012_alter_user_first_name_max_length"),
        ("contenttypes", "0002_remove_content_type_name"),
    ]

    operations = [migrations.RunPython(create_groups, delete_groups)]
