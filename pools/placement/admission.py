"""The admission policy, pure: in what order a queue run takes waiting requests, what a starving request holds
back, and what a tenant's quotas allow. The queue (pools/services/queue.py) and the what-if simulator
(pools/placement/simulation.py) run `run_queue` on their own plain data, the approvers' verdicts and the
request form judge quotas by its `Ledger`; none keeps a rule of its own.

Words used here (placement words are pools/placement/engine.py's):
- quota key: a GPU group (the workload type a request names as its purpose, "" for none) and a GPU model.
- slices: compute slices. A MIG instance counts its profile's, a whole GPU all of them (pools/mig.py).
- quota: a tenant's, in one key: `guaranteed`, the slices it is promised, and `limit`, the most it may hold,
  borrowing included (None: no limit). A tenant with no quota in a key has no guarantee there and the
  ledger's default limit. A project may have a limit of its own inside its tenant's.
- held: the slices of a tenant's (or project's) live pools, per key.
- verdict of a request: `within` when what it asks fits in what its tenant's guarantee leaves in every key,
  `borrowed` when some of it goes beyond the guarantee but no limit, `beyond_limit` when it would take its
  tenant or project past a limit (refused at submit; at a queue run it waits, and never starves others).
  The guarantee is an amount its tenant's requests share: what the requests before this one (at submission,
  those approved; in a queue run, those ahead of it in queue order) still wait for counts against it, so
  that a backlog does not make every request of it within, nor reclaim more than the guarantee. A limit
  counts only what is held.
- share: a tenant's dominant share, the largest held / guaranteed over the keys where it has a guarantee;
  infinite where it has none. Among equal priorities the tenant with the lowest share goes first, then the
  earliest arrival. Where no tenant has a guarantee, that is priority, then arrival.
- place: where a request may land, as (cluster, group), None for any. Two requests compete when they ask
  for a common GPU model and some place of one overlaps some place of the other.
- starving: a waiting request that does not fit in this run and has waited the backfill grace (None: never
  starving). For the rest of the run, a request of the same or lower priority that competes with it is
  admitted only where it lands out of its way (pools/placement/backfill.py), so that freed capacity
  collects for it. One held back waits behind it and is not starving itself. A request within its tenant's
  guarantee is held back only by a starving request within its own: a guarantee comes before the
  protection of a request that would borrow.

Pure: no Django, no I/O, no clock.
"""

from __future__ import annotations

import math
from collections import Counter, defaultdict, deque
from collections.abc import Callable, Hashable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from itertools import islice
from typing import Protocol

from pools.kinds import compute_slices, shown_slices
from pools.placement.backfill import may_keep_out_of_the_way, wanted_pairs
from pools.placement.reasons import Reason, gettext_noop
from pools.placement.types import Item, Placement

__all__ = [
    "BEHIND_OLDER",
    "BEYOND_LIMIT",
    "BORROWED",
    "WITHIN",
    "Admitted",
    "Claim",
    "Holding",
    "Ledger",
    "Quota",
    "QuotaVerdict",
    "Reclaims",
    "Room",
    "Waiting",
    "Waits",
    "asked_slices",
    "choose_victims",
    "item_slices",
    "reclaim_candidates",
    "run_queue",
]

Key = tuple[str, str]  # (GPU group, "" for none; GPU model)
Place = tuple[str | None, str | None]  # (cluster, group); None: any

WITHIN, BORROWED, BEYOND_LIMIT = "within", "borrowed", "beyond_limit"

BEHIND_OLDER = gettext_noop("waiting behind an older request that needs the capacity first")
OVER_LIMIT = gettext_noop(
    "%(owner)s would hold %(held)s of its limit of %(limit)s compute slices of %(model)s%(group)s; "
    "it holds %(holding)s now"
)
IN_GROUP = gettext_noop(" in group %(group)s")
UNDER_NOTICE = gettext_noop(
    "within its tenant's guarantee: %(count)s borrowed pools are reclaimed for it, and it is admitted when "
    "their notice ends"
)
NOT_EVEN_RECLAIMED = gettext_noop(
    "within its tenant's guarantee, but it would not fit even were every borrowed pool released: %(reason)s"
)


