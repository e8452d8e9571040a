"""The audit trail: each change made through the services leaves exactly one entry (action, actor, tenant),
in the change's transaction, shown in the reader's language; events written before the trail existed
are turned into entries. The staff page and its export: tests/portal/test_audit_page.py."""

from datetime import timedelta
from decimal import Decimal

import pytest
from django.apps import apps as django_apps
from django.urls import reverse
from django.utils import timezone

from billing import invoices
from billing.models import Invoice, Price
from billing.services import add_price, save_price
from monitoring.faults import services as faults
from monitoring.models import GpuFault
from pools.models import GpuCapacity, NodeCapacity, Pool, PoolEvent, PoolRequest
from pools.services import (
    admit_waiting,
    approve_request,
    cancel_request,
    finish_release,
    provision_step,
    reject_request,
    release_pool,
    set_gpu_drained,
    set_node_drained,
    set_priority,
    submit_request,
)
from pools.services.replacement import replace
from portal.errors import Conflict
from portal.models import AuditEntry
from tests.billing.test_invoices import AFTER, november  # noqa: F401 (a fixture)
from tests.factories import PriceListFactory
from tests.monitoring.test_faults import push, report
from tests.pools.test_replacement import active_pool

FLEET = [("h100", 1, "H100-80GB", [None] * 8)]
FULL = [("h100-80gb.full", 1)]


@pytest.fixture
def fleet(synced):
    return synced(FLEET)


def trail(**filters) -> list[tuple]:
    """(action, actor's user name or None, tenant's short name or None), oldest first."""
    return [
        (e.action, e.actor.username if e.actor else None, e.tenant.slug if e.tenant else None)
        for e in AuditEntry.objects.filter(**filters).select_related("actor", "tenant").order_by("at", "pk")
    ]


# --- what is recorded -------------------------------------------------------------------------------------


def test_a_pools_life_is_recorded_step_by_step(fleet, tenancy, approver):
    member = tenancy.acme_member.username
    request = submit_request(project=tenancy.vision, user=tenancy.acme_member, items=FULL)
    approve_request(request_id=request.pk, approver=approver)
    admit_waiting()
    pool = Pool.objects.get(request=request)
    provision_step(pool_id=pool.pk)
    release_pool(pool_id=pool.pk, user=tenancy.acme_member)
    finish_release(pool_id=pool.pk)
    assert trail() == [
        ("request.submitted", member, "acme"),
        ("request.approved", approver.username, "acme"),
        ("request.fulfilled", None, "acme"),
        ("pool.provisioning", None, "acme"),
        ("pool.active", None, "acme"),
        ("pool.releasing", member, "acme"),
        ("pool.released", None, "acme"),
    ]
    # One entry per event, each naming it and its subject.
    assert AuditEntry.objects.count() == PoolEvent.objects.count()
    active = AuditEntry.objects.get(action="pool.active")
    assert (active.subject_kind, active.subject_id) == ("pool", str(pool.pk))
    assert active.summary == f"Pool #{pool.pk} of request #{request.pk}: active"
    assert active.details["event"] == PoolEvent.objects.get(pool=pool, to_state="active").pk


def test_decisions_and_priority_are_recorded_with_the_reason(fleet, tenancy, approver):
    first = submit_request(project=tenancy.vision, user=tenancy.acme_member, items=FULL)
    second = submit_request(project=tenancy.vision, user=tenancy.acme_member, items=FULL)
    AuditEntry.objects.all().delete()
    reject_request(request_id=first.pk, approver=approver, reason="=not this quarter")
    set_priority(request_id=second.pk, approver=approver, priority=7)
    cancel_request(request_id=second.pk, user=tenancy.acme_admin)
    assert trail() == [
        ("request.rejected", approver.username, "acme"),
        ("request.priority", approver.username, "acme"),
        ("request.cancelled", tenancy.acme_admin.username, "acme"),
    ]
    rejected = AuditEntry.objects.get(action="request.rejected")
    assert rejected.summary == f"Request #{first.pk}: rejected (=not this quarter)"
    assert (
        AuditEntry.objects.get(action="request.priority").summary
        == f"Request #{second.pk}: priority set to 7"
    )


def test_a_refused_change_leaves_no_entry(fleet, tenancy, approver):
    request = submit_request(project=tenancy.vision, user=tenancy.acme_member, items=FULL)
    reject_request(request_id=request.pk, approver=approver, reason="no")
    before = AuditEntry.objects.count()
    with pytest.raises(Conflict):
        approve_request(request_id=request.pk, approver=approver)
    assert AuditEntry.objects.count() == before


