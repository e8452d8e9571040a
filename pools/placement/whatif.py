"""What-if runs of a month of history, their pure parts: a placer that sends each request to the clusters the
queue would try, and the report that sets the real fleet's run beside the changed fleet's.

Words used here (simulation words are pools/placement/simulation.py's):
- route: a cluster a request may land on and the GPU group it is placed in there (None: any of its GPUs).
  A request asked for one cluster has one route; one asked for any cluster has one per cluster, in name
  order, as the queue tries them (pools/services/queue.py).
- summary: a run's figures as the report shows them: requests, admitted, served compute-slice-hours, mean
  and p95 wait of the admitted, stranded compute slices over the run's event times, GPUs of the fleet.

Pure: plain data in, plain data out; no Django, no I/O, no clock.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from pools.placement.engine import place, shortfall
from pools.placement.simulation import Summary
from pools.placement.types import Fleet, Placement, Request

__all__ = ["Route", "RoutedPlacer", "side_by_side", "summary_of"]

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
