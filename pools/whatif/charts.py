"""Charts of the operators' what-if page: a done run's fleets over the month, drawn on the server as SVG
(pygal) from the series its report keeps (pools/placement/whatif.py), and served by the portal itself.

One chart per measure; each line is one fleet of one run, so that the real and the changed fleet of a run, or
those of two runs compared, lie over each other. Time runs along the month as days from its first instant,
so that runs of different months can be overlaid too.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import pygal
from django.http import HttpResponse
from django.utils.translation import gettext as _
from django.utils.translation import gettext_lazy
from pygal.style import Style

from portal.charts import without_scripts

DAY = 86400


@dataclass(frozen=True)
class Measure:
    label: str
    unit: str
    key: str  # the list in a fleet's series
    scale: float = 1.0  # stored units per unit shown
    bounds: tuple[float, float] | None = None
    digits: int = 1
    # Figures only some buckets have (a mean wait where requests were admitted): drawn as dots joined across
    # the buckets without one, since lines broken at every gap would leave most of them invisible.
    sparse: bool = False


MEASURES = {
    "utilisation": Measure(
        gettext_lazy("Utilisation"), "%", "utilisation", scale=0.01, bounds=(0, 100), digits=0
    ),
    "stranded": Measure(gettext_lazy("Stranded compute slices"), gettext_lazy("slices"), "stranded"),
    "waiting": Measure(gettext_lazy("Requests waiting"), gettext_lazy("requests"), "waiting"),
    "wait": Measure(
        gettext_lazy("Mean wait at admission"), "h", "mean_wait_seconds", scale=3600, sparse=True
    ),
}
# Each line's colour, in the order the lines come: a run's real and changed fleet, then another run's.
COLOURS = ("#1f6f8b", "#e0a526", "#2f7d32", "#b23a48", "#6a4c93", "#5c8001")
SIZE = (900, 300)


@dataclass(frozen=True)
class Line:
    name: str
    series: Mapping  # a fleet's series in a report: "at", "step_seconds" and one list per measure


def lines_svg(lines: Sequence[Line], *, metric: str, time_zone: str) -> bytes:
    """One line per fleet, each bucket's value at the middle of its bucket, along the days of the month."""
    measure = MEASURES[metric]
    width, height = SIZE
    style = Style(
        background="#ffffff",
        plot_background="#ffffff",
        font_family="system-ui, sans-serif",
        colors=COLOURS,
        label_font_size=11,
        major_label_font_size=11,
        legend_font_size=12,
        no_data_font_size=16,
    )
    digits = measure.digits
    chart = pygal.XY(
        style=style,
        js=[],  # interactive tooltips would load a script from another host
        width=width,
        height=height,
        margin=12,
        show_dots=measure.sparse,
        dots_size=2,
        stroke_style={"width": 1 if measure.sparse else 2},
        allow_interruptions=not measure.sparse,
        legend_at_bottom=True,
        x_label_rotation=0,
        truncate_label=-1,
        y_title=f"{measure.label} ({measure.unit})",
        x_title=_("Day of the month (%(zone)s)") % {"zone": time_zone},
        x_value_formatter=lambda day: f"{day:.0f}" if float(day).is_integer() else f"{day:.2f}",
        value_formatter=lambda value: f"{value:,.{digits}f}",
        no_data_text=_("No figures for this run"),
        range=measure.bounds,
        include_x_axis=True,
    )
    for line in lines:
        points = _points(line.series, measure)
        if measure.sparse:
            points = [(day, value) for day, value in points if value is not None]
        if any(value is not None for _day, value in points):
            chart.add(line.name, points)
    chart.show_legend = bool(chart.raw_series)
    if chart.raw_series:  # pygal cannot place labels on a chart without data
        last = max(day for line in lines for day, _value in _points(line.series, measure))
        chart.x_labels = list(range(1, int(last) + 2, 7 if last > 10 else 1))
    return without_scripts(chart.render_tree())


def _points(series: Mapping, measure: Measure) -> list[tuple[float, float | None]]:
    """(day of the month, value shown) at the middle of each bucket; day 1 begins at second 0."""
    at, values = series.get("at") or [], series.get(measure.key) or []
    half = (series.get("step_seconds") or 0) / 2
    return [
        (1 + (start + half) / DAY, None if value is None else value / measure.scale)
        for start, value in zip(at, values, strict=False)
    ]


def svg_response(svg: bytes) -> HttpResponse:
    """A done run's chart: its report never changes, so a browser may keep it a while (not long, as its
    words follow the reader's language)."""
    response = HttpResponse(svg, content_type="image/svg+xml")
    response["Cache-Control"] = "private, max-age=300"
    return response
