"""Quotas where people see them: the operators' and approvers' quotas page (guarantees against capacity, who
is short, a form for a row, approval by policy), the tenant page (quotas, borrowed pools, a pool under
notice), the pool page's notice, the request form's verdict before sending, and the approver's page."""

import pytest

from pools.models import GpuCapacity, Pool, PoolRequest, PoolState, Quota, TenantPolicy
from pools.services import admit_waiting, approve_request, submit_request
from pools.services.provisioning import provision_step
from pools.services.quotas import set_quota

H100 = "H100-80GB"


def admitted(project, person, approver, count) -> Pool:
    request = submit_request(project=project, user=person, items=[("h100-80gb.full", count)])
    approve_request(request_id=request.pk, approver=approver)
    admit_waiting()
    pool = Pool.objects.get(request=request)
    provision_step(pool_id=pool.pk)
    return Pool.objects.get(pk=pool.pk)


def test_the_quotas_page_shows_guarantees_against_capacity_and_who_is_short(
    fleet, tenancy, operator, client_for
):
    set_quota(actor=operator, tenant=tenancy.acme, gpu_model=H100, guaranteed=35, limit=None)
    set_quota(actor=operator, tenant=tenancy.globex, gpu_model=H100, guaranteed=21)
    GpuCapacity.objects.filter(model=H100, index__in=[0, 1, 2]).update(drained=True)
    page = client_for(operator).get("/capacity/quotas/")
    assert page.status_code == 200
    text = page.content.decode()
    section = text[text.index('id="guarantees"') :]
    assert "35" in section and "56" in section and "Acme (0 / 35)" in section and "Globex (0 / 21)" in section
    assert '<span class="badge bad">21</span>' in section  # 56 guaranteed, 35 in service


def test_the_quotas_page_reads_what_pools_hold_once(fleet, tenancy, operator, approver, client_for):
    """The guarantees and the quota rows both come from one ledger of every tenant's live pools."""
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    set_quota(actor=operator, tenant=tenancy.acme, gpu_model=H100, guaranteed=14, limit=None)
    held = admitted(tenancy.vision, tenancy.acme_member, approver, 3)
    client = client_for(operator)
    client.get("/capacity/quotas/")
    with CaptureQueriesContext(connection) as reads:
        page = client.get("/capacity/quotas/").content.decode()
    per_pool = 'SELECT "pools_allocation"."pool_id"'  # what each live pool holds: the ledger's one read
    assert sum(query["sql"].startswith(per_pool) for query in reads.captured_queries) == 1
    assert held.state == PoolState.ACTIVE and "21" in page  # acme holds 3 whole GPUs


def test_what_pools_hold_is_read_once_per_capacity_version_and_follows_each_admission(
    settings, fleet, tenancy, operator, approver, client_for
):
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    from pools.selectors.quotas import quota_rows

    settings.CAPACITY_PICTURE_SECONDS = 300
    set_quota(actor=operator, tenant=tenancy.acme, gpu_model=H100, guaranteed=14, limit=None)
    client = client_for(operator)
    client.get("/capacity/quotas/")
    with CaptureQueriesContext(connection) as reads:
        client.get("/capacity/quotas/")
    assert not any(query["sql"].startswith('SELECT "pools_allocation"') for query in reads.captured_queries)
    assert [row["held"] for row in quota_rows([tenancy.acme.pk])] == [0]

    admitted(tenancy.vision, tenancy.acme_member, approver, 3)  # under the capacity lock: a new version
    assert [(row["held"], row["borrowed"]) for row in quota_rows([tenancy.acme.pk])] == [(21, 7)]


def test_operators_set_a_quota_through_the_page_and_bad_input_changes_nothing(
    fleet, tenancy, operator, client_for
):
    client = client_for(operator)
    bad = client.post(
        "/capacity/quotas/set/", {"tenant": "acme", "gpu_model": H100, "guaranteed": 14, "limit": 7}
    )
    assert bad.status_code == 400 and "below the guarantee" in bad.content.decode()
    assert not Quota.objects.exists()
    made = client.post(
        "/capacity/quotas/set/", {"tenant": "acme", "gpu_model": H100, "guaranteed": 14, "no_limit": "on"}
    )
    assert made.status_code == 302
    quota = Quota.objects.get()
    assert (quota.guaranteed, quota.limit) == (14, None)
    unknown = client.post(
        "/capacity/quotas/set/", {"tenant": "acme", "project": "nowhere", "gpu_model": H100, "limit": 7}
    )
    assert unknown.status_code == 400 and "has no project nowhere" in unknown.content.decode()


