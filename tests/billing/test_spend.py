"""What pools cost as it accrues: the figure shown before metering is the amount metering writes after,
the projection adds the hourly rate for the rest of the month, and the pages show it to every member
in a fixed number of queries."""

from datetime import UTC, datetime, timedelta
from decimal import Decimal

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.urls import reverse
from django.utils import timezone

from billing import spend
from billing.models import UsageRecord
from billing.selectors import month_bounds
from billing.services import meter
from pools.models import Pool
from tests.factories import PoolFactory, PriceFactory, ProjectFactory

# November 2026 in Seoul: from 2026-10-31 15:00 UTC to 2026-11-30 15:00 UTC.
MONTH_START = datetime(2026, 10, 31, 15, tzinfo=UTC)
MONTH_END = datetime(2026, 11, 30, 15, tzinfo=UTC)
NOW = datetime(2026, 11, 10, 3, tzinfo=UTC)  # a period boundary
PRICE_CHANGE = datetime(2026, 11, 9, 20, 30, tzinfo=UTC)  # half-way through a period


def hours(n: float) -> timedelta:
    return timedelta(hours=n)


@pytest.fixture
def prices(db):
    long_ago = MONTH_START - timedelta(days=60)
    PriceFactory(gpu_model="H100-80GB", profile="full", hourly_price=Decimal("4200"), valid_from=long_ago)
    PriceFactory(
        gpu_model="H100-80GB",
        profile="1g.10gb",
        hourly_price=Decimal("600.5"),
        valid_from=long_ago,
        valid_to=PRICE_CHANGE,
    )
    PriceFactory(
        gpu_model="H100-80GB", profile="1g.10gb", hourly_price=Decimal("750.25"), valid_from=PRICE_CHANGE
    )


@pytest.fixture
def pools(prices, tenancy):
    """Pools of acme's vision that start before the month, end inside it, cross the price change, and
    are still held; and one of globex, which no acme figure includes."""
    return {
        "since_october": PoolFactory(
            allocated=True,
            project=tenancy.vision,
            request__items=[("h100-80gb.full", 2)],
            reserved_at=datetime(2026, 10, 31, 12, 17, 5, 400000, tzinfo=UTC),
        ),
        "across_the_change": PoolFactory(
            allocated=True,
            project=tenancy.vision,
            request__items=[("h100-80gb.mig-1g.10gb", 3), ("h100-80gb.full", 1)],
            reserved_at=datetime(2026, 11, 9, 10, 0, 30, tzinfo=UTC),
            released_at=datetime(2026, 11, 9, 23, 45, 10, 900000, tzinfo=UTC),
            state="released",
        ),
        "metered_already": PoolFactory(
            allocated=True,
            project=tenancy.vision,
            request__items=[("h100-80gb.full", 1)],
            reserved_at=datetime(2026, 11, 5, tzinfo=UTC),
            released_at=datetime(2026, 11, 6, 0, 0, 17, tzinfo=UTC),
            state="released",
        ),
        "elsewhere": PoolFactory(
            allocated=True,
            project__tenant=tenancy.globex,
            request__items=[("h100-80gb.full", 4)],
            reserved_at=datetime(2026, 11, 2, tzinfo=UTC),
        ),
    }


def written(pool: Pool, *, since: datetime | None = None) -> Decimal:
    """The exact amount of the pool's usage records (from `since`), as invoices sum them."""
    records = UsageRecord.objects.filter(pool=pool)
    if since is not None:
        records = records.filter(period_start__gte=since)
    assert records.exists()
    return sum((record.seconds * record.unit_price for record in records), Decimal(0)) / Decimal(3600)


