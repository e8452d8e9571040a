"""Which MIG layout a wholly free GPU gets: every maximal layout of a model, scored against expected demand.

Words used here (the geometry itself is pools/mig.py's):
- counts: a multiset of profiles as a tuple of instance counts, one per profile in catalogue order.
- maximal layout: counts that fit on one GPU and to which no further instance can be added. A new layout is
  always maximal, because space left uncarved on a GPU that holds a tenant stays unusable until that GPU is
  wholly free again (adding an instance is a layout change).
- request part, filler: the instances of a new layout that the request takes, and the rest, left free for
  later requests.
- queue demand: instances the waiting queue will ask for and no free instance covers yet (exact counts).
- recent demand: per profile, how many instances one GPU would hold if it were cut in the proportions of
  recent requests (a prior for when the queue says little), and how much that guess is worth per compute
  slice: `Recent`.

Pure: functions of their arguments, cached because the space is small (44 maximal layouts per model).
"""

from collections.abc import Mapping
from dataclasses import dataclass
from functools import cache, lru_cache

from pools.mig import COMPUTE_SLICES, MAX_INSTANCES, MEMORY_SLICES, gpu_model, place_profiles

Counts = tuple[int, ...]
Layout = tuple[tuple[str, int], ...]  # (profile, start), sorted by start
Recent = tuple[tuple[float, ...], int]  # instances per profile of one GPU cut like recent demand; weight

# Score units per compute slice of filler. Integers, so that equal layouts tie exactly and the tie-breaks
# below decide. Queue demand is nearly certain to be used; recent demand is a guess; any other instance may
# still be wanted some day, which beats stranding the slice. A "+me" instance serves only media work.
QUEUE_WEIGHT = 1000
RECENT_WEIGHT = 500  # recent demand as the caller measured it
GENERIC_WEIGHT = 100
# One request is thin evidence: enough to choose among layouts that use the same compute slices, never
# enough to strand a slice for (it stays below GENERIC_WEIGHT).
SINGLE_REQUEST_WEIGHT = 50
MEDIA_GENERIC_WEIGHT = 50
# A filler of several kinds serves more kinds of requests: a nudge, worth less than any compute slice.
MIXED_BONUS = 10


@dataclass(frozen=True)
class LayoutCatalogue:
    model: str
    names: tuple[str, ...]  # profiles in catalogue order: the positions of every `Counts`
    compute: tuple[int, ...]
    memory: tuple[int, ...]
    media: tuple[bool, ...]
    layouts: tuple[Counts, ...]  # the maximal layouts
    sparse: tuple[tuple[tuple[int, int], ...], ...]  # the same, as (position, count) where count > 0
    most: tuple[int, ...]  # the most instances of each profile one GPU holds

    def counts(self, wanted: Mapping[str, int]) -> Counts:
        return tuple(wanted.get(name, 0) for name in self.names)

    def compute_of(self, counts: Counts) -> int:
        return sum(c * n for c, n in zip(self.compute, counts, strict=True))


@cache
def catalogue(model_name: str) -> LayoutCatalogue:
    """The maximal layouts of a model, found once by asking pools/mig.py about every bounded multiset."""
    model = gpu_model(model_name)
    profiles = list(model.profiles.values())
    feasible: list[Counts] = []

    def extend(position: int, counts: list[int], compute: int, memory: int, instances: int) -> None:
        if position == len(profiles):
            wanted = {p.name: n for p, n in zip(profiles, counts, strict=True) if n}
            if wanted and place_profiles(model, wanted) is not None:
                feasible.append(tuple(counts))
            return
        profile = profiles[position]
        for count in range(profile.max_count + 1):
            if (
                compute + count * profile.compute_slices > COMPUTE_SLICES
                or memory + count * profile.memory_slices > MEMORY_SLICES
                or instances + count > MAX_INSTANCES
            ):
                break
            extend(
                position + 1,
                [*counts, count],
                compute + count * profile.compute_slices,
                memory + count * profile.memory_slices,
                instances + count,
            )

    extend(0, [], 0, 0, 0)
    known = set(feasible)
    units = [tuple(int(i == j) for j in range(len(profiles))) for i in range(len(profiles))]
    maximal = tuple(
        counts
        for counts in feasible
        if not any(tuple(a + b for a, b in zip(counts, unit, strict=True)) in known for unit in units)
    )
    return LayoutCatalogue(
        model=model_name,
        names=tuple(p.name for p in profiles),
        compute=tuple(p.compute_slices for p in profiles),
        memory=tuple(p.memory_slices for p in profiles),
        media=tuple(p.media_extension for p in profiles),
        layouts=maximal,
        sparse=tuple(tuple((i, n) for i, n in enumerate(counts) if n) for counts in maximal),
        most=tuple(max(counts[i] for counts in feasible) for i in range(len(profiles))),
    )


