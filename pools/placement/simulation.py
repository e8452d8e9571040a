"""What-if simulation of the admission queue over time, on plain data: requests arrive, wait, are admitted by
a placer under the admission policy (pools/placement/admission.py), hold what they were given, give it back.

Words used here (placement words are pools/placement/engine.py's):
- timed request: a request with an arrival time and a hold, how long its pool keeps what it was given.
- event time: a second at which a request arrives or a pool is released, up to the horizon. The queue runs
  once per event time, after that time's releases and arrivals. A pool admitted with a hold of 0 gives its
  instances back right after the run that admitted it (its release falls in that same second).
- waiting: arrived and not admitted. Each run is a run of the admission policy (pools/placement/admission.py),
  as the queue runs it: in arrival order where the trace gives no priorities or quotas, each placed whole or
  not at all, one that fits admitted at once even behind one that does not (backfill), except where an older
  request starves (the policy's words: starving, compete). A request's place is any cluster, in its group.
- quotas: a trace may name tenants with quotas, and each request's tenant and priority. The policy then orders
  by priority and fair share, holds no tenant past its limit, and reclaims for a request within its tenant's
  guarantee: the borrowed pools chosen get `reclaim_notice_seconds` of notice, and at its end give their
  instances back (their hold cut short: `reclaimed_at`), the run at that second admitting the request first.
  Where the request is admitted otherwise first, its pools keep their own end. What the request would be
  placed on once they are released is held for it meanwhile (pools/placement/holds.py), and borrowed pools'
  instances are marked reclaimable, as the queue marks them. With `requeue_reclaimed`, a pool reclaimed at
  its notice's end has its request asked again then, for what its hold had left (the answer's `requeued`).
  A request's `declared_hold` (its end date) caps its hold, and is what placement is told of its end: one
  admitted at t ends at t + declared_hold (the engine puts it where it extends a GPU's busy time least,
  see pools/placement/ends.py); its instances carry that end while held. Without one, its end is unknown.
- re-partitioning: takes no time here. A node re-cut in one run is preferred by later requests of that run,
  as in the queue; by the next run its MIG manager is done. The trace's own marks count for the first run.
  Each run reads the fleet afresh, as the queue reads its snapshot from the database.
- stranded slices: free compute slices no new instance can use (pools/mig.py), counted as the capacity pages
  count them: per MIG GPU, from its layout, whatever on it is allocated.

Pure: no Django, no I/O, no clock. The replay check of an answer is pools/placement/replay.py.
"""

from __future__ import annotations

import heapq
from bisect import bisect_right
from collections import Counter, defaultdict
from collections.abc import Callable, Hashable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from functools import cached_property, lru_cache
from typing import Protocol

from pools.kinds import compute_slices as unit_compute_slices
from pools.kinds import kind_of
from pools.mig import Instance, gpu_model, stranded_compute_slices
from pools.placement.admission import (
    BORROWED,
    Admitted,
    Claim,
    Holding,
    Ledger,
    Quota,
    Reclaims,
    Waiting,
    Waits,
    asked_slices,
    run_queue,
)
from pools.placement.backfill import out_of_the_way, room_out_of_the_way
from pools.placement.demand import DEMAND_WINDOW_SECONDS, recent_demand
from pools.placement.engine import Replaced, apply, fleet_index, place, with_gpus
from pools.placement.holds import Holds
from pools.placement.plan import QUEUE_WINDOW
from pools.placement.types import Assignment, Fleet, Gpu, Item, Placement, Request

__all__ = [
    "Outcome",
    "Placer",
    "SimulationResult",
    "SimulationTrace",
    "Summary",
    "TimedRequest",
    "compute_slices",
    "held_slices",
    "held_until",
    "p95",
    "release",
    "requeued_request",
    "requeued_requests",
    "simulate",
    "stranded_slices",
]