def test_cost_to_date_is_what_metering_writes_for_the_same_time(pools, tenancy):
    meter(now=datetime(2026, 11, 8, 0, 1, tzinfo=UTC))  # part metered, part not yet
    before = spend.pool_spend(pools=Pool.objects.filter(project=tenancy.vision), now=NOW, ever=True)
    assert set(before) == {
        pools[name].pk for name in ("since_october", "across_the_change", "metered_already")
    }

    meter(now=NOW + timedelta(minutes=1))  # metering reaches NOW
    for name in ("since_october", "across_the_change", "metered_already"):
        pool = pools[name]
        assert before[pool.pk].to_date == written(pool, since=MONTH_START), name
        assert before[pool.pk].since_reserved == written(pool), name
    # the project's figure is the exact sum of its records, not a sum of rounded parts
    vision = UsageRecord.objects.filter(pool__project=tenancy.vision, period_start__gte=MONTH_START)
    exact = sum((record.seconds * record.unit_price for record in vision), Decimal(0)) / Decimal(3600)
    assert spend.total(before.values()).to_date == exact
    assert exact % 1  # a fraction of a won, which only the display rounds away


def test_a_tail_counted_at_the_price_in_force_at_each_periods_start(prices, tenancy):
    pool = PoolFactory(
        allocated=True,
        project=tenancy.vision,
        request__items=[("h100-80gb.mig-1g.10gb", 1)],
        reserved_at=PRICE_CHANGE - hours(1),
        released_at=PRICE_CHANGE + hours(1),
        state="released",
    )
    found = spend.pool_spend(pools=Pool.objects.filter(pk=pool.pk), now=NOW)[pool.pk]
    # 19:30–20:00 and 20:00–21:00 at the old price (their periods began before the change), 21:00–21:30 new
    expected = (Decimal(1800 + 3600) * Decimal("600.5") + Decimal(1800) * Decimal("750.25")) / 3600
    assert found.to_date == expected
    meter(now=NOW + timedelta(minutes=1))
    assert written(pool) == expected


def test_the_projection_adds_the_hourly_rate_for_the_rest_of_the_month(prices, tenancy):
    held = PoolFactory(
        allocated=True,
        project=tenancy.vision,
        request__items=[("h100-80gb.full", 2)],
        reserved_at=MONTH_START,
    )
    released = PoolFactory(
        allocated=True,
        project=tenancy.vision,
        request__items=[("h100-80gb.full", 1)],
        reserved_at=MONTH_START + hours(1),
        released_at=MONTH_START + hours(4),
        state="released",
    )
    found = spend.pool_spend(pools=Pool.objects.filter(project=tenancy.vision), now=NOW)

    to_now, left = 228, 492  # hours from the month's start to NOW, and from NOW to the month's end
    assert (hours(to_now), hours(left)) == (NOW - MONTH_START, MONTH_END - NOW)
    assert found[held.pk].to_date == 2 * 4200 * to_now
    assert found[held.pk].rate == 2 * 4200 and found[held.pk].holding
    assert found[held.pk].projected == 2 * 4200 * (to_now + left)
    assert (found[released.pk].to_date, found[released.pk].rate, found[released.pk].holding) == (
        3 * 4200,
        0,
        False,
    )
    assert found[released.pk].projected == 3 * 4200  # billing stopped at release

    both = spend.figures(spend.total(found.values()))
    assert (both.to_date, both.hourly, both.projected) == (
        Decimal(2 * 4200 * to_now + 3 * 4200),
        Decimal(8400),
        Decimal(2 * 4200 * (to_now + left) + 3 * 4200),
    )


def test_figures_are_rounded_once_to_the_minor_unit(prices, tenancy, settings):
    pool = PoolFactory(
        allocated=True,
        project=tenancy.vision,
        request__items=[("h100-80gb.mig-1g.10gb", 1)],
        reserved_at=NOW - timedelta(seconds=1801),
    )
    found = spend.pool_spend(pools=Pool.objects.filter(pk=pool.pk), now=NOW)[pool.pk]
    assert found.to_date == Decimal(1801) * Decimal("750.25") / 3600  # exact: 375.33...
    assert spend.figures(found).to_date == Decimal("375")  # KRW has no minor digits
    settings.BILLING_CURRENCY = "USD"
    assert spend.figures(found).to_date == Decimal("375.33")
    assert spend.figures(found).hourly == Decimal("750.25")


