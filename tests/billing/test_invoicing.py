"""Invoice arithmetic, property-based: totals equal their lines to the minor unit; months follow the
billing time zone."""

from datetime import UTC, datetime
from decimal import Decimal

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from billing.invoicing import (
    TAX,
    BadMonth,
    Usage,
    invoice_lines,
    line_amount,
    minor_unit,
    month_span,
    parse_month,
    round_money,
)
from tests.examples import examples

prices = st.one_of(st.none(), st.decimals(min_value=0, max_value=100000, places=4, allow_nan=False))
usages = st.builds(
    Usage,
    project_id=st.integers(1, 4),
    gpu_model=st.sampled_from(["H100-80GB", "H200-141GB"]),
    profile=st.sampled_from(["full", "1g.10gb", "3g.40gb"]),
    unit_price=prices,
    seconds=st.integers(1, 31 * 24 * 3600 * 7),
)


@settings(max_examples=examples(500), deadline=None)
@given(
    st.lists(usages, max_size=30),
    st.decimals(min_value=0, max_value=100, places=2),
    st.sampled_from(["KRW", "USD", "BHD"]),
)
def test_the_total_is_the_sum_of_its_lines_to_the_minor_unit(usage, rate, currency):
    totals = invoice_lines(usage, tax_rate=rate, currency=currency)
    assert totals.total == sum(line.amount for line in totals.lines)
    assert totals.total == totals.subtotal + totals.tax
    for line in totals.lines:
        assert line.amount == round_money(line.amount, currency)  # rounded once, to the minor unit
    assert sum(line.seconds for line in totals.lines) == sum(u.seconds for u in usage)
    (tax,) = [line for line in totals.lines if line.kind == TAX]
    assert tax.amount == round_money(totals.subtotal * rate / 100, currency)


def test_rounding_is_half_up_once_per_line():
    assert line_amount(1800, Decimal("1001"), "KRW") == Decimal("501")  # 500.5 rounds up
    assert line_amount(1, Decimal("1"), "USD") == Decimal("0.00")
    assert minor_unit("KRW") == Decimal("1") and minor_unit("USD") == Decimal("0.01")
    # Two rows of one line are summed before rounding, not rounded each.
    usage = [Usage(1, "H100-80GB", "full", Decimal("1"), 1800)] * 2
    assert invoice_lines(usage, tax_rate=Decimal(0), currency="KRW").subtotal == Decimal("1")


def test_a_month_is_a_calendar_month_in_the_billing_time_zone():
    start, end = month_span(2026, 11, "Asia/Seoul")
    assert (start, end) == (datetime(2026, 10, 31, 15, tzinfo=UTC), datetime(2026, 11, 30, 15, tzinfo=UTC))
    start, end = month_span(2026, 12, "Asia/Seoul")
    assert end == datetime(2026, 12, 31, 15, tzinfo=UTC)
    # Across a daylight-saving change the month still starts at local midnight.
    start, end = month_span(2026, 3, "Europe/Berlin")
    assert (start.hour, end.hour) == (23, 22)


@pytest.mark.parametrize(
    "text", ["2026-13", "2026-1", "26-11", "november", "2026-00", "", "0000-01", "9999-12", "٢٠٢٦-١١"]
)
def test_a_month_not_written_yyyy_mm_is_refused(text):
    with pytest.raises(BadMonth, match="YYYY-MM"):
        parse_month(text)
