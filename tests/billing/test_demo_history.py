"""The demo's billing history: both tenants' pools of the two previous months, released long ago,
metered by billing's own code, the older month invoiced (acme paid, globex issued) and last month
closed into drafts; the fleet of today exactly as the demo without history leaves it."""

from datetime import UTC, date, datetime, timedelta
from io import StringIO
from zoneinfo import ZoneInfo

import pytest
from django.apps import apps
from django.db import connection, transaction
from django.db.models import Sum
from django.utils import timezone

from billing import invoicing, mail
from billing.conf import settings
from billing.demo import PAST_POOLS, history_months
from billing.demo import load as load_billing
from billing.models import BillingProfile, Invoice, InvoiceState, MeteredPeriod, UsageRecord
from billing.prices import metered_until
from billing.services import PERIODS_PER_TRANSACTION, meter
from pools.demo import load as load_pools
from pools.models import Allocation, Pool, PoolState, RequestState, SpecAndCount
from pools.selectors.capacity import capacity_summary, spec_offers
from portal.demo import load as load_portal
from tests.billing.demo import load_demo

SEOUL = ZoneInfo("Asia/Seoul")
HOUR = timedelta(hours=1)
# Half past midnight on the 1st in Seoul, still the last day of May in UTC.
FIRST_OF_JUNE = datetime(2026, 6, 1, 0, 30, tzinfo=SEOUL)


@pytest.fixture
def clock(monkeypatch, settings):
    """`clock(moment)` stops the portal's clock there; without a call it runs as usual. Billing counts
    months in Seoul and meters by the hour."""
    settings.BILLING_TIME_ZONE = "Asia/Seoul"
    settings.METERING_PERIOD_SECONDS = 3600

    def freeze(moment: datetime) -> datetime:
        monkeypatch.setattr(timezone, "now", lambda: moment.astimezone(UTC))
        return moment

    return freeze


@pytest.fixture
def demo(db, clock):
    """The demo, loaded now; returns the moment it ran."""
    now = timezone.now()
    load_demo()
    return now


def months_of(now: datetime) -> tuple[tuple[date, datetime, datetime], ...]:
    return tuple((m, *invoicing.month_span(m.year, m.month, "Asia/Seoul")) for m in history_months(now))


def past_pools(now: datetime):
    return Pool.objects.filter(reserved_at__lt=months_of(now)[1][2])


def test_history_is_the_two_previous_complete_months_in_seoul():
    assert history_months(FIRST_OF_JUNE) == (date(2026, 4, 1), date(2026, 5, 1))
    assert history_months(datetime(2026, 5, 31, 23, 59, tzinfo=SEOUL)) == (date(2026, 3, 1), date(2026, 4, 1))
    assert history_months(datetime(2027, 1, 15, tzinfo=SEOUL)) == (date(2026, 11, 1), date(2026, 12, 1))


def test_both_tenants_used_gpus_in_each_of_the_two_previous_months(demo):
    check_usage(demo)


def check_usage(demo: datetime) -> None:
    for _month, start, end in months_of(demo):
        used = UsageRecord.objects.filter(period_start__gte=start, period_start__lt=end)
        assert set(used.values_list("pool__project__tenant__slug", flat=True)) == {"acme", "globex"}
        assert not used.filter(unit_price=None).exists()
    # Some pools of the month before last run on into last month.
    (_m, _start, boundary), _last = months_of(demo)
    assert past_pools(demo).filter(reserved_at__lt=boundary, released_at__gt=boundary).count() >= 2


