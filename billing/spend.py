"""What pools cost as it accrues: this month to date, since reserved, the hourly rate now, and the month's
projection, for one pool, a project's pools or a tenant's.

Words:
- *metered*: the usage records metering already wrote (periods before `first_unmetered`).
- *tail*: from where metering has reached up to now; counted with `billing.metering` on the same holdings,
  with the price in force at each period's start, exactly as metering will write it.
- *price-seconds*: instance-seconds × hourly price. They are summed exactly and divided by 3600 once, so
  that a figure here is the amount of the usage records metering writes for the same time.
- *unknown*: a pool held a spec without a price in force; its figures are None (shown "—"), never a
  number that leaves that usage out.

A month is the calendar month in BILLING_TIME_ZONE; a period belongs to the month where it starts, as on
invoices. The projection assumes that what is held now stays held, at today's prices, to the month's end or
its pool's end date, whichever comes first.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, replace
from datetime import datetime
from decimal import Decimal
from itertools import pairwise

from django.db.models import Count, DecimalField, ExpressionWrapper, F, Q, QuerySet, Sum
from django.utils import timezone

from billing import invoicing, metering
from billing.conf import settings
from billing.models import Price, UsageRecord
from billing.prices import valid_during
from billing.selectors import month_bounds
from billing.services import allocation_holdings, first_unmetered
from pools.models import Pool

HOUR = invoicing.HOUR
ZERO = Decimal(0)
PRICE_SECONDS = DecimalField(max_digits=30, decimal_places=4)

PriceTable = dict[tuple[str, str], Decimal]


@dataclass(frozen=True)
class Spend:
    """Exact money of a set of pools. `*_ps` are price-seconds; None: unknown (a price is missing)."""

    month_ps: Decimal | None = ZERO
    ever_ps: Decimal | None = ZERO
    rate: Decimal | None = ZERO  # per hour, of what is held now
    holding: bool = False
    ahead_ps: Decimal | None = ZERO  # what is held now adds from now to the month's end (or its pool's end)

    @property
    def to_date(self) -> Decimal | None:
        return None if self.month_ps is None else self.month_ps / HOUR

    @property
    def since_reserved(self) -> Decimal | None:
        return None if self.ever_ps is None else self.ever_ps / HOUR

    @property
    def projected(self) -> Decimal | None:
        if self.month_ps is None or self.ahead_ps is None:
            return None
        return (self.month_ps + self.ahead_ps) / HOUR

    def __add__(self, other: Spend) -> Spend:
        return Spend(
            _add(self.month_ps, other.month_ps),
            _add(self.ever_ps, other.ever_ps),
            _add(self.rate, other.rate),
            self.holding or other.holding,
            _add(self.ahead_ps, other.ahead_ps),
        )


def _add(one: Decimal | None, two: Decimal | None) -> Decimal | None:
    return None if one is None or two is None else one + two


def total(spends: Iterable[Spend]) -> Spend:
    found = Spend()
    for spend in spends:
        found = found + spend
    return found


@dataclass(frozen=True)
class Figures:
    """A spend as a page shows it: each figure rounded once to the currency's minor unit; None: unknown."""

    to_date: Decimal | None
    hourly: Decimal | None
    projected: Decimal | None
    since_reserved: Decimal | None
    holding: bool
    currency: str


def figures(spend: Spend) -> Figures:
    currency = settings.BILLING_CURRENCY

    def money(amount: Decimal | None) -> Decimal | None:
        return None if amount is None else invoicing.round_money(amount, currency)

    return Figures(
        money(spend.to_date),
        money(spend.rate),
        money(spend.projected),
        money(spend.since_reserved),
        spend.holding,
        currency,
    )


