"""Money as pages show it: rounded once, half-up, to the currency's minor unit, with digit groups."""

from __future__ import annotations

from decimal import Decimal

from django import template

from billing.conf import settings
from billing.invoicing import round_money

register = template.Library()


@register.filter
def money(amount: Decimal | None, currency: str = "") -> str:
    """`27720.0000|money:"KRW"` → `27,720`; nothing known → an em dash."""
    if amount is None or amount == "":
        return "—"
    return f"{round_money(Decimal(amount), currency or settings.BILLING_CURRENCY):,}"


@register.filter
def signed_money(amount: Decimal | None, currency: str = "") -> str:
    """A change: `+1,200`, `−300`, `0`."""
    if amount is None or amount == "":
        return "—"
    rounded = round_money(Decimal(amount), currency or settings.BILLING_CURRENCY)
    if rounded > 0:
        return f"+{rounded:,}"
    return f"−{-rounded:,}" if rounded < 0 else f"{rounded:,}"


@register.filter
def unit_price(price: Decimal | None) -> str:
    """An hourly price as it was set, every digit kept: `600`, `0.0125`."""
    if price is None or price == "":
        return "—"
    exact = Decimal(price).normalize()
    return f"{exact:,f}" if exact == exact.to_integral_value() else f"{exact:f}"