def test_drains_of_gpus_and_nodes_are_recorded_once(fleet, staff_user):
    operator = staff_user("operator")
    gpu = GpuCapacity.objects.get(node__name="h100-1", index=2)
    node = NodeCapacity.objects.get(name="h100-1")
    set_gpu_drained(gpu=gpu, drained=True, actor=operator)
    set_gpu_drained(gpu=gpu, drained=True, actor=operator)  # no change: no entry
    set_gpu_drained(gpu=gpu, drained=False, actor=operator)
    set_node_drained(node=node, drained=True, actor=operator)
    set_node_drained(node=node, drained=False)
    assert trail() == [
        ("gpu.drained", "staff-operator", None),
        ("gpu.undrained", "staff-operator", None),
        ("node.drained", "staff-operator", None),
        ("node.undrained", None, None),
    ]
    assert AuditEntry.objects.filter(action="gpu.drained").get().summary == "GPU 2 of node h100-1 drained"


def test_the_drain_page_and_the_admin_record_who_drained(fleet, staff_user, client):
    client.force_login(staff_user("operator"))
    gpu = GpuCapacity.objects.get(node__name="h100-1", index=1)
    node = NodeCapacity.objects.get(name="h100-1")
    url = reverse("capacity-gpu-drain", kwargs={"pk": gpu.pk})
    assert client.post(url, {"confirmed": "yes"}).status_code == 302
    assert client.post(url, {"action": "undrain"}).status_code == 302
    admin = reverse("admin:pools_nodecapacity_changelist")
    assert client.post(admin, {"action": "drain", "_selected_action": [node.pk]}).status_code == 302
    assert trail() == [
        ("gpu.drained", "staff-operator", None),
        ("gpu.undrained", "staff-operator", None),
        ("node.drained", "staff-operator", None),
    ]


def test_a_pool_moved_off_a_drained_gpu_is_recorded_as_a_move(fleet, tenancy, approver):
    pool = active_pool(tenancy.vision, tenancy.acme_member, approver, FULL)
    (gpu,) = {a.gpu for a in pool.allocations.filter(released_at=None)}
    set_gpu_drained(gpu=gpu, drained=True)
    AuditEntry.objects.all().delete()
    replace(pool=pool, actor=approver)
    assert trail() == [("pool.moved", approver.username, "acme")]
    assert AuditEntry.objects.get().summary.startswith(f"Pool #{pool.pk} of request #{pool.request_id}: ")


def test_a_fault_drain_is_the_portals_and_clearing_it_the_operators(fleet, staff_user):
    push(fleet, report("h100-1"))
    push(fleet, report("h100-1", seconds=15, g4={"ecc_uncorrected": 2}))
    entry = AuditEntry.objects.get()
    assert (entry.action, entry.actor, entry.details["fault"]) == ("gpu.drained", None, "ecc 2")
    assert "after a fault" in entry.summary
    faults.clear_fault(fault=GpuFault.objects.get(), user=staff_user("operator"))
    assert trail() == [("gpu.drained", None, None), ("gpu.undrained", "staff-operator", None)]


def test_prices_and_price_lists_are_recorded_from_the_services_and_the_admin(db, staff_user, client):
    finance = staff_user("finance")
    price_list = PriceListFactory(name="2027")
    start = timezone.now() + timedelta(days=30)
    price = add_price(
        price_list=price_list, gpu_model="H100-80GB", profile="full", hourly_price=Decimal("4200"),
        valid_from=start, actor=finance,
    )  # fmt: skip
    price.hourly_price = Decimal("4300")
    save_price(price=price, actor=finance)
    changed = AuditEntry.objects.get(action="price.changed")
    assert changed.details["changed"] == {"hourly_price": ["4200.0000", "4300.0000"]}
    assert changed.summary.startswith("Price of H100-80GB full in 2027 changed: 4300 KRW an hour from ")

    client.force_login(finance)
    assert client.post(reverse("admin:billing_pricelist_add"), {"name": "2028"}).status_code == 302
    form = {
        "price_list": price_list.pk,
        "gpu_model": "H100-80GB",
        "profile": "full",
        "hourly_price": "4400",
        "valid_from_0": f"{start:%Y-%m-%d}",
        "valid_from_1": f"{start:%H:%M:%S}",
    }
    assert client.post(reverse("admin:billing_price_change", args=[price.pk]), form).status_code == 302
    delete = reverse("admin:billing_price_delete", args=[price.pk])
    assert client.post(delete, {"post": "yes"}).status_code == 302
    assert not Price.objects.exists()
    assert trail() == [
        ("price.created", "staff-finance", None),
        ("price.changed", "staff-finance", None),
        ("pricelist.created", "staff-finance", None),
        ("price.changed", "staff-finance", None),
        ("price.deleted", "staff-finance", None),
    ]


