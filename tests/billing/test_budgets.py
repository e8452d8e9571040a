"""Budgets: set by a tenant's admins in billing's currency (audited; bad input refused, nothing changed),
weighed against billing's own projection of the month, warned of at 80 % and 100 % once each a month, and
a hard budget holding a request for an approver's explicit override."""

from datetime import UTC, datetime, timedelta
from decimal import Decimal

import pytest
from django.core import mail
from django.urls import reverse
from django.utils import timezone

from billing import spend
from billing.budgets import warnings
from billing.budgets.services import remove_budget, set_budget
from billing.budgets.standing import months
from billing.models import Budget
from pools import budgets as pool_budgets
from pools.models import Pool, PoolRequest, RequestState
from pools.services import approve_request, submit_request
from pools.services.quotas import set_auto_approve, set_quota
from portal.errors import Conflict, InvalidInput, NotAllowed
from portal.models import AuditEntry
from tests.factories import PoolFactory, PriceFactory

# 03:00 UTC on 10 November is noon in Seoul: the month (billing's time zone) has 20.5 days left.
NOW = datetime(2026, 11, 10, 3, tzinfo=UTC)
NOVEMBER = datetime(2026, 10, 31, 15, tzinfo=UTC)  # midnight of 1 November in Seoul
RATE = Decimal(1000)  # an H100's hourly price here
FLEET = [("h100", 1, "H100-80GB", [None] * 8)]


@pytest.fixture
def clock(monkeypatch):
    """A frozen clock, moved with `clock.at = …`."""

    class Clock:
        at = NOW

    found = Clock()
    monkeypatch.setattr(timezone, "now", lambda: found.at)
    return found


@pytest.fixture
def priced(db):
    PriceFactory(
        gpu_model="H100-80GB", profile="full", hourly_price=RATE, valid_from=NOW - timedelta(days=400)
    )


@pytest.fixture
def held(tenancy, priced, clock):
    """One H100 of acme's project held since the start of November (Seoul): 720 h in November, 744 in
    December, at 1,000 an hour."""
    return PoolFactory(
        allocated=True, project=tenancy.vision, request__items=[("h100-80gb.full", 1)], reserved_at=NOVEMBER
    )


def budget(tenancy, limit, **kwargs) -> Budget:
    kwargs.setdefault("currency", "KRW")
    return set_budget(actor=tenancy.acme_admin, tenant=tenancy.acme, month_limit=limit, **kwargs)


# --- setting budgets -------------------------------------------------------------------------------------


def test_a_budget_is_set_replaced_and_removed_by_an_admin_each_change_audited(tenancy):
    first = budget(tenancy, "1500000")
    again = budget(tenancy, Decimal("2000000.5"), hard=True)
    assert again.pk == first.pk and (again.month_limit, again.hard) == (Decimal("2000000.5"), True)
    project = budget(tenancy, 300000, project=tenancy.vision)
    assert Budget.objects.count() == 2 and project.project == tenancy.vision
    assert remove_budget(actor=tenancy.acme_admin, tenant=tenancy.acme, project=tenancy.vision)
    assert list(Budget.objects.all()) == [again]
    entries = AuditEntry.objects.filter(action__startswith="budget.").order_by("at", "pk")
    assert [e.action for e in entries] == ["budget.changed"] * 3 + ["budget.removed"]
    assert entries[1].details["before"] == {"month_limit": "1500000.0000", "currency": "KRW", "hard": False}
    assert "2,000,000.5 KRW" in entries[1].summary and "hard" in entries[1].summary
    assert all(entry.actor == tenancy.acme_admin and entry.tenant_id == tenancy.acme.pk for entry in entries)


@pytest.mark.parametrize(
    ("change", "error", "words"),
    [
        ({"month_limit": "-1"}, InvalidInput, "cannot be negative"),
        ({"month_limit": "lots"}, InvalidInput, "is a number"),
        ({"month_limit": "1.00001"}, InvalidInput, "decimal places"),
        ({"currency": "USD"}, InvalidInput, "Budgets are in KRW"),
        ({"project": "recsys"}, InvalidInput, "is not of tenant acme"),
        ({"actor": "acme_member"}, NotAllowed, "Only an admin of Acme"),
        ({"actor": "globex_member"}, NotAllowed, "Only an admin of Acme"),
    ],
)
def test_bad_budgets_are_refused_clearly_and_change_nothing(tenancy, change, error, words):
    kept = budget(tenancy, 1000)
    values = {"actor": tenancy.acme_admin, "month_limit": "5000", "currency": "KRW", **change}
    if isinstance(values["actor"], str):
        values["actor"] = getattr(tenancy, values["actor"])
    if "project" in change:
        values["project"] = tenancy.recsys
    with pytest.raises(error, match=words):
        set_budget(tenant=tenancy.acme, **values)
    assert list(Budget.objects.values_list("month_limit", "currency", "hard")) == [
        (Decimal(1000), "KRW", False)
    ]
    assert AuditEntry.objects.filter(action="budget.changed").count() == 1
    assert Budget.objects.get() == kept