def test_a_missing_price_makes_the_figure_unknown_not_smaller(prices, tenancy):
    unpriced = PoolFactory(
        allocated=True,
        project=tenancy.vision,
        request__items=[("h100-80gb.mig-2g.20gb", 1)],
        reserved_at=NOW - hours(3),
    )
    priced = PoolFactory(
        allocated=True,
        project=tenancy.vision,
        request__items=[("h100-80gb.full", 1)],
        reserved_at=NOW - hours(3),
    )
    found = spend.pool_spend(pools=Pool.objects.filter(project=tenancy.vision), now=NOW)
    assert (found[unpriced.pk].to_date, found[unpriced.pk].rate, found[unpriced.pk].projected) == (
        None,
        None,
        None,
    )
    assert found[priced.pk].to_date == 3 * 4200
    shown = spend.figures(spend.total(found.values()))
    assert (shown.to_date, shown.hourly, shown.projected) == (None, None, None)
    ended = PoolFactory(
        allocated=True,
        project=tenancy.vision,
        request__items=[("h100-80gb.mig-2g.20gb", 1)],
        reserved_at=NOW - hours(3),
        released_at=NOW - hours(2),
        state="released",
    )
    meter(now=NOW + timedelta(minutes=1))  # once metered (its unit price empty) it stays unknown
    assert UsageRecord.objects.filter(pool=ended, unit_price__isnull=True).exists()
    again = spend.pool_spend(pools=Pool.objects.filter(pk=ended.pk), now=NOW + timedelta(minutes=1))
    assert (again[ended.pk].to_date, again[ended.pk].since_reserved, again[ended.pk].rate) == (None, None, 0)


def test_only_this_month_counts_and_the_month_is_the_billing_time_zones(prices, tenancy):
    october = PoolFactory(
        allocated=True,
        project=tenancy.vision,
        request__items=[("h100-80gb.full", 1)],
        reserved_at=MONTH_START - hours(5),
        released_at=MONTH_START
        - hours(1),  # 2026-10-31 14:00 UTC is November 1st, midnight less 1h, in Seoul
        state="released",
    )
    assert spend.pool_spend(pools=Pool.objects.filter(pk=october.pk), now=NOW) == {}
    ever = spend.pool_spend(pools=Pool.objects.filter(pk=october.pk), now=NOW, ever=True)[october.pk]
    assert (ever.since_reserved, ever.to_date) == (4 * 4200, 0)


def test_no_query_per_pool(prices, tenancy, django_assert_max_num_queries):
    for index in range(12):
        project = tenancy.vision if index % 2 else ProjectFactory(tenant=tenancy.acme)
        PoolFactory(
            allocated=True,
            project=project,
            request__items=[("h100-80gb.full", 1)],
            reserved_at=NOW - hours(index + 1),
        )
    meter(now=NOW - hours(4) + timedelta(minutes=1))
    with django_assert_max_num_queries(5):
        found = spend.pool_spend(pools=Pool.objects.filter(project__tenant=tenancy.acme), now=NOW, ever=True)
    assert len(found) == 12


@pytest.fixture
def frozen(monkeypatch):
    """The clock of pages stands at NOW."""
    monkeypatch.setattr(timezone, "now", lambda: NOW)
    return NOW


