"""Hourly prices of specs, money's rounding and billing's calendar, as far as pools and the apps above them
need them (estimates before submitting, a pool's hourly cost, a month's history, what-if months).

Prices, the currency and the time zone of billing's months belong to billing; billing registers them here
when it is installed, so that pools never import billing. Without billing, prices are unknown (None), no
currency is named, money is rounded to the cent, and months are UTC's.
"""

from __future__ import annotations

from collections.abc import Callable
from decimal import ROUND_HALF_UP, Decimal

from pools.specs import Spec

PriceLookup = Callable[[Spec], Decimal | None]
_lookup: PriceLookup | None = None
_currency: Callable[[], str] | None = None
_time_zone: Callable[[], str] | None = None
_round: Callable[[Decimal], Decimal] | None = None
CENT = Decimal("0.01")


def register_billing(
    *,
    price: PriceLookup,
    currency: Callable[[], str],
    time_zone: Callable[[], str],
    round_money: Callable[[Decimal], Decimal] | None = None,
) -> None:
    """Billing's price lookup, how to read its currency and the time zone of its months (read each time,
    so that a changed setting counts at once), and how it rounds an amount to its currency's minor unit."""
    global _lookup, _currency, _time_zone, _round
    _lookup, _currency, _time_zone, _round = price, currency, time_zone, round_money


def currency() -> str | None:
    """The currency prices are in, or None without billing."""
    return _currency() if _currency else None


def round_money(amount: Decimal) -> Decimal:
    """An amount rounded once as billing rounds it (its currency's minor unit), else to the cent."""
    return _round(amount) if _round else amount.quantize(CENT, rounding=ROUND_HALF_UP)


def month_time_zone() -> str:
    """The time zone whose calendar months billing bills: a month's history and what-if months are those."""
    return _time_zone() if _time_zone else "UTC"


def hourly_price(spec: Spec) -> Decimal | None:
    return _lookup(spec) if _lookup else None


def estimated_hourly_cost(items: list[tuple[Spec, int]]) -> Decimal | None:
    """The hourly cost of a request's items, or None while any price is unknown."""
    total = Decimal(0)
    for spec, count in items:
        price = hourly_price(spec)
        if price is None:
            return None
        total += price * count
    return total


def pool_items(pool) -> list[tuple[Spec, int]]:
    """What a pool holds by design, grown and shrunk since its request: (spec, count) per item (prefetch
    `items` when listing)."""
    return [(Spec(item.gpu_model, item.profile), item.count) for item in pool.items.all()]


def pool_hourly_cost(pool) -> Decimal | None:
    """What a pool costs per hour, or None while any price is unknown: the one figure the pool's API and
    its pages show."""
    return estimated_hourly_cost(pool_items(pool))
