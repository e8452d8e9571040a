"""Quotas: set by operators and approvers within what is in service, audited; every request judged against
them at submission (within the guarantee, borrowed, refused beyond a limit) and at admission; requests within
the guarantee approved by the policy where the tenant has it on; the queue ordered by fair share."""

import pytest

from pools.models import GpuCapacity, Pool, PoolRequest, Quota, RequestState
from pools.selectors.quotas import borrowed_pool_ids, guarantees_against_capacity, quota_rows
from pools.services import admit_waiting, approve_request, release_pool, submit_request
from pools.services.quotas import set_auto_approve, set_quota
from portal.errors import InvalidInput, NotAllowed
from portal.models import AuditEntry
from tests.factories import ProjectFactory

H100 = "H100-80GB"  # the small fleet holds 8 whole H100s (56 compute slices) and 16 H200s (112)


def ask(project, user, items, **kwargs):
    return submit_request(project=project, user=user, items=items, **kwargs)


def test_a_quota_is_set_audited_and_its_limit_defaults_to_the_guarantee(fleet, tenancy, operator, approver):
    quota = set_quota(actor=operator, tenant=tenancy.acme, gpu_model=H100, guaranteed=21)
    assert (quota.guaranteed, quota.limit, quota.group, quota.project) == (21, 21, "", None)
    again = set_quota(actor=approver, tenant=tenancy.acme, gpu_model=H100, guaranteed=14, limit=None)
    assert again.pk == quota.pk and (again.guaranteed, again.limit) == (14, None)  # replaced, no limit
    entries = AuditEntry.objects.filter(action="quota.changed").order_by("at")
    assert [e.details["after"] for e in entries] == [
        {"guaranteed": 21, "limit": 21},
        {"guaranteed": 14, "limit": None},
    ]
    assert entries[1].details["before"] == {"guaranteed": 21, "limit": 21}
    assert "Acme" in entries[1].summary and "none" in entries[1].summary


@pytest.mark.parametrize(
    ("change", "words"),
    [
        ({"guaranteed": 57}, "56 are in service"),
        ({"guaranteed": 14, "limit": 7}, "below the guarantee"),
        ({"guaranteed": -1}, "0 or more"),
        ({"guaranteed": 2.5}, "whole number"),
        ({"guaranteed": True}, "whole number"),
        ({"guaranteed": "7"}, "whole number"),
        ({"gpu_model": "A100-40GB"}, "No GPU of the fleet is a A100-40GB"),
        ({"group": "training"}, "No cluster has a GPU group training"),
    ],
)
def test_bad_quotas_are_refused_clearly_and_write_nothing(fleet, tenancy, operator, change, words):
    with pytest.raises(InvalidInput, match=words):
        set_quota(actor=operator, tenant=tenancy.acme, **{"gpu_model": H100, "guaranteed": 7, **change})
    assert not Quota.objects.exists() and not AuditEntry.objects.filter(action="quota.changed").exists()


def test_the_guarantees_of_all_tenants_stay_within_what_is_in_service(fleet, tenancy, operator):
    set_quota(actor=operator, tenant=tenancy.acme, gpu_model=H100, guaranteed=35, limit=56)
    with pytest.raises(InvalidInput, match="at most 21 more"):
        set_quota(actor=operator, tenant=tenancy.globex, gpu_model=H100, guaranteed=28)
    set_quota(actor=operator, tenant=tenancy.globex, gpu_model=H100, guaranteed=21)
    # A drain takes capacity out of service: the operators read by how much, and who is short.
    GpuCapacity.objects.filter(model=H100, index__in=[0, 1]).update(drained=True)
    (row,) = guarantees_against_capacity()
    assert (row.gpu_model, row.capacity, row.guaranteed, row.short) == (H100, 42, 56, 14)
    assert row.tenants_short == (("Acme", 0, 35), ("Globex", 0, 21))


