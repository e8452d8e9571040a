"""Backup and restore: scripts/backup dumps the portal's database, scripts/restore brings it back into a
new one, and the restored portal holds the same state and reads it the same way.

Slow (tens of seconds): state is built through the services and committed, then dumped with pg_dump,
restored with pg_restore into new databases (dropped afterwards, whatever happens), and read there by
separate processes with the portal's settings, as a restored portal would read it.
"""

import io
import json
import os
import subprocess
import sys
from datetime import datetime, timedelta
from decimal import Decimal
from pathlib import Path
from urllib.parse import quote
from uuid import uuid4
from zoneinfo import ZoneInfo

import psycopg
import pytest
from django.conf import settings
from django.db.migrations.loader import MigrationLoader
from django.utils import timezone
from psycopg import sql

from billing import exports
from billing.invoices import close_month, issue
from billing.models import Invoice, InvoiceLine, PriceList, UsageRecord
from billing.services import add_price, meter, save_price_list
from monitoring import samples
from pools.models import (
    Allocation,
    Cluster,
    GpuCapacity,
    Pool,
    PoolEvent,
    PoolRequest,
    PoolState,
    RequestState,
)
from pools.secrets import SecretUnreadable
from pools.services import (
    ClusterSettings,
    admit_waiting,
    approve_request,
    finish_release,
    provision_step,
    register_cluster,
    reject_request,
    release_pool,
    submit_request,
)
from pools.sync import sync_cluster
from portal.models import ApiToken, AuditEntry, TokenStatus
from portal.tokens import issue_token, token_for_key
from tests.factories import AllocationFactory, PoolFactory

ROOT = Path(__file__).resolve().parents[2]
HOUR = timedelta(hours=1)
FLEET = [
    ("h200", 1, "H200-141GB", [{"1g.18gb": 7}, None]),
    ("h100", 1, "H100-80GB", [None] * 4),
]
KUBECONFIG = """apiVersion: v1
kind: Config
clusters: [{name: east, cluster: {server: "https://127.0.0.1:9"}}]
users: [{name: portal, user: {token: backup-test-token}}]
contexts: [{name: east, context: {cluster: east, user: portal}}]
current-context: east
"""
CLUSTER_KEY = "backup-test-cluster-secrets-key-0123456789"
OTHER_KEY = "another-key-than-the-one-the-kubeconfig-was-sealed-with"


def database_url(name: str) -> str:
    """A URL of `name` on the server (and as the user) of the test database."""
    db = settings.DATABASES["default"]
    auth = quote(db["USER"]) + (f":{quote(db['PASSWORD'])}" if db["PASSWORD"] else "")
    return f"postgres://{auth}@{db['HOST'] or '127.0.0.1'}:{db['PORT'] or 5432}/{name}"


@pytest.fixture
def new_database(transactional_db):
    """`new_database()`: the URL of a new, empty database; every one made is dropped after the test."""
    made: list[str] = []
    admin = database_url("postgres")

    def make() -> str:
        name = f"{settings.DATABASES['default']['NAME']}_{uuid4().hex[:8]}"
        with psycopg.connect(admin, autocommit=True) as connection:
            connection.execute(sql.SQL("CREATE DATABASE {} TEMPLATE template0").format(sql.Identifier(name)))
        made.append(name)
        return database_url(name)

    yield make
    with psycopg.connect(admin, autocommit=True) as connection:
        for name in made:
            connection.execute(
                sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name))
            )


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
        report = sync_cluster(cluster=cluster)
        cluster.refresh_from_db()
        found["sync"] = {"ok": report.ok, "error": report.error, "status": cluster.status}
    Path(out).write_text(json.dumps(found))


def read(url: str, out: Path, api_key: str, *, sync: bool = False, **env: str) -> dict:
    code = (
        "import django; django.setup(); from tests.ops.test_backup_restore import read_restored; "
        f"read_restored({str(out)!r}, {api_key!r}, {sync!r})"
    )
    done = run([sys.executable, "-c", code], url, **env)
    assert done.returncode == 0, done.stderr
    return json.loads(out.read_text())


