"""Invoice arithmetic: a month's bounds in the billing time zone, lines from usage, tax, rounding.

Money is `Decimal`. Usage is summed exactly per line (project × spec × unit price); each line is
rounded once, half-up, to the currency's minor unit; tax is its own line, rounded the same way;
the total is the sum of the lines, so it always equals them to the minor unit.

Plain data in and out: no Django, no clock, no database.
"""

from __future__ import annotations

import re
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import UTC, datetime
from decimal import ROUND_HALF_UP, Decimal
from zoneinfo import ZoneInfo

# Digits after the decimal point of each currency's minor unit (ISO 4217); others have two.
MINOR_DIGITS = {"KRW": 0, "JPY": 0, "VND": 0, "CLP": 0, "ISK": 0, "BHD": 3, "KWD": 3, "JOD": 3}
HOUR = Decimal(3600)
TAX = "tax"
USAGE = "usage"


class BadMonth(ValueError):
    pass


# Billing months lie in these years: far wider than the portal's life, and narrow enough that a month's
# bounds in any time zone are dates Python can hold (0001-01 and 9999-12 are not).
FIRST_YEAR, LAST_YEAR = 2000, 2999


def parse_month(text: str) -> tuple[int, int]:
    """`2026-11` → (2026, 11); anything else is refused with what was expected."""
    found = re.fullmatch(r"(\d{4})-(\d{2})", text.strip(), flags=re.ASCII)
    if not found or not 1 <= int(found[2]) <= 12 or not FIRST_YEAR <= int(found[1]) <= LAST_YEAR:
        raise BadMonth(
            f"A month is written YYYY-MM, from {FIRST_YEAR}-01 to {LAST_YEAR}-12, e.g. 2026-11, not {text!r}."
        )
    return int(found[1]), int(found[2])


def month_span(year: int, month: int, time_zone: str) -> tuple[datetime, datetime]:
    """The month's first and next month's first instant, local midnight in `time_zone`, in UTC."""
    zone = ZoneInfo(time_zone)
    start = datetime(year, month, 1, tzinfo=zone)
    end = datetime(year + month // 12, month % 12 + 1, 1, tzinfo=zone)
    return start.astimezone(UTC), end.astimezone(UTC)


def minor_unit(currency: str) -> Decimal:
    return Decimal(1).scaleb(-MINOR_DIGITS.get(currency.upper(), 2))


def round_money(amount: Decimal, currency: str) -> Decimal:
    return amount.quantize(minor_unit(currency), rounding=ROUND_HALF_UP)


def line_amount(seconds: int, unit_price: Decimal | None, currency: str) -> Decimal:
    """Instance-seconds at an hourly price, rounded once."""
    return round_money(Decimal(seconds) * (unit_price or Decimal(0)) / HOUR, currency)


@dataclass(frozen=True)
class Usage:
    """Instance-seconds of one spec a project used at one unit price (None: no price was in force)."""

    project_id: int
    gpu_model: str
    profile: str
    unit_price: Decimal | None
    seconds: int


@dataclass(frozen=True)
class Line:
    kind: str  # USAGE or TAX
    project_id: int | None
    gpu_model: str
    profile: str
    unit_price: Decimal | None
    seconds: int
    amount: Decimal

    @property
    def hours(self) -> Decimal:
        return Decimal(self.seconds) / HOUR


@dataclass(frozen=True)
class Totals:
    lines: tuple[Line, ...]
    subtotal: Decimal
    tax: Decimal
    total: Decimal


def invoice_lines(usage: Iterable[Usage], *, tax_rate: Decimal, currency: str) -> Totals:
    """Lines per project × spec × unit price, each rounded once; the tax line on their sum.
    Unpriced usage gets a line of amount zero, so that it shows and can be questioned."""
    seconds: dict[tuple[int, str, str, Decimal | None], int] = defaultdict(int)
    for row in usage:
        seconds[(row.project_id, row.gpu_model, row.profile, row.unit_price)] += row.seconds
    lines = [
        Line(USAGE, project, model, profile, price, held, line_amount(held, price, currency))
        for (project, model, profile, price), held in sorted(
            seconds.items(), key=lambda item: (item[0][0], item[0][1], item[0][2], item[0][3] or Decimal(0))
        )
    ]
    subtotal = sum((line.amount for line in lines), Decimal(0))
    tax = round_money(subtotal * tax_rate / Decimal(100), currency)
    lines.append(Line(TAX, None, "", "", None, 0, tax))
    return Totals(tuple(lines), subtotal, tax, subtotal + tax)
