"""Recent demand per (GPU model, profile), as the engine's `demand=` argument takes it: one count for the
queue (times in epoch seconds) and for the what-if simulator (seconds from the trace's start).

Words used here:
- arrival: a request's time of arrival and its items (a pool request's approval, a trace request's `arrive`).
- window: how far back an arrival still counts; its weight halves every half window, so the last days
  decide the layouts of re-partitioned GPUs more than the start of the window does.

Pure: a function of its arguments; no clock, the caller says what `now` is.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from pools.placement.types import Item

# One week: it spans the weekly cycle of work (weekday training, weekend batch), so a layout is not chosen
# from one quiet day alone, and with a half-life of 3.5 days the last few days weigh most. The queue and the
# simulator both use it, so that a what-if run chooses layouts as production does.
DEMAND_WINDOW_SECONDS = 7 * 24 * 3600


def recent_demand(
    arrivals: Iterable[tuple[float, Sequence[Item]]], *, now: float, window_seconds: float
) -> dict[tuple[str, str], float]:
    """Instances asked for per (model, profile) by the arrivals of the last `window_seconds` before `now`,
    each weighted by exponential decay with a half-life of `window_seconds / 2`: an arrival at `now` counts
    its items in full, one half a window earlier counts half, one a whole window earlier a quarter, and an
    older one nothing. Arrivals after `now` are ignored (not known yet). Whole GPUs count under profile
    "full", as the engine's own tally does; items whose count is not a whole number above 0 count nothing.
    """
    if not window_seconds > 0:
        raise ValueError(f"The demand window must be a positive number of seconds, got {window_seconds!r}.")
    half_life = window_seconds / 2
    demand: dict[tuple[str, str], float] = {}
    for arrived, items in arrivals:
        age = now - arrived
        if age < 0 or age > window_seconds:
            continue
        weight = 0.5 ** (age / half_life)
        for item in items:
            if isinstance(item.count, bool) or not isinstance(item.count, int) or item.count <= 0:
                continue
            key = (item.model, item.profile)
            demand[key] = demand.get(key, 0.0) + item.count * weight
    return demand
