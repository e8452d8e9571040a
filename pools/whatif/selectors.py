"""Reads of kept what-if runs for the operators' pages: the list (without the reports, which are large), one
run, two done runs to compare, and a done report's figures as the pages set them side by side.

Words as in pools/placement/whatif.py: a report's fleets are "real" (today's) and "changed" (with the run's
fleet changes), each with its summary and its series over time.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from django.db.models import QuerySet
from django.shortcuts import get_object_or_404
from django.utils.translation import gettext as _
from django.utils.translation import gettext_lazy

from pools.models import WhatIfRun, WhatIfState

# The rows of a side-by-side table: the figures of pools/placement/whatif.py's side_by_side, in its order.
FIGURES = (
    ("gpus", gettext_lazy("GPUs")),
    ("requests", gettext_lazy("Requests")),
    ("admitted", gettext_lazy("Admitted")),
    ("served_slice_hours", gettext_lazy("Served compute-slice-hours")),
    ("mean_wait_seconds", gettext_lazy("Mean wait")),
    ("p95_wait_seconds", gettext_lazy("95th percentile wait")),
    ("stranded", gettext_lazy("Stranded compute slices (min / mean / max)")),
)
FLEET_NAMES = {"real": gettext_lazy("real fleet"), "changed": gettext_lazy("changed fleet")}


@dataclass(frozen=True)
class Column:
    heading: str
    summary: Mapping  # a fleet's summary in a report


@dataclass(frozen=True)
class FigureRow:
    label: str
    cells: list[str]


def whatif_runs() -> QuerySet[WhatIfRun]:
    """Every kept run, newest first, with who asked; its report is left in the database (the list shows
    none of it, and a month's series would make each row large)."""
    return WhatIfRun.objects.select_related("requested_by").defer("report").order_by("-created_at", "-pk")


def whatif_run(*, pk: int) -> WhatIfRun:
    """One run with its report; 404 when there is none of that id."""
    return get_object_or_404(WhatIfRun.objects.select_related("requested_by"), pk=pk)


def done_runs(*, ids: Sequence[int]) -> dict[int, WhatIfRun]:
    """The done runs among `ids`, by id, with their reports, in one query."""
    return {
        run.pk: run
        for run in WhatIfRun.objects.select_related("requested_by").filter(pk__in=ids, state=WhatIfState.DONE)
    }


def fleet_columns(run: WhatIfRun, *, prefix: str = "") -> list[Column]:
    """A done run's fleets as the columns of a side-by-side table: real, then changed where it has one."""
    return [
        Column(f"{prefix}{FLEET_NAMES.get(name, name)}", summary)
        for name, summary in (run.report or {}).get("fleets", {}).items()
    ]


def step_seconds(run: WhatIfRun) -> int:
    """The width of the buckets of a done run's series (0 where its report has none)."""
    fleets = (run.report or {}).get("fleets", {})
    return next((int(f["series"]["step_seconds"]) for f in fleets.values() if "series" in f), 0)


def figure_rows(columns: Sequence[Column]) -> list[FigureRow]:
    """The side-by-side table: one row per figure, one cell per column."""
    return [
        FigureRow(str(label), [figure_text(key, column.summary.get(key)) for column in columns])
        for key, label in FIGURES
    ]


def figure_text(key: str, value: object) -> str:
    """A figure as a table cell shows it: waits in the unit that reads best, stranded as min / mean / max."""
    if value is None:
        return "—"
    if key.endswith("wait_seconds"):
        return wait_text(float(value))
    if isinstance(value, Mapping):
        return f"{value.get('min')} / {float(value.get('mean', 0)):.1f} / {value.get('max')}"
    if isinstance(value, float):
        return f"{value:,.1f}"
    return f"{value:,}" if isinstance(value, int) else str(value)


def wait_text(seconds: float) -> str:
    """A wait in seconds, minutes or hours, whichever reads best."""
    if seconds < 60:
        return _("%(seconds)d s") % {"seconds": round(seconds)}
    if seconds < 3600:
        return _("%(minutes)d min") % {"minutes": round(seconds / 60)}
    return _("%(hours)s h") % {"hours": f"{seconds / 3600:,.1f}"}