# --- the month's projection and the warnings ---------------------------------------------------------


def test_a_budget_is_weighed_against_billings_own_projection(tenancy, held, clock):
    soft = budget(tenancy, 1_000_000)
    mine = budget(tenancy, 1_000_000, project=tenancy.vision)
    second = PoolFactory(
        allocated=True,
        project__tenant=tenancy.acme,
        request__items=[("h100-80gb.full", 2)],
        reserved_at=NOVEMBER,
    )
    other = budget(tenancy, 1_000_000, project=second.project)
    found = spend.figures(
        spend.total(spend.pool_spend(pools=Pool.objects.filter(pk=held.pk), now=NOW).values())
    )
    rows = {row.budget.pk: row for row in months([soft, mine, other], now=NOW)}
    assert rows[mine.pk].projected == found.projected == 720 * RATE
    assert rows[mine.pk].spent_to_date == found.to_date == (9 * 24 + 12) * RATE
    assert rows[other.pk].projected == 2 * 720 * RATE  # each project's own pools
    assert rows[soft.pk].projected == 3 * 720 * RATE  # the tenant's: all of them


def test_warnings_go_once_at_each_threshold_and_again_in_a_new_month(tenancy, held, clock):
    budget(tenancy, 850_000)  # November projects 720,000: 85 %
    assert warnings.warn().sent == [f"billing.budget:{Budget.objects.get().pk}:2026-11:80 → bob@example.com"]
    (sent,) = mail.outbox
    assert "80%" in sent.subject and "Acme" in sent.subject and "720,000 KRW" in sent.body
    assert warnings.warn().sent == [] and len(mail.outbox) == 1  # once a month, however often beat runs

    budget(tenancy, 700_000)  # now past it: the 100 % warning, once
    assert [key.split(":")[3] for key in warnings.warn().sent] == ["100 → bob@example.com"]
    assert warnings.warn().sent == [] and len(mail.outbox) == 2

    clock.at = datetime(2026, 12, 10, 3, tzinfo=UTC)  # December projects 744,000: past it again
    assert [key.split(":")[2:] for key in warnings.warn().sent] == [["2026-12", "100 → bob@example.com"]]
    budget(tenancy, 900_000)  # 82.7 %: December's 80 % has not been sent yet
    assert [key.split(":")[2:] for key in warnings.warn().sent] == [["2026-12", "80 → bob@example.com"]]
    assert warnings.warn().sent == [] and len(mail.outbox) == 4


def test_no_warning_below_80_percent_nor_of_another_tenants_pools(tenancy, held, clock):
    PoolFactory(
        allocated=True, project=tenancy.recsys, request__items=[("h100-80gb.full", 4)], reserved_at=NOVEMBER
    )
    budget(tenancy, 1_000_000)  # acme's 720,000: 72 %
    assert warnings.warn().sent == [] and mail.outbox == []


def test_the_task_is_on_beats_schedule():
    from portal import shell

    assert shell.beat_schedule()["warn-budgets"]["task"] == "billing.tasks.warn_budgets"


# --- a hard budget holds a request for an approver's override ---------------------------------------


@pytest.fixture
def policy(synced, tenancy, operator, priced, clock):
    """Acme's requests within its guarantee (3 H100s) approved by the policy."""
    synced(FLEET)
    set_quota(actor=operator, tenant=tenancy.acme, gpu_model="H100-80GB", guaranteed=21)
    set_auto_approve(actor=operator, tenant=tenancy.acme, on=True)


def ask(tenancy, count=1) -> PoolRequest:
    return submit_request(project=tenancy.vision, user=tenancy.acme_member, items=[("h100-80gb.full", count)])


def test_a_hard_budget_holds_a_request_for_the_approvers_explicit_override(tenancy, policy, approver):
    # 20.5 days left: one more H100 adds 492,000 to a month that projects nothing yet.
    assert ask(tenancy).state == RequestState.APPROVED  # no budget: approved by the policy
    budget(tenancy, 400_000, hard=True)
    held_back = ask(tenancy)
    assert held_back.state == RequestState.SUBMITTED and held_back.decided_by is None

    with pytest.raises(Conflict, match=r"hard budget of Acme: 400,000 KRW .* 492,000 KRW, 92,000 KRW over"):
        approve_request(request_id=held_back.pk, approver=approver)
    held_back.refresh_from_db()
    assert held_back.state == RequestState.SUBMITTED

    approve_request(request_id=held_back.pk, approver=approver, override_budget=True)
    held_back.refresh_from_db()
    assert held_back.state == RequestState.APPROVED and held_back.decided_by == approver
    event = held_back.events.get(to_state=RequestState.APPROVED)
    assert "overrode the hard budget" in event.reason and "hard budget of Acme" in event.reason
    entry = AuditEntry.objects.get(action="request.approved", subject_id=str(held_back.pk))
    assert entry.actor == approver and "overrode the hard budget" in entry.summary


