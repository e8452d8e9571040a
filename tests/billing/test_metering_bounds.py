"""Metering in transactions of a bounded size, whatever the period's length: a long catch-up of minute
periods holds one lock however many periods it meters (PostgreSQL's lock table holds 64 locks per
connection), commits them in parts of a bounded size, and every period length the settings allow
meters each second once at the price in force at its period's start."""

import os
import subprocess
import sys
from collections import Counter
from datetime import timedelta
from decimal import Decimal

import pytest
from django.core.exceptions import ImproperlyConfigured
from django.db import connection, transaction
from django.db.models import Sum
from django.utils import timezone

from billing import services
from billing.apps import check_metering
from billing.metering import whole_seconds
from billing.models import MeteredPeriod, UsageRecord
from billing.prices import metered_until
from billing.services import meter
from billing.tasks import meter_usage
from pools.models import PoolState
from tests.factories import PoolFactory, PriceFactory, ProjectFactory

MINUTE, DAY = 60, timedelta(days=1)
SPEC, FULL = "h100-80gb.mig-1g.10gb", "h100-80gb.full"
# Every period length the settings allow.
PERIODS = [period for period in range(60, 3601) if 3600 % period == 0]


@pytest.fixture
def minutes(settings):
    settings.METERING_PERIOD_SECONDS, settings.METERING_DELAY_SECONDS = MINUTE, 60