def test_every_member_sees_the_cost_on_the_tenant_project_and_pool_pages(prices, tenancy, frozen, client_for):
    pool = PoolFactory(
        allocated=True,
        project=tenancy.vision,
        request__items=[("h100-80gb.full", 2)],
        reserved_at=NOW - hours(5),
    )
    client = client_for(tenancy.acme_viewer)

    tenant = client.get(reverse("tenant", kwargs={"slug": "acme"})).content.decode()
    project = client.get(
        reverse("project", kwargs={"tenant_slug": "acme", "slug": "vision"})
    ).content.decode()
    pool_page = client.get(reverse("pool", kwargs={"tenant_slug": "acme", "pk": pool.pk})).content.decode()
    to_date, rate, projected = "42,000", "8,400", f"{2 * 4200 * (5 + 492):,}"  # grouped, as shown
    for page in (tenant, project, pool_page):
        assert "2026-11" in page
        for figure in (to_date, rate, projected):
            assert figure in page
    assert tenant.index("Projects") < tenant.index("Cost in 2026-11") < tenant.index("Members")
    assert f'href="{reverse("pool", kwargs={"tenant_slug": "acme", "pk": pool.pk})}"' in project
    assert "Since reserved" in pool_page


def test_a_released_pool_says_billing_stopped(prices, tenancy, frozen, client_for):
    pool = PoolFactory(
        allocated=True,
        project=tenancy.vision,
        request__items=[("h100-80gb.full", 1)],
        reserved_at=NOW - hours(5),
        released_at=NOW - hours(2),
        state="released",
    )
    page = client_for(tenancy.acme_member).get(reverse("pool", kwargs={"tenant_slug": "acme", "pk": pool.pk}))
    text = page.content.decode()
    assert "Billing stopped" in text and "Per hour now" not in text and "12,600" in text


def test_a_missing_price_shows_a_dash(prices, tenancy, frozen, client_for):
    PoolFactory(
        allocated=True,
        project=tenancy.vision,
        request__items=[("h100-80gb.mig-2g.20gb", 1)],
        reserved_at=NOW - hours(1),
    )
    page = client_for(tenancy.acme_viewer).get(reverse("tenant", kwargs={"slug": "acme"})).content.decode()
    section = page[page.index("Cost in 2026-11") :]
    assert '<td class="num">—</td>' in section


def test_the_sections_do_not_query_per_row(prices, tenancy, frozen, client_for):
    def queries(path: str) -> int:
        with CaptureQueriesContext(connection) as captured:
            assert client.get(path).status_code == 200
        return len(captured)

    client = client_for(tenancy.acme_viewer)
    tenant_page = reverse("tenant", kwargs={"slug": "acme"})
    project_page = reverse("project", kwargs={"tenant_slug": "acme", "slug": "vision"})
    PoolFactory(allocated=True, project=tenancy.vision, reserved_at=NOW - hours(2))
    few = queries(tenant_page), queries(project_page)
    for index in range(8):
        PoolFactory(allocated=True, project=tenancy.vision, reserved_at=NOW - hours(index + 1))
        PoolFactory(
            allocated=True,
            project=ProjectFactory(tenant=tenancy.acme),
            reserved_at=NOW - hours(index + 1),
        )
    assert (queries(tenant_page), queries(project_page)) == few


def test_month_bounds_match_the_figures_month(db):
    assert month_bounds(None, now=NOW) == (MONTH_START, MONTH_END)


def test_a_long_cost_table_pages_with_its_own_parameter(prices, tenancy, frozen, client_for):
    made = [
        PoolFactory(allocated=True, project=tenancy.vision, reserved_at=NOW - hours(1) - timedelta(minutes=i))
        for i in range(21)
    ]
    client = client_for(tenancy.acme_viewer)
    url = reverse("project", kwargs={"tenant_slug": "acme", "slug": "vision"})
    first = client.get(url).content.decode()
    first = first[first.index("Cost in 2026-11") :]
    assert "Page 1 of 2" in first and "?spend_page=2" in first
    assert f"#{made[0].pk}<" in first and f"#{made[-1].pk}<" not in first
    second = client.get(url, {"spend_page": 2}).content.decode()
    second = second[second.index("Cost in 2026-11") :]
    assert f"#{made[-1].pk}<" in second and "Page 2 of 2" in second
    assert f"{21 * 4200:,}" in second  # the project's total counts every page