def previous_month() -> tuple[str, datetime]:
    """The month before this one in the billing time zone ("YYYY-MM") and the moment it ended."""
    local = timezone.localtime(timezone.now(), ZoneInfo(settings.BILLING_TIME_ZONE))
    ended = local.replace(day=1, hour=0, minute=0, second=0, microsecond=0)
    return f"{ended - timedelta(days=1):%Y-%m}", ended


def build_state(tenancy, approver, staff_user, synced) -> dict:
    """A portal that has run a while: prices, last month's pools metered and invoiced (one invoice issued),
    today's requests in every state, pools active and released, a Kubernetes cluster with its kubeconfig,
    an API token, GPU samples over two days with their roll-ups."""
    sim = synced(FLEET)
    month, month_end = previous_month()
    finance = staff_user("finance")
    prices = save_price_list(price_list=PriceList(name="standard"), actor=finance)
    for model, profile, hourly in (("H100-80GB", "full", "4200"), ("H200-141GB", "1g.18gb", "900")):
        add_price(
            price_list=prices, gpu_model=model, profile=profile, hourly_price=Decimal(hourly),
            valid_from=month_end - timedelta(days=5), actor=finance,
        )  # fmt: skip

    h100 = GpuCapacity.objects.filter(node__name="h100-1").order_by("index").first()
    mig = GpuCapacity.objects.get(node__name="h200-1", index=0)
    for project, item, gpu, profile, hours in (
        (tenancy.vision, ("h100-80gb.full", 1), h100, "full", (30, 20)),
        (tenancy.recsys, ("h200-141gb.mig-1g.18gb", 1), mig, "1g.18gb", (26, 2)),
    ):
        pool = PoolFactory(
            project=project, cluster=sim, request__items=[item], state=PoolState.RELEASED,
            reserved_at=month_end - hours[0] * HOUR, released_at=month_end - hours[1] * HOUR,
        )  # fmt: skip
        AllocationFactory(pool=pool, gpu=gpu, profile=profile)

    def admitted(project, user, items) -> Pool:
        request = submit_request(project=project, user=user, items=items)
        approve_request(request_id=request.pk, approver=approver)
        admit_waiting()
        pool = Pool.objects.get(request=request)
        provision_step(pool_id=pool.pk)
        return pool

    admitted(tenancy.vision, tenancy.acme_member, [("h100-80gb.full", 2)])
    admitted(tenancy.recsys, tenancy.globex_member, [("h100-80gb.full", 1)])
    released = admitted(tenancy.vision, tenancy.acme_member, [("h200-141gb.mig-1g.18gb", 2)])
    release_pool(pool_id=released.pk, user=tenancy.acme_member)
    finish_release(pool_id=released.pk)
    rejected = submit_request(
        project=tenancy.recsys, user=tenancy.globex_member, items=[("h200-141gb.full", 1)]
    )
    reject_request(request_id=rejected.pk, approver=approver, reason="Inference goes to the other cluster.")
    waiting = submit_request(project=tenancy.vision, user=tenancy.acme_member, items=[("h100-80gb.full", 4)])
    approve_request(request_id=waiting.pk, approver=approver)
    admit_waiting()

    # In the first minute of a month its last period is not due yet; metering it early changes nothing here.
    meter(now=max(timezone.now(), month_end + timedelta(seconds=settings.METERING_DELAY_SECONDS)))
    close_month(month, by=finance)
    issued = issue(invoice_id=Invoice.objects.get(tenant=tenancy.acme).pk, by=finance)
    register_cluster(ClusterSettings(name="east", kubeconfig=KUBECONFIG))
    token = issue_token(user=tenancy.acme_member, name="scripts")

    now = timezone.now()
    rows = [
        samples.Row(gpu.pk, -1, at, power_w=300.0 + gpu.index, temperature_c=61.5, utilisation_pct=88.0)
        for gpu in GpuCapacity.objects.filter(node__cluster=sim)
        for at in (now - timedelta(days=1), now - timedelta(days=1, minutes=5), now - timedelta(minutes=10))
    ]
    samples.store(rows)
    samples.roll_up(now=now)
    return {"issued": issued, "api_key": token.key, "samples": len(rows)}


