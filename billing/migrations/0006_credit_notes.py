"""Credit notes, their own number series, and the record of invoices and credit notes e-mailed.

A credit note never changes and is never deleted, enforced by PostgreSQL whatever writes to it; the
only change allowed is forgetting who issued it when that user is deleted. It credits only an issued or
paid invoice. Finance reads and issues credit notes and reads what was e-mailed.
"""

import django.db.models.deletion
import django.db.models.expressions
from django.conf import settings
from django.db import migrations, models

from portal.roles import grant_permissions

GUARD = """
CREATE FUNCTION billing_creditnote_guard() RETURNS trigger AS $$
DECLARE
    found text;
BEGIN
    IF TG_OP = 'DELETE' THEN
        RAISE EXCEPTION 'credit note % cannot be deleted', OLD.number;
    END IF;
    IF TG_OP = 'UPDATE' THEN
        IF (NEW.id, NEW.invoice_id, NEW.number, NEW.currency, NEW.tax_rate, NEW.subtotal, NEW.tax, NEW.total,
                NEW.reason, NEW.issued_at)
                IS DISTINCT FROM (OLD.id, OLD.invoice_id, OLD.number, OLD.currency, OLD.tax_rate, OLD.subtotal,
                OLD.tax, OLD.total, OLD.reason, OLD.issued_at)
            OR (NEW.issued_by_id IS DISTINCT FROM OLD.issued_by_id AND NEW.issued_by_id IS NOT NULL) THEN
            RAISE EXCEPTION 'credit note % cannot change; issue another one', OLD.number;
        END IF;
        RETURN NEW;
    END IF;
    SELECT state INTO found FROM billing_invoice WHERE id = NEW.invoice_id;
    IF found IS NOT NULL AND found NOT IN ('issued', 'paid') THEN
        RAISE EXCEPTION 'a % invoice cannot be credited', found;
    END IF;
    RETURN NEW;
END
$$ LANGUAGE plpgsql;

CREATE TRIGGER billing_creditnote_guard BEFORE INSERT OR UPDATE OR DELETE ON billing_creditnote
    FOR EACH ROW EXECUTE FUNCTION billing_creditnote_guard();
"""

UNDO = """
DROP TRIGGER IF EXISTS billing_creditnote_guard ON billing_creditnote;
DROP FUNCTION IF EXISTS billing_creditnote_guard();
"""


def grant(apps, schema_editor):
    grant_permissions(
        apps,
        {"finance": ["billing.view_creditnote", "billing.add_creditnote", "billing.view_invoicemail"]},
    )


class Migration(migrations.Migration):
    dependencies = [
        ("billing", "0005_finance_invoices"),
        migrations.swappable_dependency(settings.AUTH_USER_MODEL),
    ]

    operations = [
        migrations.CreateModel(
            name="CreditNote",
            fields=[
                (
                    "id",
                    models.BigAutoField(
                        auto_created=True, primary_key=True, serialize=False, verbose_name="ID"
                    ),
                ),
                ("number", models.CharField(max_length=20, unique=True, verbose_name="number")),
                ("currency", models.CharField(max_length=3, verbose_name="currency")),
                (
                    "tax_rate",
                    models.DecimalField(decimal_places=2, max_digits=5, verbose_name="tax rate (%)"),
                ),
                ("subtotal", models.DecimalField(decimal_places=4, max_digits=14, verbose_name="net amount")),
                ("tax", models.DecimalField(decimal_places=4, max_digits=14, verbose_name="tax")),
                ("total", models.DecimalField(decimal_places=4, max_digits=14, verbose_name="total")),
                ("reason", models.TextField(verbose_name="reason")),
                ("issued_at", models.DateTimeField(verbose_name="issued")),
            ],
            options={
                "verbose_name": "credit note",
                "verbose_name_plural": "credit notes",
                "ordering": ["-issued_at", "-pk"],
            },
        ),
        migrations.CreateModel(
            name="InvoiceMail",
            fields=[
                (
                    "id",
                    models.BigAutoField(
                        auto_created=True, primary_key=True, serialize=False, verbose_name="ID"
                    ),
                ),
                (
                    "recipients",
                    models.TextField(
                        blank=True, help_text="Empty: nobody to send it to.", verbose_name="sent to"
                    ),
                ),
                ("sent_at", models.DateTimeField(verbose_name="sent")),
            ],
            options={
                "verbose_name": "invoice e-mail",
                "verbose_name_plural": "invoice e-mails",
                "ordering": ["-sent_at"],
            },
        ),
        migrations.AddField(
            model_name="invoicesequence",
            name="series",
            field=models.CharField(blank=True, default="", max_length=8, verbose_name="series"),
        ),
        migrations.AlterField(
            model_name="invoicesequence",
            name="year",
            field=models.PositiveSmallIntegerField(verbose_name="year"),
        ),
        migrations.AddConstraint(
            model_name="invoicesequence",
            constraint=models.UniqueConstraint(fields=("series", "year"), name="invoice_sequence_once"),
        ),
        migrations.AddField(
            model_name="creditnote",
            name="invoice",
            field=models.ForeignKey(
                on_delete=django.db.models.deletion.PROTECT,
                related_name="credit_notes",
                to="billing.invoice",
                verbose_name="invoice",
            ),
        ),
        migrations.AddField(
            model_name="creditnote",
            name="issued_by",
            field=models.ForeignKey(
                blank=True,
                null=True,
                on_delete=django.db.models.deletion.SET_NULL,
                related_name="+",
                to=settings.AUTH_USER_MODEL,
                verbose_name="issued by",
            ),
        ),
        migrations.AddField(
            model_name="invoicemail",
            name="credit_note",
            field=models.OneToOneField(
                blank=True,
                null=True,
                on_delete=django.db.models.deletion.PROTECT,
                related_name="mail",
                to="billing.creditnote",
                verbose_name="credit note",
            ),
        ),
        migrations.AddField(
            model_name="invoicemail",
            name="invoice",
            field=models.OneToOneField(
                blank=True,
                null=True,
                on_delete=django.db.models.deletion.PROTECT,
                related_name="mail",
                to="billing.invoice",
                verbose_name="invoice",
            ),
        ),
        migrations.AddConstraint(
            model_name="creditnote",
            constraint=models.CheckConstraint(
                condition=models.Q(("subtotal__gt", 0), ("tax__gte", 0), ("total__gt", 0)),
                name="credit_note_positive",
            ),
        ),
        migrations.AddConstraint(
            model_name="creditnote",
            constraint=models.CheckConstraint(
                condition=models.Q(
                    (
                        "total",
                        django.db.models.expressions.CombinedExpression(
                            models.F("subtotal"), "+", models.F("tax")
                        ),
                    )
                ),
                name="credit_note_total_adds_up",
            ),
        ),
        migrations.AddConstraint(
            model_name="creditnote",
            constraint=models.CheckConstraint(
                condition=models.Q(("reason", ""), _negated=True), name="credit_note_has_reason"
            ),
        ),
        migrations.AddConstraint(
            model_name="invoicemail",
            constraint=models.CheckConstraint(
                condition=models.Q(
                    models.Q(("credit_note__isnull", True), ("invoice__isnull", False)),
                    models.Q(("credit_note__isnull", False), ("invoice__isnull", True)),
                    _connector="OR",
                ),
                name="invoice_mail_of_one_document",
            ),
        ),
        migrations.RunSQL(GUARD, UNDO),
        migrations.RunPython(grant, migrations.RunPython.noop),
    ]