def pool_spend(*, pools: QuerySet[Pool], now: datetime | None = None, ever: bool = False) -> dict[int, Spend]:
    """Pool id → its spend, for every pool of `pools` that cost anything this month or holds capacity now
    (with `ever`, also those that cost anything before). A fixed number of queries however many pools."""
    now = now or timezone.now()
    now_s = metering.whole_seconds(now)
    month_start, month_end = month_bounds(None, now=now)
    period = settings.METERING_PERIOD_SECONDS
    # The first period that starts in the month (the month starts on a period boundary where the zone's
    # offset is whole hours).
    month_from = _next_period_start(month_start, period)
    month_end_s = metering.whole_seconds(month_end)
    ids = pools.values("pk")
    found: dict[int, Spend] = {}

    metered = UsageRecord.objects.filter(pool_id__in=ids)
    if not ever:
        metered = metered.filter(period_start__gte=month_start)
    in_month = Q(period_start__gte=month_start, period_start__lt=month_end)
    price_seconds = ExpressionWrapper(F("seconds") * F("unit_price"), output_field=PRICE_SECONDS)
    rows = (
        metered.values("pool_id")
        .annotate(
            month=Sum(price_seconds, filter=in_month),
            month_records=Count("pk", filter=in_month),
            month_unpriced=Count("pk", filter=in_month & Q(unit_price__isnull=True)),
            ever=Sum(price_seconds),
            ever_unpriced=Count("pk", filter=Q(unit_price__isnull=True)),
        )
        .order_by()
    )
    for row in rows:
        if not row["month_records"] and not ever:
            continue
        found[row["pool_id"]] = Spend(
            month_ps=None if row["month_unpriced"] else row["month"] or ZERO,
            ever_ps=None if row["ever_unpriced"] else row["ever"] or ZERO,
        )

    first = first_unmetered()
    tail_from = now_s if first is None else (first if ever else max(first, month_from))
    tail_from = min(tail_from, now_s)
    holdings = allocation_holdings(begins=metering.moment(tail_from), ends=now, pools=ids)
    if not holdings:
        return found
    prices = _prices_between(metering.moment(tail_from), now)
    bounds = _segment_bounds(prices, tail_from, now_s, month_from, period)
    pieces = [(begins, ends, _in_force(prices, metering.moment(begins))) for begins, ends in pairwise(bounds)]
    prices_now = _in_force(prices, now)
    for holding in holdings:
        spend = found.get(holding.pool_id, Spend())
        spec = (holding.gpu_model, holding.profile)
        for begins, ends, table in pieces:
            seconds = metering.billable_seconds(holding, ends) - metering.billable_seconds(holding, begins)
            if not seconds:
                continue
            cost = None if table.get(spec) is None else seconds * table[spec]
            spend = replace(
                spend,
                ever_ps=_add(spend.ever_ps, cost),
                month_ps=_add(spend.month_ps, cost) if begins >= month_from else spend.month_ps,
            )
        if holding.until is None or holding.until > now_s:  # held now
            rate = None if prices_now.get(spec) is None else holding.count * prices_now[spec]
            left = max(0, min(month_end_s, holding.until or month_end_s) - now_s)
            spend = replace(
                spend,
                rate=_add(spend.rate, rate),
                holding=True,
                ahead_ps=_add(spend.ahead_ps, None if rate is None else rate * left),
            )
        found[holding.pool_id] = spend
    return found


def _next_period_start(moment_: datetime, period: int) -> int:
    """The first period start at or after `moment_`."""
    seconds = metering.whole_seconds(moment_)
    if seconds < moment_.timestamp():
        seconds += 1  # a fraction of a second after a whole one
    start = metering.period_start(seconds, period)
    return start if start == seconds else start + period


def _prices_between(start: datetime, end: datetime) -> list[Price]:
    """Every price in force at some moment of [start, end], in one query."""
    return list(
        valid_during(start, end).only("gpu_model", "profile", "hourly_price", "valid_from", "valid_to")
    )


def _in_force(prices: list[Price], at: datetime) -> PriceTable:
    """As `billing.prices.in_force`, over prices already read."""
    return {
        (price.gpu_model, price.profile): price.hourly_price
        for price in prices
        if price.valid_from <= at and (price.valid_to is None or price.valid_to > at)
    }


def _segment_bounds(prices: list[Price], start: int, end: int, month_from: int, period: int) -> list[int]:
    """Cuts of [start, end] such that within each piece every period starts under the same prices, and
    none straddles the month's first period: a price that changes inside a period applies from the next
    one, as metering copies the price in force at a period's start."""
    cuts = {start, end}
    changes = [price.valid_from for price in prices] + [p.valid_to for p in prices if p.valid_to is not None]
    for moment_ in changes:
        cut = _next_period_start(moment_, period)
        if start < cut < end:
            cuts.add(cut)
    if start < month_from < end:
        cuts.add(month_from)
    return sorted(cuts)


def by_project(spends: dict[int, Spend], project_of: dict[int, int]) -> dict[int, Spend]:
    """Project id → the total of its pools' spends (any owner of pools, given as `project_of`: a tenant's
    id per pool gives the tenants' totals)."""
    found: dict[int, Spend] = {}
    for pool_id, spend in spends.items():
        project = project_of[pool_id]
        found[project] = found[project] + spend if project in found else spend
    return found
