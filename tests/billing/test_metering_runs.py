"""Metering against the database: exactly once whatever the runs (repeated, late, concurrent on
separate connections), with the price in force copied, and billing stopping when capacity is freed."""

import threading
from datetime import UTC, datetime, timedelta
from decimal import Decimal

import pytest
from django.core.management import call_command
from django.db import connection, transaction
from django.db.models import Sum
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from billing.metering import whole_seconds
from billing.models import MeteredPeriod, Price, UsageRecord
from billing.services import meter, metering_lag
from pools.models import PoolState
from tests.examples import examples
from tests.factories import PoolFactory, PriceFactory, ProjectFactory

HOUR = timedelta(hours=1)
# 2026-11-30 15:00 UTC is midnight of 1 December in Seoul: a month end in the billing time zone.
MONTH_END = datetime(2026, 11, 30, 15, tzinfo=UTC)
SPEC = "h100-80gb.mig-1g.10gb"
times = st.integers(-36 * 3600 * 10**6, 36 * 3600 * 10**6).map(
    lambda us: MONTH_END + timedelta(microseconds=us)
)


def metered_seconds(pool) -> int:
    return UsageRecord.objects.filter(pool=pool).aggregate(total=Sum("seconds"))["total"] or 0


def exact(pool, count: int, until: datetime) -> int:
    end = pool.released_at if pool.released_at is not None else until
    return count * max(0, whole_seconds(min(end, until)) - whole_seconds(pool.reserved_at))


@st.composite
def pool_times(draw) -> tuple[datetime, datetime | None, int]:
    reserved = draw(times)
    released = draw(st.one_of(st.none(), times.filter(lambda t: t >= reserved)))
    return reserved, released, draw(st.integers(1, 7))


@settings(
    max_examples=examples(40),
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(st.lists(pool_times(), min_size=1, max_size=4), st.lists(times, max_size=5))
def test_every_pool_is_metered_for_exactly_the_seconds_it_held(db, pools, runs):
    with transaction.atomic():
        project = ProjectFactory()
        made = [
            (
                PoolFactory(
                    allocated=True,
                    project=project,
                    request__items=[(SPEC, count)],
                    state=PoolState.RELEASED if released else PoolState.ACTIVE,
                    reserved_at=reserved,
                    released_at=released,
                ),
                count,
            )
            for reserved, released, count in pools
        ]
        for now in sorted(runs):  # late, repeated or early: the clock only moves forward
            meter(now=now)
            meter(now=now)  # a second run at once writes nothing more
        final = MONTH_END + timedelta(days=3)
        meter(now=final)
        until = MeteredPeriod.objects.order_by("-start").first().start + HOUR
        for pool, count in made:
            assert metered_seconds(pool) == exact(pool, count, until)
        transaction.set_rollback(True)


def test_the_price_in_force_at_each_period_is_copied_and_a_later_change_rewrites_nothing(db):
    start = MONTH_END - 3 * HOUR
    PriceFactory(gpu_model="H100-80GB", profile="1g.10gb", hourly_price=Decimal("600"),
                 valid_from=start - HOUR, valid_to=MONTH_END)  # fmt: skip
    PriceFactory(gpu_model="H100-80GB", profile="1g.10gb", hourly_price=Decimal("650"), valid_from=MONTH_END)
    pool = PoolFactory(allocated=True, request__items=[(SPEC, 2)], reserved_at=start, released_at=None)
    meter(now=MONTH_END + 2 * HOUR + timedelta(minutes=5))
    records = UsageRecord.objects.filter(pool=pool).order_by("period_start")
    prices = list(records.values_list("unit_price", flat=True))
    assert prices == [Decimal("600")] * 3 + [Decimal("650")] * 2
    Price.objects.update(hourly_price=Decimal("999"))  # however a price is changed afterwards
    assert list(records.values_list("unit_price", flat=True)) == prices
    assert metered_seconds(pool) == 2 * 5 * 3600


def test_a_run_after_an_outage_catches_up_and_the_lag_shows_it(db):
    pool = PoolFactory(allocated=True, request__items=[(SPEC, 1)], reserved_at=MONTH_END, released_at=None)
    meter(now=MONTH_END + HOUR + timedelta(minutes=2))
    assert metering_lag(now=MONTH_END + HOUR + timedelta(minutes=2)) == timedelta(0)
    later = MONTH_END + timedelta(days=3, minutes=2)
    # The oldest period waiting ended at MONTH_END + 2 h, and was due a minute (the delay) later.
    assert metering_lag(now=later) == later - (MONTH_END + 2 * HOUR) - timedelta(minutes=1)
    report = meter(now=later)
    assert len(report.periods) == 3 * 24 - 1 and report.records == 3 * 24 - 1
    assert metering_lag(now=later) == timedelta(0)
    assert metered_seconds(pool) == 3 * 24 * 3600


def test_the_command_meters_now_and_says_how_far_behind(db, capsys):
    PoolFactory(
        allocated=True,
        request__items=[(SPEC, 1)],
        reserved_at=datetime.now(UTC) - 3 * HOUR,
        released_at=None,
    )
    call_command("meter")
    out = capsys.readouterr().out
    assert "metered 3 period(s)" in out or "metered 2 period(s)" in out  # the third ends within the delay
    assert "metering lag: 0 s" in out
    call_command("meter")
    assert "nothing to meter" in capsys.readouterr().out


@pytest.mark.django_db(transaction=True, serialized_rollback=True)
def test_concurrent_runs_on_separate_connections_write_each_record_once():
    project = ProjectFactory()
    pools = [
        PoolFactory(
            allocated=True,
            project=project,
            request__items=[(SPEC, n % 3 + 1)],
            reserved_at=MONTH_END - n * HOUR / 7,
            released_at=None,
        )
        for n in range(20)
    ]
    now = MONTH_END + 6 * HOUR
    barrier = threading.Barrier(4)
    failures = []

    def run():
        try:
            barrier.wait()
            meter(now=now)
        except Exception as error:  # reported below, with the thread's own traceback lost
            failures.append(error)
        finally:
            connection.close()

    threads = [threading.Thread(target=run) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert failures == []
    until = MeteredPeriod.objects.order_by("-start").first().start + HOUR
    assert MeteredPeriod.objects.count() == len({p.start for p in MeteredPeriod.objects.all()})
    for n, pool in enumerate(pools):
        assert metered_seconds(pool) == exact(pool, n % 3 + 1, until)


def test_billing_stops_when_the_capacity_is_freed_not_when_the_release_finishes(db, tenancy):
    from pools.services import release_pool

    pool = PoolFactory(allocated=True, project=tenancy.vision, request__submitted_by=tenancy.acme_member,
                       reserved_at=datetime.now(UTC) - 2 * HOUR)  # fmt: skip
    before = datetime.now(UTC)
    released = release_pool(pool_id=pool.pk, user=tenancy.acme_member)
    assert released.state == PoolState.RELEASING
    assert released.released_at is not None and released.released_at >= before
