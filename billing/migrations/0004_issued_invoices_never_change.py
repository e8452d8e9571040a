"""An issued invoice never changes, enforced by PostgreSQL whatever writes to it (admin, API, ORM, SQL):

- an invoice that is not a draft keeps its tenant, month, number, currency, amounts and issue time; its
  state only moves issued → paid or issued → void (with the moment and reason of that move);
- it cannot be deleted;
- the lines of an invoice that is not a draft cannot be added, changed or deleted.
"""

from django.db import migrations

GUARDS = """
CREATE FUNCTION billing_invoice_guard() RETURNS trigger AS $$
BEGIN
    IF TG_OP = 'DELETE' THEN
        IF OLD.state <> 'draft' THEN
            RAISE EXCEPTION 'invoice % is %: it cannot be deleted', OLD.number, OLD.state;
        END IF;
        RETURN OLD;
    END IF;
    IF OLD.state = 'draft' THEN
        RETURN NEW;
    END IF;
    IF (NEW.tenant_id, NEW.month, NEW.currency, NEW.tax_rate, NEW.subtotal, NEW.tax, NEW.total)
            IS DISTINCT FROM (OLD.tenant_id, OLD.month, OLD.currency, OLD.tax_rate, OLD.subtotal, OLD.tax, OLD.total)
        OR NEW.number IS DISTINCT FROM OLD.number
        OR NEW.issued_at IS DISTINCT FROM OLD.issued_at
        OR NEW.created_at IS DISTINCT FROM OLD.created_at THEN
        RAISE EXCEPTION 'invoice % is %: it cannot change; correct it with a credit note', OLD.number, OLD.state;
    END IF;
    IF NEW.state = OLD.state THEN
        IF (NEW.paid_at, NEW.voided_at, NEW.void_reason) IS DISTINCT FROM (OLD.paid_at, OLD.voided_at, OLD.void_reason) THEN
            RAISE EXCEPTION 'invoice % is %: it cannot change', OLD.number, OLD.state;
        END IF;
        RETURN NEW;
    END IF;
    IF OLD.state = 'issued' AND NEW.state IN ('paid', 'void') THEN
        RETURN NEW;
    END IF;
    RAISE EXCEPTION 'invoice % cannot go from % to %', OLD.number, OLD.state, NEW.state;
END
$$ LANGUAGE plpgsql;

CREATE TRIGGER billing_invoice_guard BEFORE UPDATE OR DELETE ON billing_invoice
    FOR EACH ROW EXECUTE FUNCTION billing_invoice_guard();

CREATE FUNCTION billing_invoiceline_guard() RETURNS trigger AS $$
DECLARE
    found text;
BEGIN
    IF TG_OP IN ('UPDATE', 'DELETE') THEN
        SELECT state INTO found FROM billing_invoice WHERE id = OLD.invoice_id;
        IF found IS NOT NULL AND found <> 'draft' THEN
            RAISE EXCEPTION 'the lines of a % invoice cannot change', found;
        END IF;
    END IF;
    IF TG_OP IN ('INSERT', 'UPDATE') THEN
        SELECT state INTO found FROM billing_invoice WHERE id = NEW.invoice_id;
        IF found IS NOT NULL AND found <> 'draft' THEN
            RAISE EXCEPTION 'the lines of a % invoice cannot change', found;
        END IF;
        RETURN NEW;
    END IF;
    RETURN OLD;
END
$$ LANGUAGE plpgsql;

CREATE TRIGGER billing_invoiceline_guard BEFORE INSERT OR UPDATE OR DELETE ON billing_invoiceline
    FOR EACH ROW EXECUTE FUNCTION billing_invoiceline_guard();
"""

UNDO = """
DROP TRIGGER IF EXISTS billing_invoiceline_guard ON billing_invoiceline;
DROP FUNCTION IF EXISTS billing_invoiceline_guard();
DROP TRIGGER IF EXISTS billing_invoice_guard ON billing_invoice;
DROP FUNCTION IF EXISTS billing_invoice_guard();
"""


class Migration(migrations.Migration):
    dependencies = [("billing", "0003_invoices")]

    operations = [migrations.RunSQL(GUARDS, UNDO)]