def test_only_operators_and_approvers_set_quotas(fleet, tenancy):
    for person in (tenancy.acme_admin, tenancy.acme_member, tenancy.outsider):
        with pytest.raises(NotAllowed):
            set_quota(actor=person, tenant=tenancy.acme, gpu_model=H100, guaranteed=7)
        with pytest.raises(NotAllowed):
            set_auto_approve(actor=person, tenant=tenancy.acme, on=True)
    assert not Quota.objects.exists()


def test_a_request_is_told_within_borrowed_or_refused_beyond_the_limit(fleet, tenancy, operator, approver):
    set_quota(actor=operator, tenant=tenancy.acme, gpu_model=H100, guaranteed=14, limit=28)
    member = tenancy.acme_member
    within = ask(tenancy.vision, member, [("h100-80gb.full", 2)])
    assert within.quota_verdict == "within"
    # What an approved request still waits for counts as held: one GPU more is beyond the guarantee.
    approve_request(request_id=within.pk, approver=approver)
    borrowed = ask(tenancy.vision, member, [("h100-80gb.full", 1)])
    assert borrowed.quota_verdict == "borrowed"
    before = PoolRequest.objects.count()
    with pytest.raises(InvalidInput, match="would hold 35 of its limit of 28 compute slices of H100-80GB"):
        ask(tenancy.vision, member, [("h100-80gb.full", 3)])
    assert PoolRequest.objects.count() == before
    # Another model has no quota and no default limit: all of it is borrowed.
    assert ask(tenancy.vision, member, [("h200-141gb.full", 1)]).quota_verdict == "borrowed"


def test_without_any_quota_nothing_is_judged(fleet, tenancy):
    request = ask(tenancy.vision, tenancy.acme_member, [("h100-80gb.full", 8)])
    assert request.quota_verdict == "" and request.state == RequestState.SUBMITTED


def test_a_default_limit_holds_where_a_tenant_has_no_quota(fleet, tenancy, settings):
    settings.QUOTA_DEFAULT_LIMIT = 14
    with pytest.raises(InvalidInput, match="limit of 14"):
        ask(tenancy.vision, tenancy.acme_member, [("h100-80gb.full", 3)])
    assert ask(tenancy.vision, tenancy.acme_member, [("h100-80gb.full", 2)]).quota_verdict == "borrowed"


def test_a_project_limit_holds_inside_its_tenants(fleet, tenancy, operator):
    set_quota(actor=operator, tenant=tenancy.acme, gpu_model=H100, guaranteed=28)
    set_quota(actor=operator, tenant=tenancy.acme, project=tenancy.vision, gpu_model=H100, limit=7)
    with pytest.raises(InvalidInput, match="acme/vision would hold 14 of its limit of 7"):
        ask(tenancy.vision, tenancy.acme_member, [("h100-80gb.full", 2)])
    other = ProjectFactory(tenant=tenancy.acme, slug="other")
    assert ask(other, tenancy.acme_member, [("h100-80gb.full", 2)]).quota_verdict == "within"
    with pytest.raises(InvalidInput, match="guarantees nothing"):
        set_quota(actor=operator, tenant=tenancy.acme, project=tenancy.vision, gpu_model=H100, guaranteed=7)
    with pytest.raises(InvalidInput, match="is not of tenant"):
        set_quota(actor=operator, tenant=tenancy.globex, project=tenancy.vision, gpu_model=H100, limit=7)


def test_within_the_guarantee_the_policy_approves_and_beyond_it_an_approver_decides(fleet, tenancy, operator):
    set_quota(actor=operator, tenant=tenancy.acme, gpu_model=H100, guaranteed=14, limit=56)
    set_auto_approve(actor=operator, tenant=tenancy.acme, on=True)
    assert AuditEntry.objects.filter(action="quota.auto_approve").count() == 1
    by_policy = ask(tenancy.vision, tenancy.acme_member, [("h100-80gb.full", 2)])
    assert by_policy.state == RequestState.APPROVED and by_policy.decided_by is None
    event = by_policy.events.get(to_state="approved")
    assert event.actor is None and "by the policy" in event.reason
    to_decide = ask(tenancy.vision, tenancy.acme_member, [("h100-80gb.full", 1)])  # the two wait: beyond
    assert (to_decide.state, to_decide.quota_verdict) == (RequestState.SUBMITTED, "borrowed")
    set_auto_approve(actor=operator, tenant=tenancy.acme, on=False)
    off = ask(ProjectFactory(tenant=tenancy.acme, slug="more"), tenancy.acme_member, [("h200-141gb.full", 1)])
    assert off.state == RequestState.SUBMITTED


