"""Hourly prices of specs, as far as pools need them (estimates before submitting).

Prices belong to billing; billing registers its price lookup here when it is installed,
so that pools never import billing. Without one, prices are unknown (None).
"""

from __future__ import annotations

from collections.abc import Callable
from decimal import Decimal

from pools.specs import Spec

PriceLookup = Callable[[Spec], Decimal | None]
_lookup: PriceLookup | None = None


def register_price_lookup(lookup: PriceLookup) -> None:
    global _lookup
    _lookup = lookup


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
