"""GPU charts: the ranges a page offers, and lines of figures drawn on the server as SVG (pygal) and served
by the portal itself — no script, no CDN, so they work air-gapped.

Every chart reads `monitoring.storage.samples.series`, which picks raw samples or a roll-up for the span.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

import pygal
from django.http import HttpResponse
from django.utils import timezone
from django.utils.translation import gettext as _
from django.utils.translation import gettext_lazy
from pygal.style import Style

from monitoring import selectors
from monitoring.storage.samples import Point, series
from portal.charts import without_scripts
from portal.errors import InvalidInput

RANGES = {
    "1h": timedelta(hours=1),
    "6h": timedelta(hours=6),
    "24h": timedelta(hours=24),
    "7d": timedelta(days=7),
    "30d": timedelta(days=30),
}
DEFAULT_RANGE = "24h"


@dataclass(frozen=True)
class Measure:
    label: str
    unit: str
    scale: float = 1.0  # stored units per unit shown
    bounds: tuple[float, float] | None = None
    digits: int = 0


MEASURES = {
    "power_w": Measure(gettext_lazy("Power"), "W"),
    "temperature_c": Measure(gettext_lazy("Temperature"), "°C"),
    "sm_active_pct": Measure(gettext_lazy("SM activity"), "%", bounds=(0, 100)),
    "utilisation_pct": Measure(gettext_lazy("Utilisation"), "%", bounds=(0, 100)),
    "memory_used_bytes": Measure(gettext_lazy("Memory used"), "GiB", scale=2**30, digits=1),
}
# What a tenant sees of its own pool: MIG instances report these two (power and temperature are the GPU's).
TENANT_MEASURES = ("sm_active_pct", "memory_used_bytes")

# Chart sizes in pixels: the full chart of a pool's page, or a small one among several on the tenant page.
SIZES = {"": (900, 300), "small": (320, 110)}


def parse_range(value: str | None) -> str:
    """The range a page asked for (the default when none); another value is refused with the choices."""
    if not value:
        return DEFAULT_RANGE
    if value not in RANGES:
        raise InvalidInput(
            _("Unknown range %(value)s: choose one of %(choices)s.")
            % {"value": value[:20], "choices": ", ".join(RANGES)},
            field="range",
        )
    return value


def parse_size(value: str | None) -> str:
    """The size a page asked for (the full chart when none); another value is refused with the choices."""
    if not value:
        return ""
    if value not in SIZES:
        raise InvalidInput(
            _("Unknown size %(value)s: choose %(choices)s or none.")
            % {"value": value[:20], "choices": ", ".join(size for size in SIZES if size)},
            field="size",
        )
    return value


def span(name: str, *, now: datetime | None = None) -> tuple[datetime, datetime]:
    end = now or timezone.now()
    return end - RANGES[name], end


def resolution_text(seconds: int) -> str:
    if seconds == 0:
        return _("raw samples")
    if seconds < 3600:
        return _("%(minutes)d-minute averages") % {"minutes": seconds // 60}
    return _("%(hours)d-hour averages") % {"hours": seconds // 3600}


def lines_svg(
    lines: list[tuple[str, list[Point]]],
    *,
    metric: str,
    start: datetime,
    end: datetime,
    resolution: int,
    size: str = "",
) -> bytes:
    """One line per (name, points), each point's average, over [start, end) in the portal's time zone; a
    small chart has no titles and few labels (its page says what it shows)."""
    measure = MEASURES[metric]
    width, height = SIZES[size]
    style = Style(
        background="#ffffff",
        plot_background="#ffffff",
        font_family="system-ui, sans-serif",
        colors=("#1f6f8b", "#e0a526", "#2f7d32", "#b23a48", "#6a4c93", "#5c8001", "#9aa5a0", "#c05805"),
        label_font_size=9 if size else 11,
        major_label_font_size=9 if size else 11,
        legend_font_size=12,
        no_data_font_size=11 if size else 16,
    )
    shown = [p.value / measure.scale for _name, points in lines for p in points if p.value is not None]
    # A flat line (a cool idle GPU) gets tick steps under one unit: labels need a decimal to differ.
    narrow = measure.bounds is None and shown and max(shown) - min(shown) < 10
    digits = max(measure.digits, 1) if narrow else measure.digits
    zone = timezone.get_current_timezone()
    long = end - start > timedelta(days=1)
    shape = "%m-%d %H:%M" if long else "%H:%M"
    chart = pygal.DateTimeLine(
        style=style,
        js=[],  # interactive tooltips would load a script from another host
        width=width,
        height=height,
        margin=4 if size else 12,
        show_dots=False,
        stroke_style={"width": 2},
        allow_interruptions=True,
        legend_at_bottom=True,
        x_label_rotation=0,
        truncate_label=-1,
        y_title=None if size else f"{measure.label} ({measure.unit})",
        x_title=None if size else f"{zone} · {resolution_text(resolution)}",
        # pygal hands back UTC times without their zone
        x_value_formatter=lambda at: at.replace(tzinfo=UTC).astimezone(zone).strftime(shape),
        value_formatter=lambda value: f"{value:,.{digits}f}",
        no_data_text=_("No figures in this range"),
        xrange=(start.timestamp(), end.timestamp()),
        range=measure.bounds,
        include_x_axis=measure.bounds is not None,
    )
    for name, points in lines:
        values = [(p.at, None if p.value is None else p.value / measure.scale) for p in points]
        if any(value is not None for _at, value in values):
            chart.add(name, values)
    chart.show_legend = len(chart.raw_series) > 1 and not size
    if size and not chart.raw_series:  # a small chart without figures shows only its message
        chart.show_x_labels = chart.show_y_labels = False
    elif size and measure.bounds:  # and with figures, its bounds and a middle line: no crowd of labels
        chart.y_labels = [measure.bounds[0], sum(measure.bounds) / 2, measure.bounds[1]]
    if chart.raw_series:  # pygal cannot place labels on a chart without data
        chart.x_labels = ticks(start, end, at_most=4 if size else 10)
    return without_scripts(chart.render_tree())


def ticks(start: datetime, end: datetime, *, at_most: int = 10) -> list[datetime]:
    """Round moments across [start, end]: no more than `at_most` of them, about six to ten by default."""
    width = (end - start).total_seconds()
    step = next(
        (
            s
            for s in (60, 300, 600, 1800, 3600, 3 * 3600, 6 * 3600, 86400, 2 * 86400, 5 * 86400)
            if width / s <= at_most
        ),
        10 * 86400,
    )
    first = -(-int(start.timestamp()) // step) * step
    return [datetime.fromtimestamp(t, tz=UTC) for t in range(first, int(end.timestamp()) + 1, step)]


def gpu_svg(detail: selectors.GpuDetail, metric: str, chosen: str) -> bytes:
    """A GPU's chart over a range: the whole GPU and, for SM activity and memory, each MIG instance (named
    with its holder)."""
    start, end = span(chosen)
    gpu_id = detail.gpu.pk
    resolution, whole = series(metric=metric, start=start, end=end, gpu_ids=[gpu_id], now=end)
    lines = [(_("whole GPU"), whole)]
    if metric in TENANT_MEASURES:
        for slot in detail.slots:
            if not slot.whole:
                points = series(metric=metric, start=start, end=end, slots=[(gpu_id, slot.slot)], now=end)[1]
                holder = f" · {slot.holder.label}" if slot.holder else ""
                lines.append((f"{slot.profile} @{slot.slot}{holder}", points))
    return lines_svg(lines, metric=metric, start=start, end=end, resolution=resolution)


def pool_svg(pool, metric: str, chosen: str, size: str = "") -> bytes:
    """A pool's chart over a range: the average over its GPUs and instances and, where it holds several
    and the chart is not small, the busiest of them (SM activity); or the memory they hold together."""
    start, end = span(chosen)
    found = selectors.pool_series(pool=pool, metric=metric, start=start, end=end, now=end)
    if metric == "memory_used_bytes":
        lines = [(_("in all"), found.points)]
    else:
        lines = [(_("average"), found.points)]
        if found.instances > 1 and not size:
            lines.append((_("busiest"), [Point(p.at, p.high, p.high, p.high) for p in found.points]))
    return lines_svg(lines, metric=metric, start=start, end=end, resolution=found.resolution, size=size)


def refusal(error: InvalidInput) -> HttpResponse:
    """A chart's 400: plain text (an image tag shows no page)."""
    return HttpResponse(error.message, status=400, content_type="text/plain; charset=utf-8")


def svg_response(svg: bytes) -> HttpResponse:
    response = HttpResponse(svg, content_type="image/svg+xml")
    response["Cache-Control"] = "private, max-age=30"
    return response
