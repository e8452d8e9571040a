"""GPU figures as pages show them: shares and percentages, memory in GiB, power in watts; a missing figure
is an em dash, never a zero."""

from __future__ import annotations

from django import template

register = template.Library()

DASH = "—"


@register.filter
def share(value: float | None) -> str:
    """A fraction as a percentage: `0.423` → `42 %`."""
    return DASH if value is None or value == "" else f"{float(value) * 100:.0f} %"


@register.filter
def pct(value: float | None) -> str:
    """A percentage as stored: `42.3` → `42 %`."""
    return DASH if value is None or value == "" else f"{float(value):.0f} %"


@register.filter
def gib(value: int | None) -> str:
    """Bytes as GiB: `42949672960` → `40.0`."""
    return DASH if value is None or value == "" else f"{int(value) / 2**30:,.1f}"


@register.filter
def number(value: float | None, digits: int = 0) -> str:
    """A figure with digit groups: `1234.5|number:1` → `1,234.5`."""
    return DASH if value is None or value == "" else f"{float(value):,.{int(digits)}f}"