def test_a_restored_backup_holds_the_same_state_and_the_portal_reads_it_the_same(
    tenancy, approver, staff_user, synced, new_database, tmp_path, settings
):
    settings.CLUSTER_SECRETS_KEY = CLUSTER_KEY
    state = build_state(tenancy, approver, staff_user, synced)
    original_url = database_url(settings.DATABASES["default"]["NAME"])
    original = snapshot(original_url)
    # The state is what the test says it is, so that equal snapshots mean something.
    tables = original["rows"]
    for model in (Pool, Allocation, PoolRequest, PoolEvent, UsageRecord, Invoice, InvoiceLine, AuditEntry):
        assert tables[model._meta.db_table], f"{model.__name__}: no rows to compare"
    assert {json.loads(row)["state"] for row in tables[Pool._meta.db_table]} >= {"active", "released"}
    assert {json.loads(row)["state"] for row in tables[PoolRequest._meta.db_table]} >= {
        RequestState.FULFILLED,
        RequestState.REJECTED,
        RequestState.QUEUED,
    }
    assert {json.loads(row)["state"] for row in tables[Invoice._meta.db_table]} == {"draft", "issued"}
    assert {"invoice.issued", "month.closed", "price.created"} <= {
        json.loads(row)["action"] for row in tables[AuditEntry._meta.db_table]
    }
    assert len(original["partitions"]) >= 2 and original["samples_table"] == ['["p"]']
    assert sum(json.loads(row)[1] for row in original["samples_by_partition"]) == state["samples"]
    facts, pdf = invoice_facts(), pdf_text(state["issued"])
    assert state["issued"].number in pdf and all(invoice["lines_add_up"] for invoice in facts)

    dump = tmp_path / "portal.dump"
    backup(original_url, dump)
    restored_url = new_database()
    done = restore(restored_url, dump)
    assert done.returncode == 0, done.stderr
    assert "every migration is applied" in done.stdout

    restored = snapshot(restored_url)
    for part in original:
        if part == "rows":
            for table, rows in original["rows"].items():
                assert restored["rows"].get(table) == rows, f"table {table} differs after the restore"
        assert restored[part] == original[part], f"{part} differ after the restore"

    found = read(restored_url, tmp_path / "same-keys.json", state["api_key"])
    assert found["kubeconfig"] == {"text": KUBECONFIG}
    assert found["invoices"] == facts
    assert found["pdf"] == pdf
    assert found["token_accepted"] and found["token_status"] == TokenStatus.ACTIVE

    # Another cluster key cannot open the kubeconfig: the portal says so and the sync fails cleanly.
    other = read(
        restored_url, tmp_path / "other-key.json", state["api_key"], sync=True, CLUSTER_SECRETS_KEY=OTHER_KEY
    )
    assert "cannot be decrypted" in other["kubeconfig"]["error"]
    assert other["sync"]["ok"] is False and "cannot be decrypted" in other["sync"]["error"]
    assert other["sync"]["status"] == Cluster.Status.ERROR
    # SECRET_KEY is kept too: API tokens are stamped with an HMAC under it, so another one ends them all,
    # while the kubeconfig, sealed with CLUSTER_SECRETS_KEY, still opens.
    new_secret = read(
        restored_url, tmp_path / "other-secret.json", state["api_key"], SECRET_KEY=OTHER_KEY * 2
    )
    assert new_secret["kubeconfig"] == {"text": KUBECONFIG}
    assert not new_secret["token_accepted"] and new_secret["token_status"] == TokenStatus.PASSWORD_CHANGED

    # The database's own guards came back with it: an issued invoice still cannot change, and a draft
    # still cannot carry a number.
    with psycopg.connect(restored_url) as connection:
        with pytest.raises(psycopg.errors.RaiseException, match="credit note"):
            connection.execute("UPDATE billing_invoice SET total = total + 1 WHERE state = 'issued'")
        connection.rollback()
        with pytest.raises(psycopg.errors.CheckViolation, match="invoice_number_by_state"):
            connection.execute("UPDATE billing_invoice SET number = 'X-1' WHERE state = 'draft'")

    # A database that holds tables is refused, and left as it was.
    before = snapshot(restored_url)
    again = restore(restored_url, dump)
    assert (
        again.returncode == 1 and "already holds" in again.stderr and "nothing was restored" in again.stderr
    )
    assert snapshot(restored_url) == before


