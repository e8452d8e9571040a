"""Hourly prices of specs and billing's calendar, as far as pools need them (estimates before submitting,
a month's history, what-if months).

Prices, the currency and the time zone of billing's months belong to billing; billing registers them here
when it is installed, so that pools never import billing. Without billing, prices are unknown (None), no
currency is named, and months are UTC's.
"""

from __future__ import annotations

from collections.abc import Callable
from decimal import Decimal

from pools.specs import Spec

PriceLookup = Callable[[Spec], Decimal | None]
_lookup: PriceLookup | None = None
_currency: Callable[[], str] | None = None
_time_zone: Callable[[], str] | None = None


def register_billing(
    *, price: PriceLookup, currency: Callable[[], str], time_zone: Callable[[], str]
) -> None:
    """Billing's price lookup, and how to read its currency and the time zone of its months (read each time,
    so that a changed setting counts at once)."""
    global _lookup, _currency, _time_zone
    _lookup, _currency, _time_zone = price, currency, time_zone


def currency() -> str | None:
    """The currency prices are in, or None without billing."""
    return _currency() if _currency else None


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
