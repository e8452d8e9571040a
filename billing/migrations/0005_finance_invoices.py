"""Finance reads, issues, marks paid, voids and exports invoices and keeps billing profiles."""

from django.db import migrations

from portal.roles import grant_permissions


def grant(apps, schema_editor):
    grant_permissions(
        apps,
        {
            "finance": [
                "billing.view_invoice",
                "billing.view_invoiceline",
                "billing.issue_invoice",
                "billing.export_invoice",
                "billing.view_billingprofile",
                "billing.add_billingprofile",
                "billing.change_billingprofile",
            ],
        },
    )


class Migration(migrations.Migration):
    dependencies = [("billing", "0004_issued_invoices_never_change")]

    operations = [migrations.RunPython(grant, migrations.RunPython.noop)]
