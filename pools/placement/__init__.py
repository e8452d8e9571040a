"""The placement engine, pure (no Django, no I/O, no clock): `place`, `place_all` and the plain data they use.

Modules: `engine` (place a request), `plan` (plan one request), `layouts` (choose new MIG layouts), `index`
(the fleet, indexed, changed in place), `journal` (the index's versions, one per fleet), `ranks` (a large
bucket's nodes and GPUs ranked for the plan's choices), `choices` (how the plan reads many nodes at once),
`reasons` (why a request does not fit), `availability` (how much one request could get), `trace` (the JSON
of `manage.py place`), `types` (the plain data); over time: `demand` (recent demand,
as the queue and the simulator weigh it), `backfill` (what a request may take while an older one starves),
`simulation` (the queue's policy replayed on a time trace), `replay` (checks a simulated answer),
`timetrace` (the JSON of `manage.py simulate`), `whatif` (a month of history routed and reported), and
`fleet_changes` (a fleet changed for a what-if run). None of them imports this package, so each can be
imported alone.
"""

from pools.placement.engine import apply, fleet_index, place, place_all, shortfall, validate_request
from pools.placement.types import Assignment, Fleet, Gpu, Item, Placement, Reconfigure, Request, Slot

__all__ = [
    "Assignment",
    "Fleet",
    "Gpu",
    "Item",
    "Placement",
    "Reconfigure",
    "Request",
    "Slot",
    "apply",
    "fleet_index",
    "place",
    "place_all",
    "shortfall",
    "validate_request",
]