PROGRESS_STEP = 0.01  # of the horizon: a hundred reports at most, whatever the number of event times
AFTER_HORIZON = "arrives after the horizon"


@dataclass(frozen=True)
class TimedRequest:
    id: str
    arrive: int  # seconds from the start
    hold: int  # seconds its pool keeps what it was given
    items: tuple[Item, ...]
    group: str | None = None
    tenant: str | None = None  # whose quotas it is judged against; None: no tenant's
    priority: int = 0
    declared_hold: int | None = None  # the end it declared: its pool holds min(hold, declared_hold)

    @property
    def held_for(self) -> int:
        return self.hold if self.declared_hold is None else min(self.hold, self.declared_hold)

    @cached_property
    def request(self) -> Request:
        """What the placer is asked to place."""
        return Request(self.id, self.items, self.group)


@dataclass(frozen=True)
class SimulationTrace:
    fleet: Fleet
    requests: tuple[TimedRequest, ...]  # in arrival order, ids unique
    horizon: int  # seconds: nothing happens after it
    backfill_grace_seconds: int | None = None  # None: backfill is never held back
    # Per tenant, its quotas by (group, model) key (pools/placement/admission.py); none: no quotas at all.
    quotas: Mapping[str, Mapping[tuple[str, str], Quota]] = field(default_factory=dict)
    reclaim_notice_seconds: int = 900
    # A reclaimed pool's request is asked again for what its hold had left (the portal's RECLAIM_REQUEUE).
    requeue_reclaimed: bool = False


@dataclass(frozen=True)
class Outcome:
    request: str
    admitted_at: int | None
    # Placed when admitted; else unplaced, with why it still waits (or never came) when the horizon fell.
    placement: Placement
    borrowed: bool = False  # admitted beyond its tenant's guarantee
    reclaimed_at: int | None = None  # when its notice ended and its instances were given back, if reclaimed
    # How many were admitted before it (a run admits in queue order): the replay's, not part of the answer.
    sequence: int | None = field(default=None, compare=False)
    # Which queue run admitted it (a second may see several, the releases between them): the replay's too.
    run: int | None = field(default=None, compare=False)
    # Where reclaimed pools are requeued: each later admission of what its hold had left, in order.
    requeued: tuple[Outcome, ...] = ()


@dataclass(frozen=True)
class Summary:
    requests: int
    admitted: int
    served_slice_hours: float  # compute slices held × hours held, before the horizon
    mean_wait_seconds: float | None  # of admitted requests; None when none was
    p95_wait_seconds: int | None  # nearest rank: the least wait that 95 % of admitted requests stay within
    stranded: tuple[tuple[int, int], ...]  # (event time, stranded compute slices after its run)
    # Of the admitted requests within their tenant's guarantee as they arrived (None: none, or no quotas).
    p95_within_wait_seconds: int | None = None
    reclaimed: int = 0  # pools whose notice ended before their own end


@dataclass(frozen=True)
class SimulationResult:
    outcomes: tuple[Outcome, ...]  # one per trace request, in trace order
    summary: Summary
    within: frozenset[str] = frozenset()  # requests within their tenant's guarantee as they arrived


class Placer(Protocol):
    """Where one request goes now, as pools.placement.engine.place answers (its default). The simulation
    retries a request only once a GPU it could use (of its models, in its group) has changed, so whether a
    placer places a request must depend on those GPUs alone; `upcoming` and `demand` may steer only how."""

    def __call__(
        self,
        fleet: Fleet,
        request: Request,
        *,
        upcoming: Sequence[Request],
        demand: Mapping[tuple[str, str], float] | None,
    ) -> Placement: ...