def test_past_pools_went_the_way_the_services_take_and_are_metered_to_the_second(demo):
    pools = past_pools(demo).select_related("request")
    assert pools.count() == len(PAST_POOLS)
    assert {p.request.project.slug for p in pools} == {"vision", "llm-serving", "recsys", "analytics"}
    durations, profiles = set(), set()
    for pool in pools:
        request = pool.request
        assert pool.state == PoolState.RELEASED and request.state == RequestState.FULFILLED
        assert request.decided_by.username == "carol"
        assert request.submitted_at < request.approved_at <= pool.reserved_at < pool.active_at
        assert pool.released_at < months_of(demo)[1][2] <= demo
        steps = [(e.from_state, e.to_state) for e in request.events.order_by("at", "pk")]
        assert steps == [
            ("", "submitted"),
            ("submitted", "approved"),
            ("approved", "fulfilled"),
            ("", "provisioning"),
            ("provisioning", "active"),
            ("active", "releasing"),
            ("releasing", "released"),
        ]
        assert request.events.filter(to_state="approved").get().actor.username == "carol"
        allocations = list(pool.allocations.all())
        held = request.items.aggregate(n=Sum("count"))["n"]
        assert len(allocations) == held
        assert {(a.allocated_at, a.released_at) for a in allocations} == {
            (pool.reserved_at, pool.released_at)
        }
        assert all(a.instance_uuid for a in allocations)
        seconds = int((pool.released_at - pool.reserved_at).total_seconds())
        assert pool.usage.aggregate(s=Sum("seconds"))["s"] == held * seconds
        durations.add(seconds // 3600)
        profiles |= {a.profile for a in allocations}
    assert min(durations) <= 5 and max(durations) >= 3 * 24  # hours to days
    assert "full" in profiles and len(profiles) >= 5
    # No two past pools ever held the same slices of one GPU at once.
    spans = list(
        Allocation.objects.filter(pool__in=pools).values_list(
            "gpu_id", "slices", "allocated_at", "released_at"
        )
    )
    for i, (gpu, slices, since, until) in enumerate(spans):
        for other, other_slices, other_since, other_until in spans[i + 1 :]:
            shared = gpu == other and slices.lower < other_slices.upper and other_slices.lower < slices.upper
            assert not (shared and since < other_until and other_since < until)


def test_last_month_is_in_drafts_whose_totals_are_their_lines(demo):
    check_drafts(demo)


def check_drafts(demo: datetime) -> None:
    last = months_of(demo)[1][0]
    drafts = Invoice.objects.filter(month=last).select_related("tenant")
    assert {i.tenant.slug for i in drafts} == {"acme", "globex"}
    for invoice in drafts:
        assert invoice.state == InvoiceState.DRAFT and invoice.number is None
        assert invoice.total > 0
        assert invoice.total == invoice.lines.aggregate(s=Sum("amount"))["s"]


def test_the_month_before_last_is_issued_and_acme_has_paid(demo):
    check_issued(demo)


def check_issued(demo: datetime) -> None:
    older = months_of(demo)[0][0]
    invoices = {i.tenant.slug: i for i in Invoice.objects.filter(month=older).select_related("tenant")}
    assert set(invoices) == {"acme", "globex"}
    assert invoices["acme"].state == InvoiceState.PAID and invoices["acme"].paid_at < demo
    assert invoices["globex"].state == InvoiceState.ISSUED and invoices["globex"].paid_at is None
    numbers = {i.number for i in invoices.values()}
    assert None not in numbers and len(numbers) == 2
    for invoice in invoices.values():
        assert invoice.created_at < invoice.issued_at < demo
        assert invoice.total == invoice.lines.aggregate(s=Sum("amount"))["s"]
        assert mail.send_invoice(invoice.pk) == mail.ALREADY_SENT  # e-mailed when it was issued


def test_both_tenants_have_a_billing_profile_one_in_korean(demo):
    profiles = {p.tenant.slug: p for p in BillingProfile.objects.select_related("tenant")}
    assert set(profiles) == {"acme", "globex"}
    for profile in profiles.values():
        assert all([profile.legal_name, profile.address, profile.tax_id, profile.cost_centre])
        assert all([profile.po_number, profile.contact_email])
    assert any("\uac00" <= ch <= "\ud7a3" for ch in profiles["acme"].legal_name)  # Hangul


def fleet_today():
    return (
        [(o.spec.id, o.available, o.total) for o in spec_offers()],
        capacity_summary(),
        sorted(
            SpecAndCount.objects.values_list(
                "node_id", "resource_name", "capacity", "allocatable", "allocated"
            )
        ),
        sorted(Allocation.objects.filter(released_at=None).values_list("pk", flat=True)),
    )


@pytest.mark.parametrize("moment", [None, FIRST_OF_JUNE])
def test_no_past_pool_holds_capacity_now(db, clock, moment):
    if moment:
        clock(moment)
    out = StringIO()
    for load in (load_portal, load_pools):
        with transaction.atomic():
            load(out)
    without_history = fleet_today()
    with transaction.atomic():
        load_billing(out)
    # The pools demo's three admitted pools (tests/portal/test_demo.py) are the only ones holding GPUs.
    assert Pool.objects.filter(released_at=None).count() == 3
    assert Pool.objects.count() == 3 + len(PAST_POOLS)
    assert not Allocation.objects.filter(released_at=None, pool__released_at__isnull=False).exists()
    assert fleet_today() == without_history


def table_counts() -> dict[str, int]:
    models = [*apps.get_app_config("billing").get_models(), *apps.get_app_config("pools").get_models()]
    return {model._meta.label: model.objects.count() for model in models}


def test_a_second_run_changes_nothing(demo):
    before = table_counts()
    stamps = list(
        Invoice.objects.order_by("pk").values_list("state", "number", "total", "issued_at", "paid_at")
    )
    out = load_demo()
    assert table_counts() == before
    assert (
        list(Invoice.objects.order_by("pk").values_list("state", "number", "total", "issued_at", "paid_at"))
        == stamps
    )
    assert "Billing: already there." in out.getvalue()


def test_metering_after_the_demo_writes_nothing_for_the_history_and_leaves_no_gap(demo):
    check_metering_carries_on(demo)


def check_metering_carries_on(demo: datetime) -> None:
    """The demo metered every period that has ended, from the history's first on: a metering run
    after it writes nothing for the history and carries on from there, without a gap."""
    (_m, first, _end), (_last, _start, this_month) = months_of(demo)
    period = timedelta(seconds=settings.METERING_PERIOD_SECONDS)
    history = UsageRecord.objects.filter(period_start__lt=this_month)
    records, periods = history.count(), MeteredPeriod.objects.filter(start__lt=this_month).count()
    reached = metered_until()
    assert reached >= this_month and MeteredPeriod.objects.count() == (reached - first) // period
    report = meter(now=timezone.now() + 2 * HOUR)
    assert history.count() == records
    assert MeteredPeriod.objects.filter(start__lt=this_month).count() == periods
    assert periods == (this_month - first) // period
    assert report.periods and report.periods[0] == reached


def test_on_the_first_of_a_month_in_seoul_the_history_is_the_two_months_before(db, clock):
    """Half an hour into June 1st in Seoul (still May 31st in UTC): April and May, complete."""
    clock(FIRST_OF_JUNE)
    load_demo()
    assert [m for m, _start, _end in months_of(FIRST_OF_JUNE)] == [date(2026, 4, 1), date(2026, 5, 1)]
    assert past_pools(FIRST_OF_JUNE).count() == len(PAST_POOLS)
    check_usage(FIRST_OF_JUNE)
    check_issued(FIRST_OF_JUNE)
    check_drafts(FIRST_OF_JUNE)
    check_metering_carries_on(FIRST_OF_JUNE)


def test_minute_periods_meter_the_two_months_in_bounded_transactions(db, clock, settings):
    """The shortest period the settings allow: the history's 88,000-odd minutes are metered in parts of
    a bounded size, each second once, and the month closes and invoices as with hourly periods."""
    settings.METERING_PERIOD_SECONDS = 60
    clock(FIRST_OF_JUNE)
    load_demo()
    with connection.cursor() as cursor:  # rows written by one transaction share its id, their xmin
        cursor.execute("SELECT count(*) FROM billing_meteredperiod GROUP BY xmin::text")
        parts = [count for (count,) in cursor.fetchall()]
    assert sum(parts) > 2 * 30 * 24 * 60 and max(parts) <= PERIODS_PER_TRANSACTION
    for pool in past_pools(FIRST_OF_JUNE).prefetch_related("request__items"):
        held = sum(item.count for item in pool.request.items.all())
        seconds = int((pool.released_at - pool.reserved_at).total_seconds())
        assert pool.usage.aggregate(s=Sum("seconds"))["s"] == held * seconds
    check_usage(FIRST_OF_JUNE)
    check_issued(FIRST_OF_JUNE)
    check_drafts(FIRST_OF_JUNE)
    check_metering_carries_on(FIRST_OF_JUNE)