def test_a_dump_of_another_release_is_reported_and_migrate_brings_an_older_one_up_to_date(
    new_database, tmp_path
):
    test_url = database_url(settings.DATABASES["default"]["NAME"])
    current = tmp_path / "current.dump"
    backup(test_url, current)

    missing = database_url(f"{settings.DATABASES['default']['NAME']}_{uuid4().hex[:8]}_absent")
    absent = restore(missing, current)
    assert absent.returncode == 1 and "does not answer" in absent.stderr and "createdb" in absent.stderr

    # An older release's database: this one's newest billing migration not applied yet.
    graph = MigrationLoader(None, ignore_no_migrations=True).graph
    (newest,) = graph.leaf_nodes("billing")
    (before,) = [parent for parent in graph.node_map[newest].parents if parent.key[0] == "billing"]
    older_url = new_database()
    assert restore(older_url, current).returncode == 0
    rolled_back = run([sys.executable, "manage.py", "migrate", "billing", before.key[1]], older_url)
    assert rolled_back.returncode == 0, rolled_back.stderr
    older = tmp_path / "older.dump"
    backup(older_url, older)

    upgraded_url = new_database()
    done = restore(upgraded_url, older)
    assert done.returncode == 0, done.stderr
    assert "older release" in done.stdout and f"billing.{newest[1]}" in done.stdout
    assert "manage.py migrate" in done.stdout
    unapplied = run([sys.executable, "manage.py", "migrate", "--check"], upgraded_url)
    assert unapplied.returncode == 1
    migrated = run([sys.executable, "manage.py", "migrate", "--noinput"], upgraded_url)
    assert migrated.returncode == 0, migrated.stderr
    assert run([sys.executable, "manage.py", "migrate", "--check"], upgraded_url).returncode == 0

    # A newer release's dump: restored, but a migration this code does not know is said to need that release.
    with psycopg.connect(upgraded_url) as connection:
        connection.execute(
            "INSERT INTO django_migrations (app, name, applied) VALUES (%s, %s, now())",
            ["billing", "9999_of_a_newer_release"],
        )
    newer = tmp_path / "newer.dump"
    backup(upgraded_url, newer)
    refused = restore(new_database(), newer)
    assert refused.returncode == 1 and "Restored" in refused.stdout
    assert "newer release" in refused.stderr and "billing.9999_of_a_newer_release" in refused.stderr


def test_the_scripts_say_how_to_call_them_and_refuse_what_is_not_a_dump(tmp_path):
    for script in ("scripts/backup", "scripts/restore"):
        for args in ([], ["a", "b"], ["--help"]):
            done = subprocess.run([script, *args], cwd=ROOT, capture_output=True, text=True, timeout=60)
            assert done.returncode == 2 and done.stderr.startswith(f"usage: {script} FILE"), (script, args)
    # A dump that fails leaves no file behind that could pass for a backup.
    never = tmp_path / "never.dump"
    failed = run(["scripts/backup", str(never)], database_url(f"absent_{uuid4().hex[:8]}"))
    assert failed.returncode != 0 and not never.exists() and not (tmp_path / "never.dump.partial").exists()
    garbage = tmp_path / "notes.txt"
    garbage.write_text("not a dump\n")
    done = subprocess.run(
        ["scripts/restore", str(garbage)], cwd=ROOT, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 1 and "is not a dump made by scripts/backup" in done.stderr