def item_slices(item: Item) -> int:
    """Compute slices an item asks for: each instance its profile's, a whole GPU all of them."""
    return compute_slices(item.model, item.profile) * item.count


def asked_slices(items: Iterable[Item], group: str | None) -> dict[Key, int]:
    """Per quota key, the compute slices that items asked for under `group` (None or "": no group) take."""
    asked: Counter = Counter()
    for item in items:
        asked[(group or "", item.model)] += item_slices(item)
    return dict(asked)


@dataclass(frozen=True)
class Quota:
    guaranteed: int = 0
    limit: int | None = None  # None: no limit


@dataclass(frozen=True)
class QuotaVerdict:
    """`kind` is WITHIN, BORROWED or BEYOND_LIMIT. For BEYOND_LIMIT, `key` is the first key that goes past a
    limit and `project` says whether the limit is the project's; for BORROWED, `borrowed` is how many of
    the asked slices go beyond the guarantee, over all keys."""

    kind: str
    key: Key | None = None
    asked: int = 0
    held: int = 0
    limit: int | None = None
    project: bool = False
    borrowed: int = 0

    def reason(self, owner: str) -> Reason | None:
        """Why a request beyond a limit may not be admitted, naming the quota; None for the other kinds."""
        if self.kind != BEYOND_LIMIT or self.key is None:
            return None
        group, model = self.key
        return Reason(
            OVER_LIMIT,
            owner=owner,
            held=shown_slices(self.held + self.asked),
            limit=self.limit,
            model=model,
            group=Reason(IN_GROUP, group=group) if group else "",
            holding=shown_slices(self.held),
        )


@dataclass
class Ledger:
    """Quotas and what each tenant and project holds, per key. `take` and `give` keep `held` as pools are
    admitted and released within a run (or over a simulation)."""

    # tenant -> key -> quota; project -> key -> limit; tenant (project) -> key -> slices held
    quotas: Mapping[Hashable, Mapping[Key, Quota]] = field(default_factory=dict)
    project_limits: Mapping[Hashable, Mapping[Key, int]] = field(default_factory=dict)
    held: dict[Hashable, Counter] = field(default_factory=lambda: defaultdict(Counter))
    project_held: dict[Hashable, Counter] = field(default_factory=lambda: defaultdict(Counter))
    default_limit: int | None = None

    def __post_init__(self) -> None:
        self.held = defaultdict(Counter, {t: Counter(h) for t, h in self.held.items()})
        self.project_held = defaultdict(Counter, {p: Counter(h) for p, h in self.project_held.items()})
        self.guarantees = any(q.guaranteed for quotas in self.quotas.values() for q in quotas.values())
        # Where no tenant has a quota, no project a limit, and there is no default limit, quotas say nothing:
        # every request is judged as borrowed, and nothing is told of it.
        self.in_force = bool(
            any(self.quotas.values()) or any(self.project_limits.values()) or self.default_limit is not None
        )

    def quota(self, tenant: Hashable, key: Key) -> Quota:
        found = self.quotas.get(tenant, {}).get(key)
        return found if found is not None else Quota(0, self.default_limit)

    def verdict(
        self,
        tenant: Hashable,
        project: Hashable,
        asked: Mapping[Key, int],
        ahead: Mapping[Key, int] | None = None,
    ) -> QuotaVerdict:
        """`ahead`: what the tenant's requests before this one still wait for, per key. It counts against the
        guarantee (they come first to it), not against a limit (only what is held does)."""
        borrowed = 0
        for key, slices in sorted(asked.items()):
            quota, held = self.quota(tenant, key), self.held[tenant][key]
            if quota.limit is not None and held + slices > quota.limit:
                return QuotaVerdict(BEYOND_LIMIT, key, slices, held, quota.limit)
            limit = self.project_limits.get(project, {}).get(key)
            if limit is not None and self.project_held[project][key] + slices > limit:
                return QuotaVerdict(BEYOND_LIMIT, key, slices, self.project_held[project][key], limit, True)
            before = held + (ahead or {}).get(key, 0)
            borrowed += min(slices, max(0, before + slices - quota.guaranteed))
        return QuotaVerdict(BORROWED if borrowed else WITHIN, borrowed=borrowed)

    def share(self, tenant: Hashable) -> float:
        """The tenant's dominant share of its guarantees; infinite where it has none."""
        shares = [
            self.held[tenant][key] / quota.guaranteed
            for key, quota in self.quotas.get(tenant, {}).items()
            if quota.guaranteed
        ]
        return max(shares) if shares else math.inf

    def borrowed(self, holdings: Iterable[Holding]) -> dict[Hashable, dict[Key, int]]:
        """Per pool, its borrowed slices by key: each tenant's pools taken in admission order, a pool's slices
        in a key count within the guarantee until the tenant's earlier pools and this one pass it."""
        counted: dict[tuple[Hashable, Key], int] = defaultdict(int)
        found: dict[Hashable, dict[Key, int]] = {}
        for holding in sorted(holdings, key=lambda h: h.admitted):
            beyond: dict[Key, int] = {}
            for key, slices in holding.slices.items():
                before = counted[(holding.tenant, key)]
                counted[(holding.tenant, key)] = before + slices
                guaranteed = self.quota(holding.tenant, key).guaranteed
                beyond[key] = min(slices, max(0, before + slices - guaranteed))
            found[holding.pool] = beyond
        return found

    def borrowed_pools(self, holdings: Iterable[Holding]) -> set[Hashable]:
        """The pools of `holdings` that hold borrowed slices (`borrowed`), counted over all of them."""
        return {pool for pool, beyond in self.borrowed(holdings).items() if any(beyond.values())}

    def take(self, tenant: Hashable, project: Hashable, slices: Mapping[Key, int]) -> None:
        self.held[tenant].update(slices)
        self.project_held[project].update(slices)

    def give(self, tenant: Hashable, project: Hashable, slices: Mapping[Key, int]) -> None:
        self.held[tenant].subtract(slices)
        self.project_held[project].subtract(slices)