def simulate(
    trace: SimulationTrace,
    *,
    placer: Placer = place,
    demand_window_seconds: float = DEMAND_WINDOW_SECONDS,
    progress: Callable[[float], None] | None = None,
) -> SimulationResult:
    """The trace run to its horizon: every event time's releases, arrivals and queue run, in time order.
    `progress(done)` is told the share of the horizon simulated so far, each time it has grown by a
    PROGRESS_STEP or more, and 1.0 at the end. Raises ValueError when the placer answers a placement that
    breaks a rule (engine.apply refuses it)."""
    queue = _Queue(trace, placer, demand_window_seconds)
    requests, arrivals = trace.requests, 0
    first = True
    told = 0.0
    while True:
        times = [requests[arrivals].arrive] if arrivals < len(requests) else []
        upcoming = queue.next_release()
        if upcoming is not None:
            times.append(upcoming)
        if not times or min(times) > trace.horizon:
            break
        now = min(times)
        queue.release_until(now)
        queue.settle(keep_marks=first)
        first = False
        while arrivals < len(requests) and requests[arrivals].arrive <= now:
            queue.arrive(arrivals)
            arrivals += 1
        queue.freed_now = False  # what the releases before this run freed, this run sees
        queue.run(now)
        queue.release_until(now)  # what was admitted with a hold of 0, and pools reclaimed with no notice
        while queue.freed_now:  # those freed room for the requests they were reclaimed for: a run for them
            queue.freed_now = False
            queue.run(now)
            queue.release_until(now)
        queue.stranded.append((now, queue.stranded_now()))
        if progress is not None and now / trace.horizon - told >= PROGRESS_STEP:
            told = now / trace.horizon
            progress(told)
    if progress is not None:
        progress(1.0)
    return queue.result()


def release(fleet: Fleet, placement: Placement) -> Fleet:
    """The fleet once a placement's pool is released: each instance (or whole GPU) it was assigned is free
    again; layouts, MIG modes and the marks of nodes being re-partitioned stay as they are (docs/traces.md).
    The inverse of engine.apply for what apply allocates. Raises ValueError for anything it names not held."""
    if not placement.placed:
        return fleet
    index = fleet_index(fleet)
    gpus = Replaced(index.gpus)
    changed: set[int] = set()
    for assignment in placement.assignments:
        position = index.position.get(assignment.gpu)
        if position is None:
            raise ValueError(f"The placement names GPU {assignment.gpu!r}, which is not in the fleet.")
        gpus[position] = _free(gpus[position], assignment)
        changed.add(position)
    return with_gpus(fleet, gpus, changed)


def mark(fleet: Fleet, placement: Placement, *, reclaimable: bool) -> Fleet:
    """The fleet with the instances a placement holds marked reclaimable or not."""
    index = fleet_index(fleet)
    gpus = Replaced(index.gpus)
    changed: set[int] = set()
    for assignment in placement.assignments:
        if kind_of(assignment.profile).takes_whole_gpu:
            continue
        position = index.position[assignment.gpu]
        gpu = gpus[position]
        gpus[position] = replace(
            gpu,
            instances=tuple(
                replace(slot, reclaimable=reclaimable) if slot.start == assignment.start else slot
                for slot in gpu.instances
            ),
        )
        changed.add(position)
    return with_gpus(fleet, gpus, changed)


def _free(gpu: Gpu, assignment: Assignment) -> Gpu:
    if kind_of(assignment.profile).takes_whole_gpu:
        if gpu.mig or not gpu.allocated:
            raise ValueError(f"GPU {gpu.id} is not a MIG-disabled GPU in use: it cannot be given back whole.")
        return replace(gpu, allocated=False, ends=None)
    slots = list(gpu.instances)
    for number, slot in enumerate(slots):
        if slot.start == assignment.start and slot.profile == assignment.profile and slot.allocated:
            slots[number] = replace(slot, allocated=False, reclaimable=False, ends=None)
            return replace(gpu, instances=tuple(slots))
    raise ValueError(f"GPU {gpu.id} has no allocated {assignment.profile} instance at {assignment.start}.")


def compute_slices(fleet: Fleet, placement: Placement) -> int:
    """Compute slices a placement holds: each instance its profile's, a whole GPU all of them."""
    return held_slices({gpu.id: gpu.model for gpu in fleet.gpus}, placement)


