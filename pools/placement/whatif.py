"""What-if runs of a month of history, their pure parts: a placer that sends each request to the clusters the
queue would try, the report that sets the real fleet's run beside the changed fleet's, and each run's figures
over time for the charts of the operators' what-if page.

Words used here (simulation words are pools/placement/simulation.py's):
- route: a cluster a request may land on and the GPU group it is placed in there (None: any of its GPUs).
  A request asked for one cluster has one route; one asked for any cluster has one per cluster, in name
  order, as the queue tries them (pools/services/queue.py).
- summary: a run's figures as the report shows them: requests, admitted, served compute-slice-hours, mean
  and p95 wait of the admitted, stranded compute slices over the run's event times, GPUs of the fleet.
- series: a run's figures over time, in buckets of whole hours from second 0 (the last one cut at the
  horizon), at most MAX_POINTS of them: per bucket, the time-weighted mean of the utilisation (compute
  slices allocated over the fleet's compute slices, each GPU counting COMPUTE_SLICES), of the stranded
  compute slices (as the simulator counts them after each event time's run) and of the requests waiting,
  and the mean wait of the requests admitted in the bucket (None where none was).

Pure: plain data in, plain data out; no Django, no I/O, no clock.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence

from pools.mig import COMPUTE_SLICES
from pools.placement.engine import place, shortfall
from pools.placement.simulation import (
    SimulationResult,
    SimulationTrace,
    Summary,
    held_slices,
    stranded_slices,
)
from pools.placement.types import Fleet, Placement, Request

__all__ = ["MAX_POINTS", "Route", "RoutedPlacer", "series_of", "side_by_side", "summary_of"]

HOUR = 3600
# A month of hourly buckets is 744 points; two-hour buckets keep a month's series under this, and the report
# small enough to keep in a database row and draw quickly, while a day still shows its shape.
MAX_POINTS = 400

Route = tuple[str, "str | None"]  # cluster, group there


class RoutedPlacer:
    """Places a request as the queue does when several clusters hold GPUs: on the first of its routes whose
    cluster places it, with that route's group; when none does, the reason of the cluster that comes
    closest. A request without routes may go anywhere, as placed by the engine alone.

    Only the GPUs of the request's models in its routes' clusters and groups decide whether it is placed,
    and the simulator retries a request once one of the GPUs of its trace group changes, so each request's
    trace group must be its routes' group where they share one and None (every group) where they differ."""

    def __init__(self, routes: Mapping[str, Sequence[Route]]) -> None:
        self.routes = routes
        self._fleet: Fleet | None = None
        self._parts: dict[str, Fleet] = {}

    def __call__(
        self,
        fleet: Fleet,
        request: Request,
        *,
        upcoming: Sequence[Request],
        demand: Mapping[tuple[str, str], float] | None,
    ) -> Placement:
        routes = self.routes.get(request.id)
        if not routes:
            return place(fleet, request, upcoming=upcoming, demand=demand)
        failures = []
        for cluster, group in routes:
            part = self._part(fleet, cluster)
            wanted = Request(request.id, request.items, group)
            later = [self._there(other, cluster) for other in upcoming]
            plan = place(part, wanted, upcoming=later, demand=demand)
            if plan.placed or len(routes) == 1:
                return plan
            failures.append((shortfall(part, wanted), cluster, plan))
        _missing, cluster, plan = min(failures, key=lambda failure: failure[0])  # the first of equals
        return Placement(request.id, False, reason=f"closest on cluster {cluster}: {plan.reason}")

    def _there(self, request: Request, cluster: str) -> Request:
        """A waiting request as the queue shows it to the engine on that cluster: in its group there."""
        for route_cluster, group in self.routes.get(request.id, ()):
            if route_cluster == cluster:
                return Request(request.id, request.items, group)
        return request

    def _part(self, fleet: Fleet, cluster: str) -> Fleet:
        # The GPUs of one cluster, kept while the simulation hands in the same fleet: every try between
        # two changes of the fleet reuses them and the index the engine keeps on them.
        if fleet is not self._fleet:
            self._fleet, self._parts = fleet, {}
        part = self._parts.get(cluster)
        if part is None:
            part = Fleet(tuple(gpu for gpu in fleet.gpus if gpu.cluster == cluster))
            if len(part.gpus) == len(fleet.gpus):
                part = fleet
            self._parts[cluster] = part
        return part


def summary_of(summary: Summary, fleet: Fleet) -> dict:
    """A run's summary as the report's JSON writes it."""
    counts = [count for _at, count in summary.stranded]
    mean = summary.mean_wait_seconds
    return {
        "gpus": len(fleet.gpus),
        "requests": summary.requests,
        "admitted": summary.admitted,
        "served_slice_hours": round(summary.served_slice_hours, 2),
        "mean_wait_seconds": None if mean is None else round(mean, 1),
        "p95_wait_seconds": summary.p95_wait_seconds,
        "stranded": {"min": min(counts), "mean": round(sum(counts) / len(counts), 2), "max": max(counts)}
        if counts
        else None,
    }


