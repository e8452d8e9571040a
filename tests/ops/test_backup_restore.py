"""Backup and restore: scripts/backup dumps the portal's database, scripts/restore brings it back into a
new one, and the restored portal holds the same state and reads it the same way.

Slow (tens of seconds): state is built through the services and committed, then dumped with pg_dump,
restored with pg_restore into new databases (dropped afterwards, whatever happens), and read there by
separate processes with the portal's settings, as a restored portal would read it.
"""

import json
import subprocess
import sys
from datetime import datetime, timedelta
from decimal import Decimal
from uuid import uuid4
from zoneinfo import ZoneInfo

import psycopg
import pytest
from django.conf import settings
from django.db.migrations.loader import MigrationLoader
from django.utils import timezone

from billing.conf import settings as billing_settings
from billing.invoices import close_month, issue
from billing.models import Invoice, InvoiceLine, PriceList, UsageRecord
from billing.services import add_price, meter, save_price_list
from monitoring.storage import samples
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
from portal.models import AuditEntry, TokenStatus
from portal.tokens import issue_token
from tests.conftest import database_address
from tests.factories import AllocationFactory, PoolFactory
from tests.ops.restored import (
    CLUSTER_KEY,
    ROOT,
    backup,
    invoice_facts,
    pdf_text,
    read,
    restore,
    run,
    snapshot,
)

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
OTHER_KEY = "another-key-than-the-one-the-kubeconfig-was-sealed-with"


def previous_month() -> tuple[str, datetime]:
    """The month before this one in the billing time zone ("YYYY-MM") and the moment it ended."""
    local = timezone.localtime(timezone.now(), ZoneInfo(billing_settings.BILLING_TIME_ZONE))
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
        AllocationFactory(pool=pool, gpu=gpu, profile=profile, allocated_at=pool.reserved_at)

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
    meter(now=max(timezone.now(), month_end + timedelta(seconds=billing_settings.METERING_DELAY_SECONDS)))
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
    original_url = database_address(settings.DATABASES["default"]["NAME"])
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
    test_url = database_address(settings.DATABASES["default"]["NAME"])
    current = tmp_path / "current.dump"
    backup(test_url, current)

    missing = database_address(f"{settings.DATABASES['default']['NAME']}_{uuid4().hex[:8]}_absent")
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
    failed = run(["scripts/backup", str(never)], database_address(f"absent_{uuid4().hex[:8]}"))
    assert failed.returncode != 0 and not never.exists() and not (tmp_path / "never.dump.partial").exists()
    garbage = tmp_path / "notes.txt"
    garbage.write_text("not a dump\n")
    done = subprocess.run(
        ["scripts/restore", str(garbage)], cwd=ROOT, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 1 and "is not a dump made by scripts/backup" in done.stderr