def held_slices(models: Mapping[str, str], placement: Placement) -> int:
    """compute_slices, given the fleet's GPU models by GPU id (built once for many placements)."""
    return sum(unit_compute_slices(models[a.gpu], a.profile) for a in placement.assignments)


def stranded_slices(fleet: Fleet) -> int:
    """Stranded compute slices of the fleet: those of each MIG GPU's layout (pools/mig.py), as the capacity
    pages count them; a MIG-disabled GPU strands nothing."""
    return sum(
        _stranded(gpu.model, tuple((slot.start, slot.profile) for slot in gpu.instances))
        for gpu in fleet.gpus
        if gpu.mig
    )


@lru_cache(maxsize=4096)
def _stranded(model: str, layout: tuple[tuple[int, str], ...]) -> int:
    # An exact search per layout; a fleet holds few distinct layouts, so each is searched once.
    return stranded_compute_slices(gpu_model(model), [Instance(start, profile) for start, profile in layout])


@dataclass
class _Queue:
    """The state between event times: the fleet, who waits, who holds what until when."""

    trace: SimulationTrace
    placer: Placer
    window: float
    fleet: Fleet = field(init=False)
    waiting: list[int] = field(default_factory=list)  # positions in the trace, in arrival order
    releases: list[tuple[int, int]] = field(default_factory=list)  # heap of (release time, position)
    admitted: dict[int, tuple[int, Placement]] = field(default_factory=dict)
    reasons: dict[int, str] = field(default_factory=dict)
    stranded: list[tuple[int, int]] = field(default_factory=list)
    # Whether a request fits depends only on the GPUs it could use (its models, its group's or every
    # group's), so a failed try is kept with the change count it saw and is not repeated until one of
    # those GPUs changes: on most event times most of the queue is not placed again.
    changes: int = 0
    stamps: dict[tuple[str, str, str | None], int] = field(default_factory=dict)  # bucket -> last change
    failed: dict[int, tuple[int, str]] = field(default_factory=dict)  # position -> (change count, reason)
    _stranded_now: int | None = None
    _demand: dict[tuple[str, str], float] | None = None

    def __post_init__(self) -> None:
        self.fleet = self.trace.fleet
        self.keys = {gpu.id: (gpu.cluster, gpu.model, gpu.group) for gpu in self.fleet.gpus}
        buckets = set(self.keys.values())
        # A GPU's change may change what its node's other GPUs can take (a node's share mode changes only
        # once all its MIG-off GPUs are free), so a change stamps every bucket of its node.
        on_node: dict[tuple[str, str], set] = defaultdict(set)
        for gpu in self.fleet.gpus:
            on_node[(gpu.cluster, gpu.node)].add(self.keys[gpu.id])
        self.node_keys = {gpu.id: frozenset(on_node[(gpu.cluster, gpu.node)]) for gpu in self.fleet.gpus}
        self.claims: list[Claim] = []
        self.buckets: list[tuple[tuple[str, str, str | None], ...]] = []
        self.ledger = Ledger(quotas=self.trace.quotas)
        # The trace's requests, then what reclaimed pools ask again (`requeue_reclaimed`), each by position.
        self.requests: list[TimedRequest] = []
        self.asked: list[dict] = []
        self.requeued: dict[int, list[int]] = {}  # a trace request's position -> its requeued positions
        self.origin: dict[int, int] = {}  # a requeued position -> the trace request's
        # Reclaims: the request each pool under notice is reclaimed for, and the notices' ends; the release
        # due for each admitted position (a reclaim moves it sooner, a call-off back).
        self.notice_for: dict[int, int] = {}
        self.reclaimed_at: dict[int, int] = {}
        self.cut: dict[int, int] = {}  # pools under notice whose notice ends before their own end: when
        self.due: dict[int, int] = {}
        self.freed_for: set[int] = set()  # requests for which a reclaimed pool was released
        self.freed_now = False  # whether such a pool was released since the last run
        self.borrowed: set[int] = set()
        self.within: set[int] = set()  # requests within their tenant's guarantee as they arrived
        self.order: dict[int, int] = {}  # position -> how many were admitted before it
        self.marked: set[int] = set()  # live pools whose instances the fleet marks reclaimable
        self.holds = Holds()  # GPUs held in this run for requests that reclaimed them
        self.runs = 0  # queue runs so far
        self.run_of: dict[int, int] = {}  # position -> the run that admitted it
        self._buckets = buckets
        for timed in self.trace.requests:
            self._add(timed)
        self.arrived: list[int] = []  # arrival times so far, for the demand window
        self.arrivals: list[tuple[int, tuple[Item, ...]]] = []

    def _add(self, timed: TimedRequest) -> int:
        models = frozenset(item.model for item in timed.items)
        self.requests.append(timed)
        self.asked.append(asked_slices(timed.items, timed.group))
        self.claims.append(Claim.of(timed.items, [(None, timed.group)]))
        self.buckets.append(tuple(b for b in self._buckets if b[1] in models and timed.group in (None, b[2])))
        return len(self.requests) - 1

    def _requeue(self, position: int, at: int) -> None:
        """The reclaimed pool's request asked again for what its hold had left, arriving now."""
        timed = self.requests[position]
        again = requeued_request(timed, self.admitted[position][0], at)
        if again.hold <= 0:
            return
        origin = self.origin.get(position, position)
        new = self._add(again)
        self.origin[new] = origin
        self.requeued.setdefault(origin, []).append(new)
        self.waiting.append(new)
        self.arrived.append(at)
        self.arrivals.append((at, again.items))

    def arrive(self, position: int) -> None:
        timed = self.requests[position]
        if self.ledger.guarantees and self._within_on_arrival(position):
            self.within.add(position)
        self.waiting.append(position)
        self.arrived.append(timed.arrive)
        self.arrivals.append((timed.arrive, timed.items))

    def _within_on_arrival(self, position: int) -> bool:
        """Whether a request is within its tenant's guarantee as it arrives, what the tenant holds and still
        waits for counted, as the portal judges a request at submission."""
        tenant = self.requests[position].tenant
        pending: Counter = Counter()
        for waiting in self.waiting:
            if self.requests[waiting].tenant == tenant:
                pending.update(self.asked[waiting])
        return all(
            self.ledger.held[tenant][key] + pending[key] + slices <= self.ledger.quota(tenant, key).guaranteed
            for key, slices in self.asked[position].items()
        )

    def settle(self, *, keep_marks: bool) -> None:
        """The fleet as a queue run reads it afresh, with the re-partitioning of earlier runs done (unless
        `keep_marks`). Afresh, because the engine takes equally good GPUs in its index's order, which the
        changes carried forward reorder; the queue indexes a fresh snapshot at each run, and so does this."""
        gpus = self.fleet.gpus
        if not keep_marks:
            # A GPU done re-partitioning takes work again: the requests that could use it are worth retrying.
            self._stamp(frozenset(g.id for g in gpus if g.reconfiguring))
            gpus = tuple(replace(g, reconfiguring=False) if g.reconfiguring else g for g in gpus)
        self.fleet = Fleet(gpus)

    def next_release(self) -> int | None:
        """The next second a pool gives its instances back; entries a reclaim or its call-off moved are
        dropped, so that no queue runs where nothing happens."""
        while self.releases and self.due.get(self.releases[0][1]) != self.releases[0][0]:
            heapq.heappop(self.releases)
        return self.releases[0][0] if self.releases else None

    def release_until(self, now: int) -> None:
        while self.releases and self.releases[0][0] <= now:
            at, position = heapq.heappop(self.releases)
            if self.due.get(position) != at:
                continue  # moved: by a reclaim's notice, or back by its call-off
            del self.due[position]
            placement = self.admitted[position][1]
            self.fleet = release(self.fleet, placement)
            self._touched(placement)
            timed = self.requests[position]
            self.ledger.give(timed.tenant, None, self.asked[position])
            if position in self.notice_for:  # given back for the request it was reclaimed for
                self.freed_for.add(self.notice_for.pop(position))
                self.freed_now = True
                if self.cut.pop(position, None) == at:  # at its notice's end, not its own
                    self.reclaimed_at[position] = at
                    if self.trace.requeue_reclaimed:
                        self._requeue(position, at)

    def run(self, now: int) -> None:
        """One queue run under the admission policy (pools/placement/admission.py), this queue its room."""
        self._demand = None  # counted once per run, and only if something is placed
        self._now = now
        self.runs += 1
        self._stamp(self.holds.clear())
        waiting = [self._waiting(position, now) for position in self.waiting]
        holdings = self._holdings() if self.ledger.guarantees else []
        if holdings:
            self._mark_borrowed(holdings)
        decisions = run_queue(
            waiting,
            self.ledger,
            self,
            grace_seconds=self.trace.backfill_grace_seconds,
            window=QUEUE_WINDOW,
            holdings=holdings,
        )
        for decision in decisions:
            position = decision.request.id
            if isinstance(decision, Reclaims):
                self._give_notice(position, [victim.pool for victim in decision.victims], now)
            if isinstance(decision, Waits):
                self.reasons[position] = decision.reason
                continue
            if decision.verdict.kind == BORROWED and self.ledger.in_force:
                self.borrowed.add(position)
            self._call_off(position)
        admitted = {d.request.id for d in decisions if isinstance(d, Admitted)}
        self.waiting = [position for position in self.waiting if position not in admitted]

    def _mark_borrowed(self, holdings: list[Holding]) -> None:
        """The instances of the pools borrowed now marked reclaimable in the fleet, the rest not, as the
        queue's snapshot marks them (a pool turns within as its tenant's earlier pools end)."""
        now = self.ledger.borrowed_pools(holdings)
        for position in now.symmetric_difference(self.marked):
            if position in self.due:
                self.fleet = mark(self.fleet, self.admitted[position][1], reclaimable=position in now)
        self.marked = now

    def _holdings(self) -> list[Holding]:
        """The live pools, as the policy chooses among them what to reclaim."""
        return [
            Holding(
                position,
                self.requests[position].tenant,
                None,
                self.requests[position].priority,
                (self.admitted[position][0], self.order[position]),
                self.asked[position],
                reclaimable=position not in self.notice_for,
            )
            for position in self.due
        ]

    def _give_notice(self, request: int, victims: list[int], now: int) -> None:
        at = now + self.trace.reclaim_notice_seconds
        for victim in victims:
            self.notice_for[victim] = request
            if at < self.due[victim]:  # one that ends before its notice does just ends
                self.due[victim] = self.cut[victim] = at
                heapq.heappush(self.releases, (at, victim))

    def _call_off(self, request: int) -> None:
        """The request is admitted: the pools under notice for it are kept, to their own end."""
        for victim in [v for v, owner in self.notice_for.items() if owner == request]:
            del self.notice_for[victim]
            self.cut.pop(victim, None)
            at, timed = self.admitted[victim][0], self.requests[victim]
            if self.due[victim] != at + timed.held_for:
                self.due[victim] = at + timed.held_for
                heapq.heappush(self.releases, (self.due[victim], victim))

    def _waiting(self, position: int, now: int) -> Waiting:
        timed = self.requests[position]
        return Waiting(
            id=position,
            tenant=timed.tenant,
            project=None,
            priority=timed.priority,
            arrival=(position,),
            waited=now - timed.arrive,
            items=timed.items,
            claim=self.claims[position],
            asked=self.asked[position],
            reclaiming=tuple(v for v, owner in self.notice_for.items() if owner == position),
            reclaimed=position in self.freed_for,
        )

    # The room the admission policy places in: this queue's fleet.

    def place(self, request: Waiting, upcoming: Sequence[Waiting], *, reclaimable: bool) -> Placement:
        position = request.id
        if not self._worth_trying(position):
            return Placement(self.requests[position].id, False, reason=self.failed[position][1])
        later = [self.requests[w.id].request for w in upcoming]
        placement = self._place(position, later, self._now, reclaimable)
        if not placement.placed:
            self.failed[position] = (self.changes, placement.reason)
        return placement

    def room_out_of_the_way(self, request: Waiting) -> bool:
        return room_out_of_the_way(self._view(request.id), request.items)

    def out_of_the_way(self, placement: Placement, wanted: frozenset[tuple[str, str]]) -> bool:
        return out_of_the_way(self.fleet, placement, wanted)

    def admit(self, request: Waiting, placement: Placement) -> None:
        self._admit(request.id, placement, self._now)
        self._stamp(self.holds.lift(request.id))

    def fits_without(self, request: Waiting, victims: Sequence[Holding]) -> bool:
        return self._without(request.id, [victim.pool for victim in victims]).placed

    def _without(self, position: int, pools: Sequence[int]) -> Placement:
        """Where the request would go were these pools released, out of what is held for others."""
        fleet = self._view(position)
        for pool in pools:
            fleet = release(fleet, self.admitted[pool][1])
        return self.placer(fleet, self._asked(position, self._now), upcoming=[], demand=None)

    def hold(self, request: Waiting, pools: Sequence[Hashable]) -> None:
        live = [pool for pool in pools if pool in self.due]  # one that ended by itself is free already
        self._stamp(self.holds.hold(request.id, self._without(request.id, live)))

    def _view(self, position: int) -> Fleet:
        return self.holds.view(self.fleet, position)

    def _stamp(self, gpus: frozenset[str]) -> None:
        """What is held, or no longer held, changed for the requests that could use those GPUs."""
        if gpus:
            self.changes += 1
            for gpu in gpus:
                for key in self.node_keys[gpu]:
                    self.stamps[key] = self.changes

    def _place(self, position: int, upcoming: list[Request], now: int, reclaimable: bool) -> Placement:
        if self._demand is None:
            # The arrivals of the window, its oldest second left out, as pools/selectors/demand.py reads them.
            start = bisect_right(self.arrived, now - self.window)
            self._demand = recent_demand(self.arrivals[start:], now=now, window_seconds=self.window)
        request = self._asked(position, now)
        if reclaimable:
            request = replace(request, reclaimable=True)
        # No demand at all is told as None, as the queue tells it: the engine then counts the request itself.
        return self.placer(self._view(position), request, upcoming=upcoming, demand=self._demand or None)

    def _asked(self, position: int, now: int) -> Request:
        """What the placer is asked to place now: the request, ending at its declared end were it admitted
        now (never at the end of its true hold, which placement cannot know)."""
        timed = self.requests[position]
        if timed.declared_hold is None:
            return timed.request
        return replace(timed.request, ends=now + timed.declared_hold)

    def _worth_trying(self, position: int) -> bool:
        if position not in self.failed:
            return True
        seen = self.failed[position][0]
        return any(self.stamps.get(key, 0) > seen for key in self.buckets[position])

    def _admit(self, position: int, placement: Placement, now: int) -> None:
        self.fleet = apply(self.fleet, placement)
        self._touched(placement)
        if placement.reconfigure:
            self._stranded_now = None
        self.admitted[position] = (now, placement)
        self.order[position] = len(self.order)  # admissions of one second keep the order they came in
        self.run_of[position] = self.runs
        self.due[position] = now + self.requests[position].held_for
        heapq.heappush(self.releases, (self.due[position], position))

    def _touched(self, placement: Placement) -> None:
        self.changes += 1
        for gpu in {a.gpu for a in placement.assignments} | {c.gpu for c in placement.reconfigure}:
            for key in self.node_keys[gpu]:
                self.stamps[key] = self.changes

    def stranded_now(self) -> int:
        if self._stranded_now is None:
            self._stranded_now = stranded_slices(self.fleet)
        return self._stranded_now

    def result(self) -> SimulationResult:
        trace, outcomes, waits, within_waits = self.trace, [], [], []
        served = 0.0
        models = {gpu.id: gpu.model for gpu in trace.fleet.gpus}
        for position, timed in enumerate(trace.requests):
            outcome = self._outcome(position)
            if outcome.admitted_at is not None:
                waits.append(outcome.admitted_at - timed.arrive)
                if position in self.within:
                    within_waits.append(outcome.admitted_at - timed.arrive)
            requeued = tuple(self._outcome(again) for again in self.requeued.get(position, ()))
            if requeued:
                outcome = replace(outcome, requeued=requeued)
            for one, asked in zip(
                (outcome, *requeued), (timed, *requeued_requests(timed, outcome)), strict=True
            ):
                if one.admitted_at is not None:
                    end = min(held_until(asked, one), trace.horizon)
                    served += held_slices(models, one.placement) * (end - one.admitted_at) / 3600
            outcomes.append(outcome)
        return SimulationResult(
            tuple(outcomes),
            Summary(
                requests=len(trace.requests),
                admitted=len(waits),
                served_slice_hours=served,
                mean_wait_seconds=sum(waits) / len(waits) if waits else None,
                p95_wait_seconds=p95(waits),
                stranded=tuple(self.stranded),
                p95_within_wait_seconds=p95(within_waits),
                reclaimed=len(self.reclaimed_at),
            ),
            frozenset(trace.requests[position].id for position in self.within),
        )

    def _outcome(self, position: int) -> Outcome:
        timed = self.requests[position]
        if position not in self.admitted:
            reason = self.reasons.get(position, AFTER_HORIZON)
            return Outcome(timed.id, None, Placement(timed.id, False, reason=reason))
        at, placement = self.admitted[position]
        reclaimed = self.reclaimed_at.get(position)
        return Outcome(
            timed.id,
            at,
            placement,
            position in self.borrowed,
            reclaimed,
            self.order[position],
            run=self.run_of[position],
        )


