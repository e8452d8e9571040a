"""How the backup tests reach a restored database: new databases made and dropped, the scripts run with the
test's secrets, a snapshot of everything a database holds, and what the portal reads from one in a process of
its own."""

import io
import json
import os
import subprocess
import sys
from pathlib import Path

import psycopg
from django.conf import settings
from psycopg import sql

from billing import exports
from billing.models import Invoice
from pools.models import (
    Cluster,
)
from pools.secrets import SecretUnreadable
from pools.services.inventory import sync_inventory
from portal.models import ApiToken
from portal.tokens import token_for_key

ROOT = Path(__file__).resolve().parents[2]
CLUSTER_KEY = "backup-test-cluster-secrets-key-0123456789"


def run(args: list[str], url: str, **env: str) -> subprocess.CompletedProcess:
    """A command of the portal run on the database at `url`, with the test's secrets unless `env` says."""
    environment = {
        **os.environ,
        "DATABASE_URL": url,
        "SECRET_KEY": settings.SECRET_KEY,
        "CLUSTER_SECRETS_KEY": CLUSTER_KEY,
        "DJANGO_SETTINGS_MODULE": "portal.settings",
        **env,
    }
    return subprocess.run(args, cwd=ROOT, env=environment, capture_output=True, text=True, timeout=300)


def backup(url: str, file: Path) -> None:
    done = run(["scripts/backup", str(file)], url)
    assert done.returncode == 0, done.stderr
    assert file.is_file() and not file.with_name(file.name + ".partial").exists()
    assert file.stat().st_mode & 0o077 == 0  # the dump holds password hashes and TOTP secrets


def restore(url: str, file: Path) -> subprocess.CompletedProcess:
    return run(["scripts/restore", str(file)], url)


def snapshot(url: str) -> dict:
    """What the database at `url` holds, as PostgreSQL itself writes it, in an order of its own: every row
    of every table (each as JSON: ids, states, timestamps, amounts), where each sequence stands, the
    partitions of the samples and how many samples each holds, and the schema's constraints, indexes,
    triggers and functions."""
    with psycopg.connect(url) as connection:
        connection.execute("SET TimeZone = 'UTC'")

        def listed(query: str) -> list[str]:
            return sorted(json.dumps(row, default=str) for row in connection.execute(query))

        tables = [
            name
            for (name,) in connection.execute(
                "SELECT relname FROM pg_class WHERE relnamespace = 'public'::regnamespace "
                "AND relkind IN ('r', 'p') AND NOT relispartition"
            )
        ]
        rows = {
            table: sorted(
                text
                for (text,) in connection.execute(
                    sql.SQL("SELECT to_jsonb(t)::text FROM {} t").format(sql.Identifier(table))
                )
            )
            for table in tables
        }
        return {
            "rows": rows,
            "sequences": listed(
                "SELECT sequencename, last_value FROM pg_sequences WHERE schemaname = 'public'"
            ),
            "samples_table": listed("SELECT relkind FROM pg_class WHERE oid = 'monitoring_sample'::regclass"),
            "partitions": listed(
                "SELECT c.relname, pg_get_expr(c.relpartbound, c.oid) FROM pg_inherits i "
                "JOIN pg_class c ON c.oid = i.inhrelid WHERE i.inhparent = 'monitoring_sample'::regclass"
            ),
            "samples_by_partition": listed(
                "SELECT tableoid::regclass::text, count(*) FROM monitoring_sample GROUP BY 1"
            ),
            # A CHECK is compared by name: PostgreSQL writes its expression back with the casts placed
            # otherwise once the dump's text is parsed again (same meaning; the test checks one works).
            "constraints": listed(
                "SELECT conrelid::regclass::text, conname, contype, "
                "CASE WHEN contype = 'c' THEN '' ELSE pg_get_constraintdef(oid) END FROM pg_constraint "
                "WHERE connamespace = 'public'::regnamespace"
            ),
            # Likewise a partial index's predicate: compared by its presence, the rest of it in full.
            "indexes": listed(
                "SELECT tablename, indexname, split_part(indexdef, ' WHERE ', 1), indexdef LIKE '% WHERE %' "
                "FROM pg_indexes WHERE schemaname = 'public'"
            ),
            "triggers": listed(
                "SELECT tgrelid::regclass::text, tgname, pg_get_triggerdef(oid) FROM pg_trigger "
                "WHERE NOT tgisinternal"
            ),
            "functions": listed(
                "SELECT proname, md5(prosrc) FROM pg_proc WHERE pronamespace = 'public'::regnamespace"
            ),
            "extensions": listed("SELECT extname, extversion FROM pg_extension"),
        }


def invoice_facts() -> list[dict]:
    """Every invoice with its totals and lines, as the ORM reads them."""
    return [
        {
            "id": invoice.pk,
            "tenant": invoice.tenant.slug,
            "month": f"{invoice.month:%Y-%m}",
            "number": invoice.number,
            "state": invoice.state,
            "issued_at": invoice.issued_at and invoice.issued_at.isoformat(),
            "amounts": [str(invoice.subtotal), str(invoice.tax), str(invoice.total)],
            "lines": [
                [line.kind, line.project_id, line.gpu_model, line.profile, line.seconds, str(line.amount)]
                for line in invoice.lines.order_by("pk")
            ],
            "lines_add_up": invoice.total == sum(line.amount for line in invoice.lines.all()),
        }
        for invoice in Invoice.objects.select_related("tenant").order_by("pk")
    ]


def pdf_text(invoice: Invoice) -> str:
    from pypdf import PdfReader

    pages = PdfReader(io.BytesIO(exports.as_pdf(invoice))).pages
    return "".join(page.extract_text() for page in pages).replace("\x00", "")  # the CJK font's glyph ids


def read_restored(out: str, api_key: str, sync: bool) -> None:
    """Run by `read` in a process of its own on a restored database: writes to `out` what the portal makes of
    it — the stored kubeconfig, the invoices, the issued one's PDF, the API token and, with `sync`, what a
    sync of the Kubernetes cluster does."""
    cluster = Cluster.objects.get(name="east")
    try:
        kubeconfig = {"text": cluster.kubeconfig()}
    except SecretUnreadable as error:
        kubeconfig = {"error": str(error)}
    token = ApiToken.objects.get(prefix=api_key[:8])
    found = {
        "kubeconfig": kubeconfig,
        "invoices": invoice_facts(),
        "pdf": pdf_text(Invoice.objects.get(state="issued")),
        "token_status": token.status,
        "token_accepted": token_for_key(api_key) is not None,
    }
    if sync:
        report = sync_inventory(cluster=cluster)
        cluster.refresh_from_db()
        found["sync"] = {"ok": report.ok, "error": report.error, "status": cluster.status}
    Path(out).write_text(json.dumps(found))


def read(url: str, out: Path, api_key: str, *, sync: bool = False, **env: str) -> dict:
    code = (
        "import django; django.setup(); from tests.ops.restored import read_restored; "
        f"read_restored({str(out)!r}, {api_key!r}, {sync!r})"
    )
    done = run([sys.executable, "-c", code], url, **env)
    assert done.returncode == 0, done.stderr
    return json.loads(out.read_text())