def test_approvers_turn_approval_by_policy_on_and_off(fleet, tenancy, approver, client_for):
    client = client_for(approver)
    assert client.post("/capacity/quotas/acme/auto-approve/", {"on": "1"}).status_code == 302
    assert TenantPolicy.objects.get(tenant=tenancy.acme).auto_approve_within_guarantee
    assert "approved by the policy" in client.get("/capacity/quotas/").content.decode()
    client.post("/capacity/quotas/acme/auto-approve/", {"on": "0"})
    assert not TenantPolicy.objects.get(tenant=tenancy.acme).auto_approve_within_guarantee
    assert client.post("/capacity/quotas/nobody/auto-approve/", {"on": "1"}).status_code == 404


def test_the_tenant_page_shows_its_quotas_its_borrowed_pools_and_a_pool_under_notice(
    fleet, tenancy, operator, approver, client_for
):
    set_quota(actor=operator, tenant=tenancy.acme, gpu_model=H100, guaranteed=14, limit=None)
    within = admitted(tenancy.vision, tenancy.acme_member, approver, 2)
    borrowed = admitted(tenancy.vision, tenancy.acme_member, approver, 2)
    page = client_for(tenancy.acme_viewer).get("/t/acme/").content.decode()
    quotas = page[page.index("<h3>Quotas</h3>") :]
    assert ">14<" in quotas and ">28<" in quotas and '<span class="badge borrowed">14</span>' in quotas
    rows = {pk: page[page.index(f"#{pk}</a>") :][:800] for pk in (within.pk, borrowed.pk)}
    assert "badge borrowed" not in rows[within.pk].split("</tr>")[0]
    assert "badge borrowed" in rows[borrowed.pk].split("</tr>")[0]
    Pool.objects.filter(pk=borrowed.pk).update(state=PoolState.RECLAIMING, reclaim_at=borrowed.reserved_at)
    page = client_for(tenancy.acme_viewer).get("/t/acme/").content.decode()
    assert f"Pool #{borrowed.pk} holds borrowed GPUs" in page
    detail = client_for(tenancy.acme_viewer).get(f"/t/acme/pools/{borrowed.pk}/").content.decode()
    assert "It stays usable until" in detail and borrowed.reserved_at.strftime("%Y-%m-%d %H:%M") in detail


def test_without_quotas_the_pages_say_nothing_of_them(fleet, tenancy, client_for):
    page = client_for(tenancy.acme_viewer).get("/t/acme/").content.decode()
    assert "<h3>Quotas</h3>" not in page
    form = client_for(tenancy.acme_member).get("/t/acme/p/vision/request/").content.decode()
    assert "check_quota" not in form


@pytest.mark.parametrize(
    ("count", "words"),
    [
        (1, "Within your tenant's guarantee"),
        (3, "7 compute slices of it are beyond your tenant's guarantee"),
        (5, "Beyond a quota, it would be refused: Acme would hold 35 of its limit of 28"),
    ],
)
def test_the_request_form_tells_the_verdict_before_sending(
    fleet, tenancy, operator, client_for, count, words
):
    set_quota(actor=operator, tenant=tenancy.acme, gpu_model=H100, guaranteed=14, limit=28)
    client = client_for(tenancy.acme_member)
    form = client.get("/t/acme/p/vision/request/").content.decode()
    assert "check_quota" in form and "Your tenant" in form
    answer = client.post(
        "/t/acme/p/vision/request/", {"spec_0": "h100-80gb.full", "count_0": count, "check_quota": "1"}
    )
    assert answer.status_code == 200 and words in answer.content.decode()
    assert not PoolRequest.objects.exists()  # told, not sent


def test_the_approver_sees_the_tenants_quota_use_beside_the_request(
    fleet, tenancy, operator, approver, client_for
):
    set_quota(actor=operator, tenant=tenancy.acme, gpu_model=H100, guaranteed=14, limit=None)
    request = submit_request(project=tenancy.vision, user=tenancy.acme_member, items=[("h100-80gb.full", 3)])
    page = client_for(approver).get(f"/approvals/{request.pk}/").content.decode()
    section = page[page.index('id="tenant-quotas"') :]
    assert "badge verdict-borrowed" in section and ">14<" in section
    listed = client_for(approver).get("/approvals/").content.decode()
    assert "badge verdict-borrowed" in listed


def test_the_admin_sets_quotas_through_the_service(fleet, tenancy, operator, client_for):
    from portal.models import AuditEntry

    client = client_for(operator)
    body = {"tenant": tenancy.acme.pk, "group": "", "gpu_model": H100, "guaranteed": 70, "limit": ""}
    refused = client.post("/admin/pools/quota/add/", body)
    assert refused.status_code == 200 and "in service there" in refused.content.decode()
    assert not Quota.objects.exists()
    saved = client.post("/admin/pools/quota/add/", {**body, "guaranteed": 14, "limit": 28})
    assert saved.status_code == 302, saved.content.decode()[:2000]
    assert (Quota.objects.get().guaranteed, Quota.objects.get().limit) == (14, 28)
    assert AuditEntry.objects.filter(action="quota.changed", actor=operator).count() == 1
