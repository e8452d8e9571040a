"""What the platform roles may do in billing: finance keeps prices and reads usage; operators read
usage and metered periods (metering lag); approvers read prices."""

from django.db import migrations

from portal.roles import grant_permissions

READ = [
    "billing.view_pricelist",
    "billing.view_price",
    "billing.view_usagerecord",
    "billing.view_meteredperiod",
]


def grant(apps, schema_editor):
    grant_permissions(
        apps,
        {
            "finance": [
                *READ,
                "billing.add_pricelist",
                "billing.change_pricelist",
                "billing.add_price",
                "billing.change_price",
                "billing.delete_price",
            ],
            "operator": READ,
            "approver": ["billing.view_pricelist", "billing.view_price"],
        },
    )


class Migration(migrations.Migration):
    dependencies = [("billing", "0001_initial"), ("portal", "0002_platform_groups")]

    operations = [migrations.RunPython(grant, migrations.RunPython.noop)]
