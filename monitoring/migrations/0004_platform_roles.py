"""What the platform roles may do in monitoring: operators watch the GPUs, run alerts and agent tokens and
clear GPU faults; approvers see the figures and faults behind their decisions; finance sees nothing here."""

from django.db import migrations

from portal.roles import grant_permissions

WATCH = [
    "monitoring.view_latest",
    "monitoring.view_gpuevent",
    "monitoring.view_collectorstatus",
    "monitoring.view_gpufault",
    "monitoring.view_faultnotice",
]


def grant(apps, schema_editor):
    grant_permissions(
        apps,
        {
            "operator": [
                *WATCH,
                "monitoring.view_alert",
                "monitoring.change_alert",
                "monitoring.view_alertdelivery",
                "monitoring.view_alertrule",
                "monitoring.add_alertrule",
                "monitoring.change_alertrule",
                "monitoring.view_agenttoken",
                "monitoring.add_agenttoken",
                "monitoring.change_agenttoken",
                "monitoring.change_gpufault",
            ],
            "approver": WATCH,
        },
    )


class Migration(migrations.Migration):
    dependencies = [("monitoring", "0003_faults"), ("portal", "0002_platform_groups")]

    operations = [migrations.RunPython(grant, migrations.RunPython.noop)]