def test_invoice_changes_and_the_month_close_are_recorded(november, staff_user, client):  # noqa: F811
    finance = staff_user("finance")
    invoices.close_month("2026-11", now=AFTER, by=finance)
    assert trail() == [
        ("invoice.drafted", "staff-finance", "acme"),
        ("invoice.drafted", "staff-finance", "globex"),
        ("month.closed", "staff-finance", None),
    ]
    closed = AuditEntry.objects.get(action="month.closed")
    assert closed.summary == "2026-11 closed: 2 draft(s) made, 0 rebuilt, 0 kept"
    acme, globex = Invoice.objects.order_by("tenant__slug")
    AuditEntry.objects.all().delete()

    client.force_login(finance)
    act = reverse("billing-invoice-act", kwargs={"pk": acme.pk, "act": "issue"})
    assert client.post(act).status_code == 302
    invoices.mark_paid(invoice_id=acme.pk, by=finance)
    invoices.credit(invoice_id=acme.pk, amount=Decimal(10), reason="a GPU was down", by=finance)
    invoices.void(invoice_id=globex.pk, reason="duplicate", by=finance)
    assert trail() == [
        ("invoice.issued", "staff-finance", "acme"),
        ("invoice.paid", "staff-finance", "acme"),
        ("invoice.credited", "staff-finance", "acme"),
        ("invoice.voided", "staff-finance", "globex"),
    ]
    acme.refresh_from_db()
    assert AuditEntry.objects.get(action="invoice.issued").summary.startswith(f"Invoice {acme.number} issued")
    assert AuditEntry.objects.get(action="invoice.voided").summary.endswith(": duplicate")


def test_a_summary_shows_in_the_readers_language(fleet, tenancy, approver, client):
    request = submit_request(project=tenancy.vision, user=tenancy.acme_member, items=FULL)
    approve_request(request_id=request.pk, approver=approver)
    client.force_login(approver)
    english = client.get(reverse("audit"), {"action": "request.approved"}, HTTP_ACCEPT_LANGUAGE="en")
    assert [s for _e, s in english.context["rows"]] == [f"Request #{request.pk}: approved"]
    client.cookies["django_language"] = "ko"
    korean = client.get(reverse("audit"), {"action": "request.approved"}, HTTP_ACCEPT_LANGUAGE="ko")
    (shown,) = [s for _e, s in korean.context["rows"]]
    assert shown == f"요청 #{request.pk}: 승인됨"  # the sentence and the state, both from the catalogue


# --- the entries of older events ---------------------------------------------------------------------------


def test_the_migration_turns_existing_events_into_entries_once(fleet, tenancy, approver):
    from importlib import import_module

    migration = import_module("portal.migrations.0007_audit_entry")
    request = PoolRequest.objects.create(project=tenancy.vision, submitted_by=tenancy.acme_member)
    at = timezone.now() - timedelta(days=40)
    made = PoolEvent.objects.create(request=request, actor=tenancy.acme_member, to_state="submitted")
    decided = PoolEvent.objects.create(
        request=request, actor=approver, from_state="submitted", to_state="rejected", reason="too big"
    )
    noted = PoolEvent.objects.create(
        request=request,
        from_state="submitted",
        to_state="submitted",
        reason="priority set to 3",
        reason_data={"template": "priority set to %(p)s", "params": {"p": 3}},
    )
    PoolEvent.objects.filter(pk=made.pk).update(at=at)
    assert not AuditEntry.objects.exists()

    migration.entries_from_pool_events(django_apps, None)
    migration.entries_from_pool_events(django_apps, None)  # a second run adds nothing
    assert trail() == [
        ("request.submitted", tenancy.acme_member.username, "acme"),
        ("request.rejected", approver.username, "acme"),
        ("request.noted", None, "acme"),
    ]
    first = AuditEntry.objects.get(details__event=made.pk)
    assert first.at == at and first.subject_id == str(request.pk)
    assert (
        AuditEntry.objects.get(details__event=decided.pk).summary
        == f"Request #{request.pk}: rejected (too big)"
    )
    assert (
        AuditEntry.objects.get(details__event=noted.pk).summary == f"Request #{request.pk}: priority set to 3"
    )
