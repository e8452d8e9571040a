"""Capacity held, within one queue run, for the requests that reclaimed it: nothing else is placed there.

Words used here (the admission policy's are pools/placement/admission.py's):
- hold: a request waiting for borrowed pools under notice (or whose reclaimed pools were just released)
  keeps the GPUs it would be placed on were those pools released. Without it, the free instances beside a
  pool under notice, or a wholly free GPU the request counted on, are given to others during the notice,
  and at its end the request does not fit and reclaims again.
- view: the fleet as one request sees it: the GPUs held for other requests out of its reach (not
  schedulable). A request sees what is held for itself.

Holds are made afresh at each run, in queue order, so that what was freed for a request is its own before
the next one's, and they end when the request is admitted. Pure: plain data in and out.
"""

from __future__ import annotations

from collections.abc import Collection, Hashable
from dataclasses import replace

from pools.placement.engine import fleet_index, with_gpus
from pools.placement.types import Fleet, Placement

__all__ = ["Holds", "fence", "placement_gpus"]


def placement_gpus(placement: Placement) -> frozenset[str]:
    """The GPUs a placement uses: those it assigns from and those it re-partitions."""
    return frozenset(a.gpu for a in placement.assignments) | {c.gpu for c in placement.reconfigure}


def fence(fleet: Fleet, gpus: Collection[str]) -> Fleet:
    """The fleet with these of its GPUs out of reach: not schedulable, so placement gives them nothing."""
    index = fleet_index(fleet)
    positions = {index.position[gpu] for gpu in gpus if gpu in index.position}
    if not positions:
        return fleet
    found = {position: replace(index.gpus[position], schedulable=False) for position in positions}
    return with_gpus(fleet, found, positions)


class Holds:
    """The GPUs held per request in this run, and the views of fleets they make."""

    def __init__(self) -> None:
        self._held: dict[Hashable, frozenset[str]] = {}
        self._views: dict[tuple[int, Hashable], tuple[Fleet, Fleet]] = {}

    def hold(self, request: Hashable, placement: Placement) -> frozenset[str]:
        """Keep for `request` the GPUs of `placement` (where it would go); returns them."""
        gpus = placement_gpus(placement) if placement.placed else frozenset()
        if gpus:
            self._held[request] = gpus
            self._views.clear()
        return gpus

    def lift(self, request: Hashable) -> frozenset[str]:
        """End the request's hold (it was admitted); returns the GPUs it held."""
        gpus = self._held.pop(request, frozenset())
        if gpus:
            self._views.clear()
        return gpus

    def clear(self) -> frozenset[str]:
        """End every hold (a new run makes them afresh); returns the GPUs they held."""
        gpus = frozenset().union(*self._held.values())
        self._held.clear()
        self._views.clear()
        return gpus

    def view(self, fleet: Fleet, request: Hashable) -> Fleet:
        """`fleet` as `request` sees it: the GPUs held for other requests out of its reach."""
        if not self._held:
            return fleet
        mine = request if request in self._held else None
        key = (id(fleet), mine)
        cached = self._views.get(key)
        if cached is not None and cached[0] is fleet:
            return cached[1]
        others = frozenset().union(*(gpus for owner, gpus in self._held.items() if owner != request))
        view = fence(fleet, others)
        self._views[key] = (fleet, view)
        return view
