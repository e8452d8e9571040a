"""Billing's state changes: metering (usage records per pool, spec and period) and prices.

Metering reads each ended period's holdings (the allocations held in it, each from its own reservation to
its own release or its pool's end date), counts their seconds with `billing.metering`, copies the price in
force at the period's start, and writes the records with the unique constraint as the guard: a second,
concurrent or late run writes nothing twice. Periods are metered oldest first, from the one after the last
metered period, so a run after an outage catches up on every period it missed.

However many periods a run meters (two months of minute periods for the demo's history, or the
catch-up after a long outage), it meters them in transactions of a bounded size: at most
PERIODS_PER_TRANSACTION periods and, past the first period, RECORDS_PER_TRANSACTION records each,
read with one query for the pools, one for the prices and one for what is metered already, and
written in bulk. Each transaction takes the one metering lock (the same lock however often a
transaction takes it, so that a caller's outer transaction holds one lock, not one per period):
runs queue up there, and the later one finds the periods metered and writes nothing for them.
"""

from __future__ import annotations

import logging
from bisect import bisect_right
from collections import Counter
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from django.db import connection, transaction
from django.db.models import Count, Min, Q, QuerySet
from django.utils import timezone
from django.utils.translation import gettext_noop

from billing import metering
from billing.conf import settings
from billing.models import MeteredPeriod, Price, PriceList
from billing.prices import check_price, in_force_over, metered_until
from pools.models import Allocation, Pool
from portal import audit

log = logging.getLogger(__name__)

METERING_LOCK = 0x6D6574  # the advisory lock key of metering: "met"
# The most one metering transaction covers: its periods, and the records of all but its first period.
PERIODS_PER_TRANSACTION = 1440
RECORDS_PER_TRANSACTION = 20_000


@dataclass
class MeteringReport:
    periods: list[datetime] = field(default_factory=list)
    records: int = 0

    def summary(self) -> str:
        if not self.periods:
            return "nothing to meter"
        first, last = self.periods[0], self.periods[-1]
        span = f"{first:%Y-%m-%d %H:%M} to {last:%Y-%m-%d %H:%M} UTC"
        return f"metered {len(self.periods)} period(s) {span}: {self.records} records"


def first_unmetered() -> int | None:
    """Start (epoch seconds) of the oldest period not metered yet, or None when nothing was ever held."""
    until = metered_until()
    if until is not None:
        return metering.whole_seconds(until)
    earliest = Pool.objects.aggregate(first=Min("reserved_at"))["first"]
    period = settings.METERING_PERIOD_SECONDS
    return None if earliest is None else metering.period_start(metering.whole_seconds(earliest), period)


def meter(*, now: datetime | None = None) -> MeteringReport:
    """Meter every period that has ended (METERING_DELAY_SECONDS ago) and is not metered yet."""
    now = now or timezone.now()
    report = MeteringReport()
    first = first_unmetered()
    if first is None:
        return report
    period = settings.METERING_PERIOD_SECONDS
    delay = settings.METERING_DELAY_SECONDS
    starts = metering.ended_periods(first, metering.whole_seconds(now), period, delay)
    report.records = meter_periods(starts=starts)
    report.periods = [metering.moment(start) for start in starts]
    if report.periods:
        log.info("%s", report.summary())
    return report


def meter_period(start: int) -> int:
    """Write the usage records of one period; returns how many this run wrote (0 when done before)."""
    period = settings.METERING_PERIOD_SECONDS
    return meter_periods(starts=range(start, start + period, period))


def meter_periods(*, starts: range) -> int:
    """Meter these periods (starts of METERING_PERIOD_SECONDS periods, oldest first), each transaction
    a bounded part of them; returns how many records this run wrote (none for a period done before).
    Interrupted, it leaves whole periods metered and the rest not, each part committed as it ends."""
    period = settings.METERING_PERIOD_SECONDS
    if starts and (starts.step != period or starts.start % period):
        raise ValueError(f"{starts} are not starts of {period}-second periods")
    written = 0
    while starts:
        done, records = _meter_part(starts[:PERIODS_PER_TRANSACTION])
        written += records
        starts = starts[len(done) :]
    return written