@dataclass(frozen=True)
class Holding:
    """A live pool as the policy sees it: whose, when admitted (orders within and borrowed), what it holds;
    `reclaimable` where it is in use and not under notice already."""

    pool: Hashable
    tenant: Hashable
    project: Hashable
    priority: int
    admitted: tuple
    slices: Mapping[Key, int]
    reclaimable: bool = True


@dataclass(frozen=True)
class Claim:
    """What a request may take: GPU models of its items, at its places, with its priority."""

    priority: int
    places: frozenset[Place]
    wanted: frozenset[tuple[str, str]]  # (GPU model, profile) of its items

    @classmethod
    def of(cls, items: Iterable[Item], places: Iterable[Place], priority: int = 0) -> Claim:
        return cls(priority, frozenset(places), wanted_pairs(items))

    @property
    def models(self) -> frozenset[str]:
        return frozenset(model for model, _profile in self.wanted)

    def holds_back(self, other: Claim) -> bool:
        """Whether, this claim starving, admitting `other` could take capacity it waits for."""
        if other.priority > self.priority or not self.models & other.models:
            return False
        return any(_overlap(mine, theirs) for mine in self.places for theirs in other.places)


def _overlap(one: Place, other: Place) -> bool:
    return all(a is None or b is None or a == b for a, b in zip(one, other, strict=True))


@dataclass(frozen=True)
class Waiting:
    """A request waiting in the queue, as the policy sees it. `arrival` orders equal priorities and shares
    (the queue's approval time and id, the simulator's position); `waited` is how long it has waited, in
    seconds; `asked` its slices per quota key."""

    id: Hashable
    tenant: Hashable
    project: Hashable
    priority: int
    arrival: tuple
    waited: float
    items: tuple[Item, ...]
    claim: Claim
    asked: Mapping[Key, int]
    # Pools under notice for it (it waits for them), and whether pools reclaimed for it were released: the
    # capacity they freed is held for it, so it goes first.
    reclaiming: tuple[Hashable, ...] = ()
    reclaimed: bool = False


