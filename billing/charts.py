"""Finance's chart, drawn on the server as SVG (pygal) and served by the portal: no script, no CDN."""

from __future__ import annotations

import pygal
from pygal.style import Style

from billing.finance import History
from billing.models import InvoiceState
from portal.charts import without_scripts

COLOURS = {InvoiceState.PAID: "#2f7d32", InvoiceState.ISSUED: "#e0a526", InvoiceState.DRAFT: "#9aa5a0"}


def month_totals_svg(history: History, *, currency: str) -> bytes:
    """Stacked monthly totals: paid, issued and not paid, draft."""
    style = Style(
        background="#ffffff",
        plot_background="#ffffff",
        font_family="system-ui, sans-serif",
        colors=tuple(COLOURS[state] for state in history.totals),
        label_font_size=11,
        major_label_font_size=11,
        legend_font_size=12,
    )
    chart = pygal.StackedBar(
        style=style,
        js=[],  # interactive tooltips would load a script from another host
        width=900,
        height=320,
        legend_at_bottom=True,
        legend_at_bottom_columns=len(history.totals),
        y_title=currency,
        show_minor_x_labels=True,
        print_values=False,
        value_formatter=lambda value: f"{value:,.0f}",
        margin=12,
    )
    chart.x_labels = [f"{month:%Y-%m}" for month in history.months]
    for state, totals in history.totals.items():
        chart.add(str(InvoiceState(state).label), [float(total) for total in totals])
    return without_scripts(chart.render_tree())