def test_pools_beyond_the_guarantee_are_borrowed_in_the_order_they_were_admitted(
    fleet, tenancy, operator, approver
):
    set_quota(actor=operator, tenant=tenancy.acme, gpu_model=H100, guaranteed=14, limit=56)
    pools = []
    for _ in range(2):
        request = ask(tenancy.vision, tenancy.acme_member, [("h100-80gb.full", 2)])
        approve_request(request_id=request.pk, approver=approver)
        admit_waiting()
        pools.append(Pool.objects.get(request=request))
    first, second = pools
    assert PoolRequest.objects.get(pool=second).quota_verdict == "borrowed"  # as admitted
    assert borrowed_pool_ids([first.pk, second.pk]) == {second.pk}
    release_pool(pool_id=first.pk, user=tenancy.acme_member)
    assert borrowed_pool_ids([second.pk]) == set()  # now the guarantee covers it


def test_a_quota_lowered_below_what_is_held_takes_nothing_away(fleet, tenancy, operator, approver):
    set_quota(actor=operator, tenant=tenancy.acme, gpu_model=H100, guaranteed=28, limit=28)
    request = ask(tenancy.vision, tenancy.acme_member, [("h100-80gb.full", 4)])
    approve_request(request_id=request.pk, approver=approver)
    admit_waiting()
    pool = Pool.objects.get(request=request)
    set_quota(actor=operator, tenant=tenancy.acme, gpu_model=H100, guaranteed=7, limit=14)
    assert Pool.objects.get(pk=pool.pk).state == pool.state  # nothing taken away
    (row,) = quota_rows([tenancy.acme.pk])
    assert (row["guaranteed"], row["limit"], row["held"], row["borrowed"]) == (7, 14, 28, 21)
    assert borrowed_pool_ids([pool.pk]) == {pool.pk}
    with pytest.raises(InvalidInput, match="limit of 14"):
        ask(tenancy.vision, tenancy.acme_member, [("h100-80gb.full", 1)])
    release_pool(pool_id=pool.pk, user=tenancy.acme_member)
    assert ask(tenancy.vision, tenancy.acme_member, [("h100-80gb.full", 1)]).quota_verdict == "within"


def test_among_equal_priorities_the_tenant_furthest_below_its_guarantee_goes_first(
    fleet, tenancy, operator, approver
):
    set_quota(actor=operator, tenant=tenancy.acme, gpu_model=H100, guaranteed=28, limit=None)
    set_quota(actor=operator, tenant=tenancy.globex, gpu_model=H100, guaranteed=28, limit=None)
    held = ask(tenancy.vision, tenancy.acme_member, [("h100-80gb.full", 4)])
    approve_request(request_id=held.pk, approver=approver)
    admit_waiting()  # acme holds 28 of its 28: its share is 1, globex's 0
    acme = ask(tenancy.vision, tenancy.acme_member, [("h100-80gb.full", 4)])
    approve_request(request_id=acme.pk, approver=approver)
    globex = ask(tenancy.recsys, tenancy.globex_member, [("h100-80gb.full", 4)])  # approved later
    approve_request(request_id=globex.pk, approver=approver)
    results = {r.request_id: r for r in admit_waiting()}
    assert results[globex.pk].admitted and not results[acme.pk].admitted
    urgent = ask(tenancy.vision, tenancy.acme_member, [("h100-80gb.full", 1)])
    approve_request(request_id=urgent.pk, approver=approver, priority=5)  # priority first, whatever the share
    release_pool(pool_id=Pool.objects.get(request=held).pk, user=tenancy.acme_member)
    other = ask(tenancy.recsys, tenancy.globex_member, [("h100-80gb.full", 4)])
    approve_request(request_id=other.pk, approver=approver)
    results = {r.request_id: r for r in admit_waiting()}
    assert results[urgent.pk].admitted


