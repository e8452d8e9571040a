"""Platform roles: Django groups whose members are platform staff.

The groups and their permissions are created by data migrations (each app adds
the permissions on its own models), so a fresh database already has them.
"""

from django.db import models
from django.utils.translation import gettext_lazy as _


class PlatformRole(models.TextChoices):
    APPROVER = "approver", _("Approver")
    OPERATOR = "operator", _("Operator")
    FINANCE = "finance", _("Finance")


def grant_permissions(apps, grants: dict[str, list[str]]) -> None:
    """Give each platform group the listed `app_label.codename` permissions.

    For data migrations: creates any permission rows that `post_migrate` has
    not created yet, so it works on a fresh database.
    """
    from django.contrib.auth.management import create_permissions

    for app_config in apps.get_app_configs():
        app_config.models_module = True
        create_permissions(app_config, apps=apps, verbosity=0)
        app_config.models_module = None

    Group = apps.get_model("auth", "Group")
    Permission = apps.get_model("auth", "Permission")
    for group_name, perms in grants.items():
        group, _created = Group.objects.get_or_create(name=group_name)
        for perm in perms:
            app_label, codename = perm.split(".")
            group.permissions.add(
                Permission.objects.get(content_type__app_label=app_label, codename=codename)
            )
