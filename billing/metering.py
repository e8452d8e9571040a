"""Metering arithmetic: which periods have ended, and how many seconds of each spec a pool held in one.

Time is cut into fixed periods of `period` seconds counted from the Unix epoch (UTC), so a period
starts at a multiple of `period`. Each allocation of a pool is held from the moment it was reserved
until it was released (or its pool failed), or until its pool's end date where that comes first; both
moments count in whole seconds (fractions dropped), so the seconds metered over all periods add up to
exactly `until - reserved` per instance held.

Plain data in and out: no Django, no clock, no database.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace
from datetime import UTC, datetime


@dataclass(frozen=True)
class Holding:
    """`count` instances of one spec held by a pool from `reserved` to `released` (None: still held), or to
    `ends` (the pool's end date) where that comes first."""

    pool_id: int
    gpu_model: str
    profile: str
    count: int
    reserved: int  # whole seconds since the epoch
    released: int | None
    ends: int | None = None

    @property
    def until(self) -> int | None:
        """The second billing stops; None while it runs on."""
        if self.ends is None or self.released is None:
            return self.released if self.ends is None else self.ends
        return min(self.released, self.ends)


@dataclass(frozen=True)
class Usage:
    """What a holding used in one period: `seconds` is instance-seconds (count × seconds held)."""

    pool_id: int
    gpu_model: str
    profile: str
    period_start: int
    count: int
    seconds: int


def whole_seconds(moment: datetime) -> int:
    """Seconds since the epoch, fractions dropped; `moment` must carry its time zone."""
    if moment.tzinfo is None:
        raise ValueError("metering needs aware datetimes")
    return int(moment.timestamp() // 1)


def moment(seconds: int) -> datetime:
    return datetime.fromtimestamp(seconds, UTC)


def period_start(seconds: int, period: int) -> int:
    """The start of the period that holds this second."""
    return seconds - seconds % period


def ended_periods(first: int, now: int, period: int, delay: int = 0) -> range:
    """Starts of the periods from `first` (a period start) whose end lies at least `delay` seconds
    before `now`: those a run may meter, since nothing that happened in them can still change."""
    if first % period:
        raise ValueError(f"{first} is not the start of a {period}-second period")
    last_end = period_start(now - delay, period)
    return range(first, max(first, last_end), period)


def held(holding: Holding, start: int, period: int) -> int:
    """Seconds of [start, start + period) in which the holding was held."""
    end = start + period
    until = end if holding.until is None else min(holding.until, end)
    return max(0, until - max(holding.reserved, start))


def usage_in_period(holdings: Iterable[Holding], start: int, period: int) -> list[Usage]:
    """One usage per pool and spec that held anything in the period (`merged`)."""
    seconds = ((holding, held(holding, start, period)) for holding in holdings)
    return merged(_usage(holding, start, held_for) for holding, held_for in seconds if held_for)


def merged(usages: Iterable[Usage]) -> list[Usage]:
    """One usage per pool, spec and period: the holdings of a pool's instances of one spec reserved or
    released at different moments (a resize, a move) add up, their counts and their seconds."""
    found: dict[tuple, Usage] = {}
    for usage in usages:
        key = (usage.pool_id, usage.gpu_model, usage.profile, usage.period_start)
        before = found.get(key)
        found[key] = (
            usage
            if before is None
            else replace(before, count=before.count + usage.count, seconds=before.seconds + usage.seconds)
        )
    return list(found.values())


def _usage(holding: Holding, start: int, seconds: int) -> Usage:
    """The usage of a holding held `seconds` of the period that starts at `start`."""
    return Usage(
        holding.pool_id, holding.gpu_model, holding.profile, start, holding.count, holding.count * seconds
    )


def held_periods(holding: Holding, starts: range) -> range:
    """The starts among `starts` (period starts, `starts.step` apart) of the periods in which the holding
    held anything: from the period of its reservation to the one holding its release."""
    period = starts.step
    if holding.until is not None and holding.until <= holding.reserved:
        return range(starts.start, starts.start, period)
    first = max(starts.start, period_start(holding.reserved, period))
    stop = starts.stop if holding.until is None else min(starts.stop, holding.until)
    return range(first, max(first, stop), period)


def usage_in_periods(holdings: Iterable[Holding], starts: range) -> list[Usage]:
    """The usages of every period of `starts` (period starts, `starts.step` apart): what `usage_in_period`
    gives for each, found by walking each holding's own periods rather than every period's holdings."""
    period = starts.step
    found = []
    for holding in holdings:
        if not holding.count:  # held nothing, as `usage_in_period` finds
            continue
        found.extend(
            _usage(holding, start, held(holding, start, period)) for start in held_periods(holding, starts)
        )
    return merged(found)


def bounded(holdings: Sequence[Holding], starts: range, records: int) -> range:
    """The longest leading part of `starts` whose periods give at most `records` usages, and never less
    than its first period (which alone may give more): the periods one transaction may meter."""

    # Per pool and spec, the periods its holdings held, as runs of period numbers [first, last).
    runs: dict[tuple, list[tuple[int, int]]] = defaultdict(list)
    for holding in holdings:
        held_in = held_periods(holding, starts)
        if holding.count and held_in:
            first = (held_in.start - starts.start) // starts.step
            runs[(holding.pool_id, holding.gpu_model, holding.profile)].append((first, first + len(held_in)))

    def usages(periods: int) -> int:
        """The usages of the first `periods` periods: per pool and spec, each period any of its holdings
        held, counted once (`merged`)."""
        found = 0
        for spans in runs.values():
            reached = 0
            for first, last in sorted(spans):
                first, last = max(first, reached), min(last, periods)
                if last > first:
                    found += last - first
                    reached = last
        return found

    if len(starts) <= 1 or usages(len(starts)) <= records:
        return starts
    low, high = 1, len(starts) - 1
    while low < high:  # the longest part that fits: the count only grows with the part
        middle = (low + high + 1) // 2
        if usages(middle) <= records:
            low = middle
        else:
            high = middle - 1
    return starts[:low]


def billable_seconds(holding: Holding, until: int) -> int:
    """Instance-seconds the holding is billed for up to `until` (the sum of its usages up to there)."""
    end = until if holding.until is None else min(holding.until, until)
    return holding.count * max(0, end - holding.reserved)