def test_the_queue_admits_no_request_that_would_take_its_tenant_past_a_limit(
    fleet, tenancy, operator, approver
):
    set_quota(actor=operator, tenant=tenancy.acme, gpu_model=H100, guaranteed=14, limit=21)
    first = ask(tenancy.vision, tenancy.acme_member, [("h100-80gb.full", 2)])
    second = ask(tenancy.vision, tenancy.acme_member, [("h100-80gb.full", 1)])
    third = ask(
        tenancy.vision, tenancy.acme_member, [("h100-80gb.full", 1)]
    )  # each alone was within the limit
    for request in (first, second, third):
        approve_request(request_id=request.pk, approver=approver)
    results = {r.request_id: r for r in admit_waiting()}
    assert [results[r.pk].admitted for r in (first, second, third)] == [True, True, False]
    third.refresh_from_db()
    assert third.state == RequestState.QUEUED
    assert "Acme would hold 28 of its limit of 21 compute slices of H100-80GB" in third.waiting_reason
    assert PoolRequest.objects.get(pk=second.pk).quota_verdict == "borrowed"


def test_the_approvers_verdict_of_a_request_past_its_limit_is_that_it_waits(
    fleet, tenancy, operator, approver
):
    from pools.services.verdicts import WAITS, verdict

    set_quota(actor=operator, tenant=tenancy.acme, gpu_model=H100, guaranteed=14, limit=14)
    first = ask(tenancy.vision, tenancy.acme_member, [("h100-80gb.full", 2)])
    approve_request(request_id=first.pk, approver=approver)
    admit_waiting()
    set_quota(actor=operator, tenant=tenancy.acme, gpu_model=H100, guaranteed=7, limit=7)  # lowered: held 14
    # Submitted before the quota was lowered (a submission now is refused): it would wait for the limit.
    late = PoolRequest.objects.create(project=tenancy.vision, submitted_by=tenancy.acme_member)
    late.items.create(gpu_model=H100, profile="full", count=1)
    found = verdict(late)
    assert found.outcome == WAITS and "limit of 7" in str(found.reason)


def test_the_ledger_counts_each_waiting_request_of_its_tenants_once_per_project(fleet, tenancy, approver):
    from pools.selectors.quotas import ledger

    second = ProjectFactory(tenant=tenancy.acme, slug="second")
    member = tenancy.acme_member
    asked = [
        (tenancy.vision, [("h100-80gb.full", 1), ("h200-141gb.mig-3g.71gb", 2)]),
        (tenancy.vision, [("h200-141gb.mig-3g.71gb", 1), ("h200-141gb.mig-1g.18gb", 3)]),
        (second, [("h100-80gb.full", 2)]),
    ]
    for project, items in asked:
        approve_request(request_id=ask(project, member, items).pk, approver=approver)
    ask(tenancy.vision, member, [("h100-80gb.full", 4)])  # submitted, not approved: not counted
    approve_request(
        request_id=ask(tenancy.recsys, tenancy.globex_member, [("h100-80gb.full", 3)]).pk, approver=approver
    )

    books, _holdings = ledger([tenancy.acme.pk], waiting=True)
    h100, h200 = ("", H100), ("", "H200-141GB")
    assert dict(books.project_held[tenancy.vision.pk]) == {h100: 7, h200: 3 * 3 + 3 * 1}
    assert dict(books.project_held[second.pk]) == {h100: 14}
    assert dict(books.held[tenancy.acme.pk]) == {h100: 21, h200: 12}
    assert tenancy.globex.pk not in books.held