def series_of(trace: SimulationTrace, result: SimulationResult, *, max_points: int = MAX_POINTS) -> dict:
    """A run's figures over time, as the report's JSON writes them: {"step_seconds", "compute_slices",
    "at" (each bucket's first second), "utilisation" (0 to 1, None for a fleet without GPUs), "stranded",
    "waiting", "mean_wait_seconds"}, one value per bucket in each list."""
    horizon = max(trace.horizon, 1)
    step = HOUR * max(1, -(-horizon // (HOUR * max(max_points, 1))))
    count = -(-horizon // step)
    models = {gpu.id: gpu.model for gpu in trace.fleet.gpus}
    allocated: list[tuple[int, int]] = []
    waiting: list[tuple[int, int]] = []
    waits: list[list[int]] = [[] for _ in range(count)]
    for timed, outcome in zip(trace.requests, result.outcomes, strict=True):
        if timed.arrive > trace.horizon:
            continue
        admitted = outcome.admitted_at
        waiting.append((timed.arrive, 1))
        if admitted is None:
            continue
        waiting.append((admitted, -1))
        held = held_slices(models, outcome.placement)
        allocated += [(admitted, held), (admitted + timed.hold, -held)]
        waits[min(admitted // step, count - 1)].append(admitted - timed.arrive)
    first = before = stranded_slices(trace.fleet)
    stranded: list[tuple[int, int]] = []
    for at, now in result.summary.stranded:  # the count after each event time's run, until the next one
        stranded.append((at, now - before))
        before = now
    total = len(trace.fleet.gpus) * COMPUTE_SLICES
    use = _means(allocated, 0, horizon, step)
    return {
        "step_seconds": step,
        "compute_slices": total,
        "at": [number * step for number in range(count)],
        "utilisation": [round(value / total, 4) if total else None for value in use],
        "stranded": [round(value, 2) for value in _means(stranded, first, horizon, step)],
        "waiting": [round(value, 2) for value in _means(waiting, 0, horizon, step)],
        "mean_wait_seconds": [round(sum(each) / len(each)) if each else None for each in waits],
    }


def _means(changes: Iterable[tuple[int, float]], start: float, horizon: int, step: int) -> list[float]:
    """The time-weighted mean over each bucket of a quantity that is `start` at second 0 and changes by
    each (second, delta) from that second on; changes at or past the horizon count for nothing."""
    count = -(-horizon // step)
    sums = [0.0] * count
    value, since = start, 0
    for at, delta in sorted(changes, key=lambda change: change[0]):
        at = min(at, horizon)
        _spread(sums, value, since, at, step)
        value, since = value + delta, at
    _spread(sums, value, since, horizon, step)
    return [total / (min(horizon, (number + 1) * step) - number * step) for number, total in enumerate(sums)]


def _spread(sums: list[float], value: float, start: int, end: int, step: int) -> None:
    """Adds value × seconds to each bucket that [start, end) covers, for as long as it covers it."""
    while value and start < end:
        number = start // step
        until = min(end, (number + 1) * step)
        sums[number] += value * (until - start)
        start = until


_ROWS = (
    ("GPUs", "gpus"),
    ("requests", "requests"),
    ("admitted", "admitted"),
    ("served slice-hours", "served_slice_hours"),
    ("mean wait (s)", "mean_wait_seconds"),
    ("p95 wait (s)", "p95_wait_seconds"),
    ("stranded min/mean/max", "stranded"),
)


def side_by_side(report: Mapping) -> str:
    """The report for people: what was simulated, each change, then each fleet's summary in a column."""
    fleets = report["fleets"]
    where = f"cluster {report['cluster']}" if report["cluster"] else "every cluster"
    lines = [f"{report['month']} ({report['time_zone']}), {where}: {fleets['real']['requests']} requests"]
    if report.get("estimated_holds"):
        held = "the median hold of their purpose's admitted requests"
        lines.append(f"{report['estimated_holds']} never admitted, held for {held}")
    lines += [f"change: {change}" for change in report["changes"]]
    names = list(fleets)
    cells = [[label, *(_cell(fleets[name][key]) for name in names)] for label, key in _ROWS]
    widths = [max(len(row[column]) for row in [["", *names], *cells]) for column in range(len(names) + 1)]
    for first, *rest in [["", *names], *cells]:
        columns = (cell.rjust(width) for cell, width in zip(rest, widths[1:], strict=True))
        lines.append("  ".join([first.ljust(widths[0]), *columns]))
    return "\n".join(lines)


def _cell(value: object) -> str:
    if value is None:
        return "-"
    if isinstance(value, dict):
        return f"{value['min']}/{value['mean']:.1f}/{value['max']}"
    if isinstance(value, float):
        return f"{value:.1f}"
    return str(value)