@dataclass(frozen=True)
class Admitted:
    request: Waiting
    placement: Placement
    verdict: QuotaVerdict


@dataclass(frozen=True)
class Waits:
    request: Waiting
    reason: str  # a Reason where the room gave one


@dataclass(frozen=True)
class Reclaims(Waits):
    """It waits, and these borrowed pools are to be reclaimed for it: released once their notice ends."""

    victims: tuple[Holding, ...] = ()


class Room(Protocol):
    """Where requests are placed: the queue's clusters, or the simulator's fleet."""

    def place(self, request: Waiting, upcoming: Sequence[Waiting], *, reclaimable: bool) -> Placement:
        """Where the request goes now (unplaced, with its reason, where it does not fit); `reclaimable`:
        its pool would be borrowed, so kept apart from work within guarantees (pools/placement/plan.py)."""

    def room_out_of_the_way(self, request: Waiting) -> bool:
        """Whether free instances of GPUs that hold work are there for all its items."""

    def out_of_the_way(self, placement: Placement, wanted: frozenset[tuple[str, str]]) -> bool:
        """Whether a placement keeps out of the way of starving requests that want `wanted`."""

    def admit(self, request: Waiting, placement: Placement) -> None:
        """Take what the placement assigns, so that the rest of the run sees it taken."""

    def fits_without(self, request: Waiting, victims: Sequence[Holding]) -> bool:
        """Whether the request would be placed were these pools released."""

    def hold(self, request: Waiting, pools: Sequence[Hashable]) -> None:
        """For the rest of the run, keep for the request what it would be placed on were these pools (under
        notice for it) released: nothing else is placed there, so that their release lets it in."""


def queue_order(waiting: Iterable[Waiting], ledger: Ledger) -> list[Waiting]:
    """Requests whose reclaimed pools were released first (the capacity is theirs); then priority; then,
    among equal priorities, the tenant with the lowest share; then arrival."""
    shares: dict[Hashable, float] = {}

    def key(request: Waiting) -> tuple:
        if request.tenant not in shares:
            shares[request.tenant] = ledger.share(request.tenant)
        return (not request.reclaimed, -request.priority, shares[request.tenant], request.arrival)

    return sorted(waiting, key=key)


def reclaim_candidates(request: Waiting, holdings: Iterable[Holding], ledger: Ledger) -> list[Holding]:
    """Pools that could be reclaimed for a request: of other tenants, holding borrowed slices of a GPU model
    the request asks for (in its group, or any where it names none), in the order victims are taken:
    lowest priority first, then the most recently admitted."""
    models = {model for _group, model in request.asked}
    groups = {group for group, _model in request.asked}
    everything = list(holdings)
    borrowed = ledger.borrowed(everything)
    found = [
        holding
        for holding in everything
        if holding.reclaimable
        and holding.tenant != request.tenant
        and any(
            slices and model in models and (group in groups or "" in groups)
            for (group, model), slices in borrowed.get(holding.pool, {}).items()
        )
    ]
    newest_first = sorted(found, key=lambda h: h.admitted, reverse=True)
    return sorted(
        newest_first, key=lambda h: h.priority
    )  # a stable sort keeps the newest first in a priority


def choose_victims(
    candidates: Sequence[Holding], fits: Callable[[Sequence[Holding]], bool]
) -> tuple[Holding, ...] | None:
    """The fewest of `candidates` (in their order) whose release lets the request fit: taken in order until
    it fits, then each taken one left out again, latest first, where it fits without it. None where it
    would not fit even with every candidate released."""
    chosen: list[Holding] = []
    for candidate in candidates:
        chosen.append(candidate)
        if fits(chosen):
            break
    else:
        return None
    for victim in reversed(list(chosen)):
        rest = [holding for holding in chosen if holding is not victim]
        if rest and fits(rest):
            chosen = rest
    return tuple(chosen)