def _meter_part(starts: range) -> tuple[range, int]:
    """Meter the leading part of `starts` that RECORDS_PER_TRANSACTION allows, in one transaction;
    returns that part and the records written."""
    begins, ends = metering.moment(starts.start), metering.moment(starts.stop)
    with transaction.atomic():
        # Runs queue up here; the later one finds the periods metered and writes nothing for them.
        with connection.cursor() as cursor:
            cursor.execute("SELECT pg_advisory_xact_lock(%s)", [METERING_LOCK])
        holdings = allocation_holdings(begins=begins, ends=ends)
        part = metering.bounded(holdings, starts, RECORDS_PER_TRANSACTION)
        last = metering.moment(part[-1])
        done = {
            metering.whole_seconds(start)
            for start in MeteredPeriod.objects.filter(start__gte=begins, start__lte=last).values_list(
                "start", flat=True
            )
        }
        todo = [start for start in part if start not in done]
        if not todo:
            return part, 0
        usages = [u for u in metering.usage_in_periods(holdings, part) if u.period_start not in done]
        _write(usages, todo, prices=in_force_over(begins, last))
    return part, len(usages)


def allocation_holdings(
    *, begins: datetime, ends: datetime, pools: QuerySet | None = None
) -> list[metering.Holding]:
    """What the allocations of every pool (or of `pools`) held in [begins, ends): each allocation from its
    own reservation to its own release, or to its pool's end date where that comes first, so that billing
    stops exactly at the end even before the pool is released (the sweeper runs late, or the workers were
    down). Allocations of one pool and spec reserved and released together are one holding of their count."""
    rows = Allocation.objects.filter(
        Q(released_at__isnull=True) | Q(released_at__gt=begins), allocated_at__lt=ends
    )
    if pools is not None:
        rows = rows.filter(pool__in=pools)
    found = (
        rows.values_list("pool_id", "gpu__model", "profile", "allocated_at", "released_at", "pool__end_at")
        .annotate(count=Count("id"))
        .order_by()
    )
    return [
        metering.Holding(
            pool_id,
            model,
            profile,
            count,
            metering.whole_seconds(reserved),
            _seconds(released),
            _seconds(end),
        )
        for pool_id, model, profile, reserved, released, end, count in found
    ]


def _seconds(moment: datetime | None) -> int | None:
    return None if moment is None else metering.whole_seconds(moment)


# Rows travel as one array per column: a model instance per row would cost more than the rest of
# metering together. The unique constraint stays the last guard, should a record exist without its period.
_INSERT_USAGE = """
    INSERT INTO billing_usagerecord
        (pool_id, gpu_model, profile, period_start, count, seconds, unit_price, currency, metered_at)
    SELECT pool_id, gpu_model, profile, to_timestamp(period_start), count, seconds, unit_price, %s, %s
    FROM unnest(
        %s::bigint[], %s::text[], %s::text[], %s::bigint[], %s::integer[], %s::integer[], %s::numeric[]
    ) AS t(pool_id, gpu_model, profile, period_start, count, seconds, unit_price)
    ON CONFLICT DO NOTHING
"""
_INSERT_PERIODS = """
    INSERT INTO billing_meteredperiod (start, records, metered_at)
    SELECT to_timestamp(start), records, %s FROM unnest(%s::bigint[], %s::integer[]) AS t(start, records)
"""


def _write(usages: list[metering.Usage], starts: list[int], *, prices: list[tuple[datetime, dict]]) -> None:
    """Write the usages, with the price in force at each one's period start (`prices` as
    `in_force_over` gives them), and mark the periods `starts` metered."""
    since = [at.timestamp() for at, _table in prices]
    tables = [table for _at, table in prices]
    columns: list[list] = [[], [], [], [], [], [], []]
    for usage in usages:
        price = tables[bisect_right(since, usage.period_start) - 1].get((usage.gpu_model, usage.profile))
        row = (usage.pool_id, usage.gpu_model, usage.profile, usage.period_start, usage.count, usage.seconds)
        for column, value in zip(columns, (*row, price), strict=True):
            column.append(value)
    per_period = Counter(usage.period_start for usage in usages)
    now = timezone.now()
    with connection.cursor() as cursor:
        if usages:
            cursor.execute(_INSERT_USAGE, [settings.BILLING_CURRENCY, now, *columns])
        cursor.execute(_INSERT_PERIODS, [now, starts, [per_period[start] for start in starts]])