@lru_cache(maxsize=4096)
def layout_instances(model_name: str, counts: Counts) -> Layout:
    """Starts for a layout, as the MIG manager would create it (pools/mig.py's `place_profiles`)."""
    names = catalogue(model_name).names
    placed = place_profiles(
        gpu_model(model_name), {name: n for name, n in zip(names, counts, strict=True) if n}
    )
    if placed is None:
        raise ValueError(f"{counts} is not a layout of {model_name}.")
    return tuple((instance.profile, instance.start) for instance in placed)


def recent_demand(
    model_name: str, demand: Mapping[tuple[str, str], float] | None, weight: int = RECENT_WEIGHT
) -> Recent:
    """Recent demand as the instance counts of one GPU cut in its proportions (by compute), to one decimal."""
    return _shares(model_name, demand), weight


def evidence_weight(requests_seen: int) -> int:
    """What recent demand counted from `requests_seen` requests is worth: SINGLE_REQUEST_WEIGHT for one,
    nearing RECENT_WEIGHT as they add up (half of it at nine)."""
    return round(RECENT_WEIGHT * requests_seen / (requests_seen + 9))


def _shares(model_name: str, demand: Mapping[tuple[str, str], float] | None) -> tuple[float, ...]:
    cat = catalogue(model_name)
    if not demand:
        return (0.0,) * len(cat.names)
    pairs = zip(cat.names, cat.compute, strict=True)
    weights = [max(0.0, float(demand.get((model_name, name), 0.0))) * c for name, c in pairs]
    total = sum(weights)
    if total <= 0:
        return (0.0,) * len(cat.names)
    return tuple(round(w / total * COMPUTE_SLICES / c, 1) for w, c in zip(weights, cat.compute, strict=True))


def filler_score(cat: LayoutCatalogue, filler: Counts, queue: Counts, recent: Recent) -> int:
    """How much of the filler later requests will use: queue demand first, then recent demand, then any."""
    score = 0
    kinds = 0
    shares, weight = recent
    for n, c, media, q, r in zip(filler, cat.compute, cat.media, queue, shares, strict=True):
        if not n:
            continue
        kinds += 1
        queued = min(n, q)
        guessed = min(n - queued, r)
        generic = MEDIA_GENERIC_WEIGHT if media else GENERIC_WEIGHT
        score += c * (QUEUE_WEIGHT * queued + generic * n) + round(c * weight * guessed)
    return score + MIXED_BONUS * kinds


def best_filler_score(model_name: str, part: Counts, queue: Counts, recent: Recent) -> int | None:
    """The best filler score of a new layout holding `part`; None when no GPU holds it."""
    best = _best_layout(model_name, part, queue, recent)
    return None if best is None else best[1]


@lru_cache(maxsize=16384)
def _best_layout(model_name: str, part: Counts, queue: Counts, recent: Recent) -> tuple[Counts, int] | None:
    cat = catalogue(model_name)
    best: tuple[int, int, Counts] | None = None
    for layout in cat.layouts:
        if any(n < p for n, p in zip(layout, part, strict=True)):
            continue
        filler = tuple(n - p for n, p in zip(layout, part, strict=True))
        # Among equal scores, fewer and so larger free instances: a large one needs aligned empty memory
        # slices, which fragment away, while small ones are cut from any GPU re-partitioned later.
        key = (filler_score(cat, filler, queue, recent), -sum(filler), layout)
        if best is None or key[:2] > best[:2]:
            best = key
    return None if best is None else (best[2], best[0])


# Sub-needs the search for the fewest GPUs may expand (about 100 µs each) before the greedy packing has
# to do: a few milliseconds at worst, for the rare request whose greedy packing misses the lower bound.
SEARCH_BUDGET = 40