def run_queue(
    waiting: Iterable[Waiting],
    ledger: Ledger,
    room: Room,
    *,
    grace_seconds: float | None,
    window: int,
    holdings: Sequence[Holding] = (),
    owner: Callable[[Waiting, bool], str] = lambda request, of_project: str(
        request.project if of_project else request.tenant
    ),
) -> list[Admitted | Waits]:
    """One queue run: each waiting request in queue order, placed whole or not at all; a request that fits
    is admitted at once, even behind one that does not (backfill), except where an older one starves.
    `window` is how many of the requests behind one the room is shown as upcoming. After each admission the
    order of the rest is taken again, since the admitted tenant's share has grown.

    A request within its tenant's guarantee that does not fit, and is not held back, reclaims: the fewest
    borrowed pools of `holdings` (the live pools) whose release lets it fit are chosen for it, once
    (`Reclaims`); a pool chosen in this run is not chosen again for another. One already waiting for its
    pools waits on. One that would not fit even with every borrowed pool released says so. What such a
    request would be placed on once its pools are released (or were) is held for it in the room
    (pools/placement/holds.py), in queue order, so that nobody else takes it during the notice. A request
    that would borrow is placed as reclaimable work, which work within guarantees keeps off (plan.py).
    `owner(request, project)` names the request's tenant (or project) in a limit's reason."""
    rest = deque(queue_order(waiting, ledger))
    for request in rest:  # in queue order: the capacity freed for a request is its own before the next's
        if request.reclaiming or request.reclaimed:
            room.hold(request, request.reclaiming)
    starving: list[tuple[Claim, bool]] = []  # each with whether it is within its tenant's guarantee
    decisions: list[Admitted | Waits] = []
    taken: set[Hashable] = set()
    ahead: dict[Hashable, Counter] = defaultdict(Counter)  # per tenant, what its requests so far wait for
    while rest:
        request = rest.popleft()
        verdict = ledger.verdict(request.tenant, request.project, request.asked, ahead[request.tenant])
        if verdict.kind == BEYOND_LIMIT:
            decisions.append(Waits(request, verdict.reason(owner(request, verdict.project))))
            continue
        within = verdict.kind == WITHIN and ledger.guarantees
        blockers = [
            claim
            for claim, guaranteed in starving
            if claim.holds_back(request.claim) and guaranteed >= within
        ]
        wanted = frozenset().union(*(claim.wanted for claim in blockers))
        if blockers and not (
            may_keep_out_of_the_way(request.claim.wanted, wanted) and room.room_out_of_the_way(request)
        ):
            decisions.append(Waits(request, Reason(BEHIND_OLDER)))
            ahead[request.tenant].update(request.asked)
            continue
        upcoming = list(islice(rest, window))
        found = room.place(request, upcoming, reclaimable=verdict.kind == BORROWED and ledger.guarantees)
        if found.placed and (not blockers or room.out_of_the_way(found, wanted)):
            room.admit(request, found)
            ledger.take(request.tenant, request.project, request.asked)
            decisions.append(Admitted(request, found, verdict))
            if ledger.guarantees:
                rest = deque(queue_order(rest, ledger))
            continue
        ahead[request.tenant].update(request.asked)
        if blockers:
            decisions.append(Waits(request, Reason(BEHIND_OLDER)))
            continue
        if within:
            decisions.append(_reclaim(request, found.reason, ledger, room, holdings, taken))
        else:
            decisions.append(Waits(request, found.reason))
        if grace_seconds is not None and request.waited >= grace_seconds:
            starving.append((request.claim, within))
    return decisions


def _reclaim(
    request: Waiting, reason: str, ledger: Ledger, room: Room, holdings: Sequence[Holding], taken: set
) -> Waits:
    if request.reclaiming:
        return Waits(request, Reason(UNDER_NOTICE, count=len(request.reclaiming)))
    candidates = [h for h in reclaim_candidates(request, holdings, ledger) if h.pool not in taken]
    victims = choose_victims(candidates, lambda chosen: room.fits_without(request, chosen))
    if not victims:
        return Waits(request, Reason(NOT_EVEN_RECLAIMED, reason=reason))
    taken.update(victim.pool for victim in victims)
    room.hold(request, [victim.pool for victim in victims])
    return Reclaims(request, Reason(UNDER_NOTICE, count=len(victims)), victims)