def p95(waits: Sequence[int]) -> int | None:
    """Nearest rank: the least wait that 95 % of them stay within; None for none."""
    return sorted(waits)[-(-95 * len(waits) // 100) - 1] if waits else None


def requeued_request(timed: TimedRequest, admitted_at: int, reclaimed_at: int) -> TimedRequest:
    """What a reclaimed pool's request asks again, where reclaimed pools are requeued: the same request,
    arriving when the notice ended, for what its hold had left."""
    return replace(
        timed, arrive=reclaimed_at, hold=admitted_at + timed.held_for - reclaimed_at, declared_hold=None
    )


def requeued_requests(timed: TimedRequest, outcome: Outcome) -> list[TimedRequest]:
    """The requests asked again for each entry of `outcome.requeued`, in order: each after the one before
    it was reclaimed."""
    found, asked, before = [], timed, outcome
    for again in outcome.requeued:
        if before.admitted_at is None or before.reclaimed_at is None:
            break  # a malformed answer: the replay check says so
        asked = requeued_request(asked, before.admitted_at, before.reclaimed_at)
        found.append(asked)
        before = again
    return found


def held_until(timed: TimedRequest, outcome: Outcome) -> int:
    """When an admitted request's pool gives its instances back: at its hold's end (`declared_hold` capping
    it), or where it was reclaimed sooner, at the end of its notice."""
    if outcome.reclaimed_at is not None:
        return outcome.reclaimed_at
    return outcome.admitted_at + timed.held_for
