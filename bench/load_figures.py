"""bench/load.py's figures: each request a simulated user made, summed up per page (requests, errors,
requests per second, p50 and p95), printed as a table, and the verdict on the target. Pure: no Django,
no network."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

TARGET_P95_MS = 200.0


@dataclass(frozen=True)
class Sample:
    """One request a simulated user made: the page's name, how long it took, whether it went as expected."""

    page: str
    seconds: float
    ok: bool


@dataclass(frozen=True)
class Row:
    page: str
    requests: int
    errors: int
    per_second: float
    p50_ms: float
    p95_ms: float


def percentile(values: Sequence[float], q: float) -> float:
    """The q-th percentile (0..100) of `values`, interpolated linearly between the closest ranks."""
    if not values:
        raise ValueError("no values")
    if not 0 <= q <= 100:
        raise ValueError("q must be within 0..100")
    ordered = sorted(values)
    rank = (len(ordered) - 1) * q / 100
    low = int(rank)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (rank - low)


def summarise(samples: Iterable[Sample], seconds: float) -> list[Row]:
    """One row per page (in the order pages were first met), then the total over every page."""
    if seconds <= 0:
        raise ValueError("seconds must be positive")
    by_page: dict[str, list[Sample]] = {}
    for sample in samples:
        by_page.setdefault(sample.page, []).append(sample)
    everything = [s for page in by_page.values() for s in page]
    rows = [_row(page, found, seconds) for page, found in by_page.items()]
    if everything:
        rows.append(_row("total", everything, seconds))
    return rows


def _row(page: str, samples: list[Sample], seconds: float) -> Row:
    times = [s.seconds * 1000 for s in samples]
    return Row(
        page=page,
        requests=len(samples),
        errors=sum(not s.ok for s in samples),
        per_second=len(samples) / seconds,
        p50_ms=percentile(times, 50),
        p95_ms=percentile(times, 95),
    )


def misses(rows: Sequence[Row], target_ms: float = TARGET_P95_MS) -> list[str]:
    """Why the target does not hold (empty when it does): errors anywhere, a page's p95 over target."""
    if not rows:
        return ["no requests were made"]
    found = []
    for row in rows:
        if row.page == "total":
            continue
        if row.errors:
            found.append(f"{row.page}: {row.errors} errors")
        if row.p95_ms >= target_ms:
            found.append(f"{row.page}: p95 {row.p95_ms:.0f} ms")
    return found


def table(rows: Sequence[Row]) -> str:
    width = max([len("page"), *(len(r.page) for r in rows)])
    lines = [f"{'page':<{width}}  {'requests':>8}  {'errors':>6}  {'req/s':>7}  {'p50 ms':>7}  {'p95 ms':>7}"]
    for r in rows:
        lines.append(
            f"{r.page:<{width}}  {r.requests:>8}  {r.errors:>6}  {r.per_second:>7.2f}  "
            f"{r.p50_ms:>7.1f}  {r.p95_ms:>7.1f}"
        )
    return "\n".join(lines)