def metering_lag(*, now: datetime | None = None) -> timedelta:
    """How long ago the oldest period that could be metered ended (zero when metering is up to date)."""
    now = now or timezone.now()
    first = first_unmetered()
    if first is None:
        return timedelta(0)
    ended = metering.moment(first + settings.METERING_PERIOD_SECONDS)
    behind = now - ended - timedelta(seconds=settings.METERING_DELAY_SECONDS)
    return max(behind, timedelta(0))


def add_price(
    *, price_list: PriceList, gpu_model: str, profile: str, hourly_price, valid_from: datetime,
    valid_to: datetime | None = None, actor=None,
) -> Price:  # fmt: skip
    """Add a price to a list after the checks of `check_price`."""
    price = Price(
        price_list=price_list, gpu_model=gpu_model, profile=profile, hourly_price=hourly_price,
        valid_from=valid_from, valid_to=valid_to,
    )  # fmt: skip
    return save_price(price=price, actor=actor)


PRICE_ADDED = gettext_noop("Price of %(spec)s in %(list)s: %(price)s %(currency)s an hour from %(start)s")
PRICE_CHANGED = gettext_noop(
    "Price of %(spec)s in %(list)s changed: %(price)s %(currency)s an hour from %(start)s"
)
PRICE_DELETED = gettext_noop("Price of %(spec)s in %(list)s from %(start)s deleted")
PRICE_LIST_ADDED = gettext_noop("Price list %(name)s created")
PRICE_LIST_CHANGED = gettext_noop("Price list %(name)s changed")


def _price_fields(price: Price) -> dict:
    return {
        "price_list": price.price_list_id,
        "gpu_model": price.gpu_model,
        "profile": price.profile,
        "hourly_price": str(price.hourly_price),
        "valid_from": price.valid_from.isoformat(),
        "valid_to": price.valid_to.isoformat() if price.valid_to else None,
    }


def _record_price(action: str, summary: str, price: Price, actor, details: dict) -> None:
    audit.record(
        action,
        summary=summary,
        values={
            "spec": f"{price.gpu_model} {price.profile}",
            "list": price.price_list.name,
            "price": f"{price.hourly_price.normalize():f}",
            "currency": settings.BILLING_CURRENCY,
            "start": f"{price.valid_from:%Y-%m-%d %H:%M}",
        },
        actor=actor,
        subject=("price", price.pk),
        details=details,
    )


def save_price(*, price: Price, actor=None) -> Price:
    """Add a price, or change one, after the checks of `check_price`; the change is audited."""
    with transaction.atomic():
        before = Price.objects.select_for_update().filter(pk=price.pk).first() if price.pk else None
        check_price(price, before=before)
        price.save()
        price.refresh_from_db()  # the figures as stored, so that before and after read alike
        if before is None:
            _record_price("price.created", PRICE_ADDED, price, actor, _price_fields(price))
        else:
            old, new = _price_fields(before), _price_fields(price)
            changed = {key: [old[key], new[key]] for key in new if old[key] != new[key]}
            _record_price("price.changed", PRICE_CHANGED, price, actor, {"changed": changed})
    return price


def delete_prices(*, prices, actor=None) -> int:
    """Delete prices that no metered time used (the caller has kept only those); each is audited."""
    with transaction.atomic():
        deleted = 0
        for price in prices.select_related("price_list").select_for_update():
            _record_price("price.deleted", PRICE_DELETED, price, actor, _price_fields(price))
            price.delete()
            deleted += 1
    return deleted


def save_price_list(*, price_list: PriceList, actor=None) -> PriceList:
    with transaction.atomic():
        added = price_list.pk is None
        price_list.save()
        audit.record(
            "pricelist.created" if added else "pricelist.changed",
            summary=PRICE_LIST_ADDED if added else PRICE_LIST_CHANGED,
            values={"name": price_list.name},
            actor=actor,
            subject=("price_list", price_list.pk),
            details={"name": price_list.name, "description": price_list.description[:500]},
        )
    return price_list