@lru_cache(maxsize=8192)
def plan_layouts(
    model_name: str, need: Counts, queue: Counts, recent: Recent
) -> tuple[tuple[Counts, Counts], ...]:
    """New layouts for the instances in `need`, one (layout, request part) per GPU, on as few GPUs as any
    packing needs.

    GPU by GPU, the layout whose request part has the most compute slices, then whose filler scores best.
    That greedy packing mostly meets a lower bound and so is optimal; when it does not (a per-GPU cap such
    as one "+me" binds), only layouts that keep the fewest GPUs reachable are considered.
    """
    plans = _pack(model_name, need, queue, recent)
    if len(plans) > _lower_bound(catalogue(model_name), need):
        steps = [SEARCH_BUDGET]
        try:
            fewest = _fewest(model_name, need, steps)
            if fewest < len(plans):
                plans = _pack(model_name, need, queue, recent, fewest=fewest, steps=steps)
        except _OverBudget:
            pass  # the greedy packing has to do
    return plans


def _pack(
    model_name: str,
    need: Counts,
    queue: Counts,
    recent: Recent,
    *,
    fewest: int | None = None,
    steps: list[int] | None = None,
) -> tuple[tuple[Counts, Counts], ...]:
    """GPU by GPU as `plan_layouts` says; with `fewest`, only layouts that leave a packing in that many."""
    cat = catalogue(model_name)
    remaining = need
    waiting = list(queue)
    plans: list[tuple[Counts, Counts]] = []
    while any(remaining):
        left = None if fewest is None else fewest - len(plans) - 1
        best: tuple[int, int, int, Counts, Counts] | None = None
        for layout in cat.layouts:
            part = tuple(min(n, r) for n, r in zip(layout, remaining, strict=True))
            covered = cat.compute_of(part)
            if not covered:
                continue
            if left is not None and not _fits(model_name, _minus(remaining, part), left, steps or [0]):
                continue
            filler = _minus(layout, part)
            key = (covered, filler_score(cat, filler, tuple(waiting), recent), -sum(filler), layout, part)
            if best is None or key[:3] > best[:3]:
                best = key
        if best is None:  # only when `fewest` is given; a search said it was reachable
            raise _OverBudget
        layout, part = best[3], best[4]
        plans.append((layout, part))
        remaining = _minus(remaining, part)
        waiting = [max(0, w - f) for w, f in zip(waiting, _minus(layout, part), strict=True)]
    return tuple(plans)


def _fewest(model_name: str, need: Counts, steps: list[int]) -> int:
    """The fewest empty GPUs that hold all of `need`: the lower bound, raised until a packing exists."""
    count = _lower_bound(catalogue(model_name), need)
    while not _fits(model_name, need, count, steps):
        count += 1
    return count


class _OverBudget(Exception):
    """The search for the fewest GPUs took more steps than SEARCH_BUDGET."""


# Answers of `_fits`, kept across calls: the same sub-needs recur from request to request.
_FITS: dict[tuple[str, Counts, int], bool] = {}
_FITS_KEPT = 200_000


def _fits(model_name: str, need: Counts, gpus: int, steps: list[int]) -> bool:
    """Whether `gpus` empty GPUs hold all of `need`; any branch that its lower bound rules out is cut."""
    if not any(need):
        return True
    key = (model_name, need, gpus)
    known = _FITS.get(key)
    if known is not None:
        return known
    cat = catalogue(model_name)
    if _lower_bound(cat, need) > gpus:
        return False
    steps[0] -= 1
    if steps[0] < 0:
        raise _OverBudget
    parts = set()
    for layout in cat.sparse:
        part = [0] * len(need)
        for position, count in layout:
            part[position] = min(count, need[position])
        parts.add(tuple(part))
    found = any(_fits(model_name, _minus(need, part), gpus - 1, steps) for part in parts if any(part))
    if len(_FITS) >= _FITS_KEPT:
        _FITS.clear()
    _FITS[key] = found
    return found


def _lower_bound(cat: LayoutCatalogue, need: Counts) -> int:
    """GPUs needed at the least: one per instance that fills a GPU alone (7g), plus what the rest needs by
    compute slices, memory slices, instance count and each profile's cap."""
    alone = sum(n for n, m in zip(need, cat.memory, strict=True) if m == MEMORY_SLICES)
    rest = tuple(0 if m == MEMORY_SLICES else n for n, m in zip(need, cat.memory, strict=True))
    memory = sum(m * n for m, n in zip(cat.memory, rest, strict=True))
    return alone + max(
        -(-cat.compute_of(rest) // COMPUTE_SLICES),
        -(-memory // MEMORY_SLICES),
        -(-sum(rest) // MAX_INSTANCES),
        *(-(-n // most) for n, most in zip(rest, cat.most, strict=True)),
    )


def _minus(a: Counts, b: Counts) -> Counts:
    return tuple(x - y for x, y in zip(a, b, strict=True))