def advisory_locks() -> int:
    """The advisory locks this connection holds."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND pid = pg_backend_pid()")
        return cursor.fetchone()[0]


def per_transaction(model) -> list[int]:
    """Rows of the model each transaction (or savepoint) wrote, oldest first: rows written by one share
    its transaction id, their `xmin`."""
    with connection.cursor() as cursor:
        cursor.execute(f"SELECT count(*) FROM {model._meta.db_table} GROUP BY xmin::text ORDER BY min(id)")
        return [count for (count,) in cursor.fetchall()]


def metered_seconds(pool) -> int:
    return UsageRecord.objects.filter(pool=pool).aggregate(total=Sum("seconds"))["total"] or 0


def held_seconds(pool, until) -> int:
    end = until if pool.released_at is None else min(pool.released_at, until)
    items = sum(item.count for item in pool.request.items.all())
    return items * max(0, whole_seconds(end) - whole_seconds(pool.reserved_at))


def test_a_long_outage_of_minute_periods_is_caught_up_under_one_lock(db, minutes):
    now = timezone.now()
    outage = 10 * DAY  # 14,400 periods: a lock each overflows the lock table of a default PostgreSQL
    project = ProjectFactory()
    pools = [
        PoolFactory(
            allocated=True,
            project=project,
            request__items=[(SPEC, 2), (FULL, 1)],
            reserved_at=now - outage,
        ),
        PoolFactory(
            allocated=True,
            project=project,
            request__items=[(SPEC, 3)],
            state=PoolState.RELEASED,
            reserved_at=now - 7 * DAY + timedelta(seconds=12.5),
            released_at=now - 2 * DAY - timedelta(seconds=7.25),
        ),
    ]
    with transaction.atomic():  # as `manage.py demo` meters its history: inside one transaction
        report = meter(now=now)
        assert advisory_locks() == 1
    assert len(report.periods) == MeteredPeriod.objects.count() >= 10 * 24 * 60 - 1
    for pool in pools:
        assert metered_seconds(pool) == held_seconds(pool, metered_until())


def test_the_periodic_task_catches_up_in_parts_of_a_bounded_size(db, minutes, monkeypatch):
    """Two days of minute periods behind: sixteen pools held in the first day give more records than
    one part may write, one pool in the second day fewer. Every part stays within both bounds."""
    now = timezone.now()
    monkeypatch.setattr(timezone, "now", lambda: now)  # the task's clock: no minute ends meanwhile
    project = ProjectFactory()
    busy = [
        PoolFactory(
            allocated=True,
            project=project,
            request__items=[(SPEC, 1)],
            state=PoolState.RELEASED,
            reserved_at=now - 2 * DAY,
            released_at=now - DAY,
        )
        for _ in range(16)
    ]
    calm = PoolFactory(allocated=True, project=project, request__items=[(FULL, 2)], reserved_at=now - DAY)
    assert meter_usage().startswith("metered ")
    periods, records = per_transaction(MeteredPeriod), per_transaction(UsageRecord)
    assert max(records) <= services.RECORDS_PER_TRANSACTION
    # Neither a transaction a period nor one for all: the busy day is cut by its records, then a part is
    # cut by its periods, and the rest up to the last minute that has ended (the delay) follows.
    busy_part, most = services.RECORDS_PER_TRANSACTION // 16, services.PERIODS_PER_TRANSACTION
    assert periods == [busy_part, most, 2 * 24 * 60 - 1 - busy_part - most]
    for pool in [*busy, calm]:
        assert metered_seconds(pool) == held_seconds(pool, metered_until())


@pytest.mark.parametrize("period", PERIODS)
def test_every_period_length_allowed_meters_each_second_once_at_its_price(db, settings, period):
    settings.METERING_PERIOD_SECONDS = period
    now = timezone.now()
    change = now - DAY - timedelta(seconds=17.5)  # inside a period of any length
    PriceFactory(gpu_model="H100-80GB", profile="1g.10gb", hourly_price=Decimal("600"),
                 valid_from=now - 3 * DAY, valid_to=change)  # fmt: skip
    PriceFactory(gpu_model="H100-80GB", profile="1g.10gb", hourly_price=Decimal("650"), valid_from=change)
    project = ProjectFactory()
    pools = [
        PoolFactory(allocated=True, project=project, request__items=[(SPEC, 2), (FULL, 1)],
                    reserved_at=now - 2 * DAY + timedelta(seconds=0.25)),
        PoolFactory(allocated=True, project=project, request__items=[(SPEC, 3)], state=PoolState.RELEASED,
                    reserved_at=now - 30 * timedelta(hours=1), released_at=now - DAY + timedelta(seconds=41)),
    ]  # fmt: skip
    meter(now=now)
    meter(now=now)  # a second run writes nothing more
    starts = sorted(whole_seconds(start) for start in MeteredPeriod.objects.values_list("start", flat=True))
    assert starts == list(range(starts[0], starts[-1] + period, period))  # none skipped, none twice
    for pool in pools:
        assert metered_seconds(pool) == held_seconds(pool, metered_until())
    # The price in force at the period's start: a change inside a period applies from the next one.
    prices = dict(UsageRecord.objects.filter(profile="1g.10gb").values_list("period_start", "unit_price"))
    assert prices == {start: Decimal("600") if start < change else Decimal("650") for start in prices}
    assert set(prices.values()) == {Decimal("600"), Decimal("650")}
    written = Counter(UsageRecord.objects.values_list("period_start", flat=True))
    assert all(
        count == written[start] for start, count in MeteredPeriod.objects.values_list("start", "records")
    )


@pytest.mark.parametrize("period", [0, -60, 1, 30, 59, 61, 7, 7200, 5400])
def test_a_period_that_is_too_short_or_does_not_divide_an_hour_is_refused(period):
    with pytest.raises(
        ImproperlyConfigured, match=f"METERING_PERIOD_SECONDS must be at least 60 .* not {period}"
    ):
        check_metering(period, 60)


def test_a_negative_delay_is_refused_and_every_allowed_setting_accepted():
    with pytest.raises(ImproperlyConfigured, match="METERING_DELAY_SECONDS must be 0 or more, not -1"):
        check_metering(3600, -1)
    for period in PERIODS:
        check_metering(period, 0)
    assert PERIODS[0] == 60 and PERIODS[-1] == 3600


def test_the_portal_refuses_to_start_with_a_period_it_cannot_meter(settings):
    started = subprocess.run(
        [sys.executable, "manage.py", "check"],
        cwd=settings.BASE_DIR,
        env={**os.environ, "METERING_PERIOD_SECONDS": "30"},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert started.returncode != 0
    assert "METERING_PERIOD_SECONDS must be at least 60 and divide 3600" in started.stderr
