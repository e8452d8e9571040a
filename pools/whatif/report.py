"""What if the fleet had been different: a month of the portal's own requests simulated on today's fleet and,
when changes are given, on the fleet so changed, each answer checked by the replay check, in one report.

The one way to run it, for `manage.py simulate --history` as for the pages and tasks that will run it too.
It reads the database once (pools/selectors/history.py) and writes nothing; the rest is pure.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import replace
from datetime import datetime

from django.utils.translation import gettext_noop

from pools.conf import settings
from pools.placement.fleet_changes import (
    FleetChangeError,
    apply_changes,
    node_sizes,
    parse_changes,
    peak_size,
)
from pools.placement.replay import check
from pools.placement.simulation import SimulationTrace, simulate
from pools.placement.whatif import RoutedPlacer, series_of, summary_of
from pools.selectors.history import HistoryError, month_history

__all__ = ["BAD_INPUT", "TOO_LARGE", "FleetTooLarge", "InvalidAnswer", "run_whatif"]

BAD_INPUT = (HistoryError, FleetChangeError)  # what a caller shows its user as a mistake of theirs
# Kept with its values where a run fails on it, so that each reader sees it in their language.
TOO_LARGE = gettext_noop(
    "With these changes the fleet would hold more than %(most)s GPUs, the most a what-if run may simulate. "
    "Add fewer GPUs."
)


class InvalidAnswer(RuntimeError):
    """A simulated answer that breaks a rule of the replay check: the simulator's fault, not the input's."""


class FleetTooLarge(FleetChangeError):
    """Changes that would make the fleet hold more than `most` GPUs, the most a run may simulate."""

    def __init__(self, *, most: int):
        self.most = most
        super().__init__(TOO_LARGE % {"most": most})


def run_whatif(
    *,
    month: str,
    cluster: str | None = None,
    changes: Sequence[tuple[str, str]] = (),
    progress: Callable[[float], None] | None = None,
    now: datetime | None = None,
    max_gpus: int | None = None,
) -> dict:
    """The report of a month (YYYY-MM) on the real fleet and, when `changes` ((kind, text) pairs of
    pools/placement/fleet_changes.py, applied in order) are given, on the changed one, with the same
    requests: {"month", "time_zone", "cluster", "horizon_seconds", "estimated_holds", "changes",
    "fleets": {"real": summary, "changed": summary}}, each summary with its "series" over time
    (pools/placement/whatif.py). `progress(done)` is told the share done as the runs go: up to 0.5 in the
    first of two runs, 0.5 between them and 1.0 at the end. Raises one of BAD_INPUT for a bad month,
    cluster or change, before anything is simulated, FleetTooLarge among them where the changed fleet would
    pass `max_gpus` at any step (checked before it is built), and InvalidAnswer should an answer break a
    rule."""
    parsed = parse_changes(changes)  # a misspelt change is refused before the database is read
    history = month_history(month=month, cluster=cluster, now=now)
    traces = {"real": history.trace}
    said: tuple[str, ...] = ()
    if parsed:
        sizes = node_sizes(history.trace.fleet)
        if max_gpus is not None and peak_size(sizes, parsed, cluster=cluster, limit=max_gpus) > max_gpus:
            raise FleetTooLarge(most=max_gpus)
        fleet, said = apply_changes(history.trace.fleet, parsed, cluster=cluster)
        traces["changed"] = replace(history.trace, fleet=fleet)
    fleets = {}
    for number, (name, trace) in enumerate(traces.items()):
        told = None if progress is None else _share(progress, number, len(traces))
        fleets[name] = _run(name, trace, RoutedPlacer(history.routes), told)
    return {
        "month": history.month,
        "time_zone": history.time_zone,
        "cluster": cluster,
        "horizon_seconds": history.trace.horizon,
        "estimated_holds": len(history.estimated),
        "changes": list(said),
        "fleets": fleets,
    }


def _share(progress: Callable[[float], None], number: int, runs: int) -> Callable[[float], None]:
    """The progress of run `number` of `runs` as a share of all of them."""
    return lambda done: progress((number + done) / runs)


def _run(
    name: str, trace: SimulationTrace, placer: RoutedPlacer, progress: Callable[[float], None] | None
) -> dict:
    result = simulate(
        trace,
        placer=placer,
        demand_window_seconds=settings.QUEUE_DEMAND_WINDOW_SECONDS,
        progress=progress,
    )
    problems = check(trace, result.outcomes)
    if problems:
        raise InvalidAnswer(f"The run on the {name} fleet breaks the rules: " + " ".join(problems[:5]))
    return {**summary_of(result.summary, trace.fleet), "series": series_of(trace, result)}