def test_a_projects_hard_budget_holds_too_and_a_soft_one_only_warns(tenancy, policy, approver):
    budget(tenancy, 100, project=tenancy.vision)  # soft: passed, but nothing is held for it
    assert ask(tenancy).state == RequestState.APPROVED
    budget(tenancy, 100, project=tenancy.vision, hard=True)
    held_back = ask(tenancy)
    assert held_back.state == RequestState.SUBMITTED
    with pytest.raises(Conflict, match="hard budget of Vision"):
        approve_request(request_id=held_back.pk, approver=approver)
    budget(tenancy, 10_000_000, project=tenancy.vision, hard=True)  # raised: the request fits in it now
    assert approve_request(request_id=held_back.pk, approver=approver).state == RequestState.APPROVED


def test_what_a_request_adds_stops_at_its_end(tenancy, held, clock):
    budget(tenancy, 800_000, hard=True)  # 720,000 projected
    whole = pool_budgets.passed_hard_budget(project=tenancy.vision, hourly_cost=RATE)
    assert (whole.adds, whole.over) == (492 * RATE, 412 * RATE)
    ends = NOW + timedelta(hours=10)
    assert pool_budgets.passed_hard_budget(project=tenancy.vision, hourly_cost=RATE, ends_at=ends) is None
    short = pool_budgets.standings(project=tenancy.vision, hourly_cost=RATE, ends_at=ends)
    assert [s.adds for s in short] == [10 * RATE]


def test_without_billings_check_no_budget_applies(tenancy, held, monkeypatch):
    budget(tenancy, 0, hard=True)
    assert pool_budgets.passed_hard_budget(project=tenancy.vision, hourly_cost=RATE) is not None
    monkeypatch.setattr(pool_budgets, "_standings", None)
    assert pool_budgets.passed_hard_budget(project=tenancy.vision, hourly_cost=RATE) is None


def test_the_approval_api_refuses_without_the_override_and_approves_with_it(
    tenancy, policy, approver, api_for
):
    budget(tenancy, 1000, hard=True)
    held_back = ask(tenancy)
    url = f"/api/v1/pool-requests/{held_back.pk}/approve/"
    refused = api_for(approver).post(url, {}, format="json")
    assert refused.status_code == 409 and "hard budget of Acme" in refused.json()["detail"]
    done = api_for(approver).post(url, {"override_budget": True}, format="json")
    assert done.status_code == 200 and done.json()["state"] in ("approved", "queued", "fulfilled")


def test_the_approval_page_shows_the_budgets_and_the_override_only_where_one_is_passed(
    tenancy, policy, approver, client_for
):
    budget(tenancy, 10_000_000, hard=True)
    fits = ask(tenancy)
    fits = PoolRequest.objects.get(pk=fits.pk)
    PoolRequest.objects.filter(pk=fits.pk).update(state=RequestState.SUBMITTED)  # to decide, by an approver
    page = client_for(approver).get(reverse("approval", kwargs={"pk": fits.pk})).content.decode()
    shown = page[
        page.index("Budgets this month") : page.index("</section>", page.index("Budgets this month"))
    ]
    assert "10,000,000 KRW" in shown and "492,000" in shown
    assert 'name="override_budget"' not in page

    budget(tenancy, 1000, hard=True)
    page = client_for(approver).get(reverse("approval", kwargs={"pk": fits.pk})).content.decode()
    assert 'name="override_budget"' in page and "hard budget of Acme" in page
    refused = client_for(approver).post(reverse("approval-approve", kwargs={"pk": fits.pk}), {})
    assert refused.status_code == 409 and "budget override" in refused.content.decode()
    done = client_for(approver).post(
        reverse("approval-approve", kwargs={"pk": fits.pk}), {"override_budget": "on"}
    )
    assert done.status_code == 302
    assert PoolRequest.objects.get(pk=fits.pk).state == RequestState.APPROVED


def test_the_tenants_request_page_says_it_waits_for_the_override(tenancy, policy, client_for):
    budget(tenancy, 1000, hard=True)
    held_back = ask(tenancy)
    url = reverse("pool-request", kwargs={"tenant_slug": "acme", "pk": held_back.pk})
    page = client_for(tenancy.acme_member).get(url).content.decode()
    assert "hard budget of Acme" in page and "waits for an approver" in page and "492,000" in page


def test_reclaimed_work_asked_again_past_a_hard_budget_waits_for_an_approver(tenancy, held, settings):
    from pools.services.requests import ask_again

    settings.RECLAIM_REQUEUE = True
    budget(tenancy, 100_000, hard=True)  # 720,000 projected already
    again = ask_again(pool=held)
    assert again.asked_again_for == held and again.state == RequestState.SUBMITTED  # not approved by itself
    budget(tenancy, 10_000_000, hard=True)
    second = ask_again(pool=held)
    assert second.state == RequestState.APPROVED
