"""Samples in and out of storage: write a batch, keep day partitions ahead, prune, read a series; the roll-ups
live in monitoring.storage.rollups (`roll_up` is named here too, for the callers that know samples only).

Writes are idempotent: a (GPU, slot, instant) written twice is kept once, so an agent that resends a
batch it was not sure arrived changes nothing. Roll-ups are recomputed, not added to, for the same reason.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import UTC, date, datetime, timedelta

from django.db import connection, transaction
from psycopg.errors import UniqueViolation

from monitoring.conf import settings
from monitoring.models.samples import COUNTERS, METRICS
from monitoring.storage import rollups
from monitoring.storage.rollups import FIVE_MINUTES, ONE_HOUR
from monitoring.storage.rollups import roll_up as roll_up

# The columns of a sample row, in order.
COLUMNS = ("gpu_id", "slot", "at", *METRICS, "memory_total_bytes", *COUNTERS)
TYPES = (
    "bigint",
    "smallint",
    "timestamptz",
    "double precision",
    "double precision",
    "double precision",
    "double precision",
    "bigint",
    "bigint",
    "bigint",
    "bigint",
)
# Partitions are made this many days ahead, so that ingest seldom has to make one itself.
DAYS_AHEAD = 2
_PARTITIONS_LOCK = 0x6D6F6E5F70617274  # advisory lock key: "mon_part"


@dataclass(frozen=True)
class Row:
    """One sample as stored. Figures are in the units of monitoring.collectors.base."""

    gpu_id: int
    slot: int
    at: datetime
    power_w: float | None = None
    temperature_c: float | None = None
    utilisation_pct: float | None = None
    sm_active_pct: float | None = None
    memory_used_bytes: int | None = None
    memory_total_bytes: int | None = None
    ecc_corrected: int | None = None
    ecc_uncorrected: int | None = None

    def values(self) -> tuple:
        return tuple(getattr(self, column) for column in COLUMNS)


# --- partitions --------------------------------------------------------------------------------------


def partition_name(day: date) -> str:
    return f"monitoring_sample_p{day:%Y%m%d}"


_known_partitions: set[date] = set()


def ensure_partitions(days: Iterable[date]) -> None:
    """Make the day partitions that do not exist yet. Safe against concurrent callers."""
    missing = sorted(set(days) - _known_partitions)
    if not missing:
        return
    with transaction.atomic(), connection.cursor() as cursor:
        cursor.execute("SELECT pg_advisory_xact_lock(%s)", [_PARTITIONS_LOCK])
        cursor.execute(
            "SELECT c.relname FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid "
            "WHERE i.inhparent = 'monitoring_sample'::regclass"
        )
        existing = {name for (name,) in cursor.fetchall()}
        made = [day for day in missing if partition_name(day) not in existing]
        for day in made:
            start = datetime(day.year, day.month, day.day, tzinfo=UTC)
            cursor.execute(
                f"CREATE TABLE {partition_name(day)} PARTITION OF monitoring_sample "
                "FOR VALUES FROM (%s) TO (%s)",
                [start, start + timedelta(days=1)],
            )
    _known_partitions.update(day for day in missing if day not in made)
    # The ones made here are known once they are there for good: the caller's transaction may be rolled back
    # (a batch refused after its samples were written), and a partition known but not there fails every write.
    transaction.on_commit(lambda: _known_partitions.update(made))


def partitions() -> list[date]:
    """The days that have a partition, oldest first."""
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT c.relname FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid "
            "WHERE i.inhparent = 'monitoring_sample'::regclass"
        )
        names = [name for (name,) in cursor.fetchall()]
    return sorted(datetime.strptime(name[-8:], "%Y%m%d").date() for name in names)


def forget_partitions() -> None:
    """Forget which partitions this process has seen (after a test database is rebuilt, or a prune)."""
    _known_partitions.clear()


# --- writing -----------------------------------------------------------------------------------------


class StoredBefore(Exception):
    """A sample written as new is stored already: the batch was sent before (or one of its instances twice).
    Raised from inside the caller's transaction, which is then lost: write the batch again with new=False."""


def store(rows: Sequence[Row]) -> int:
    """Write samples, the ones stored already kept as they are; returns how many were new."""
    return store_values(
        [tuple(_typed(value, kind) for value, kind in zip(row.values(), TYPES, strict=True)) for row in rows]
    )


def store_values(values: Sequence[tuple], *, new: bool = False) -> int:
    """Write samples given as tuples in the order of COLUMNS, each value of its column's Python type (float,
    int, aware datetime, or None); returns how many were new. Late samples repair their roll-ups.

    With `new` (the caller knows of no sample stored at these GPUs', slots' and instants), each day's rows go
    into its partition by COPY; a row stored already raises StoredBefore. Without it, rows stored already are
    passed over. Runs in the caller's transaction when there is one, so a batch is stored whole or not at all.
    """
    if not values:
        return 0
    days: dict[datetime, date] = {}
    for row in values:
        if row[2] not in days:
            days[row[2]] = row[2].astimezone(UTC).date()
    ensure_partitions(set(days.values()))
    with transaction.atomic(savepoint=False), connection.cursor() as cursor:
        if new:
            written = _copy(cursor, values, days)
        else:
            columns = [[row[n] for row in values] for n in range(len(COLUMNS))]
            cursor.execute(_INSERT, columns)
            written = cursor.rowcount
        rollups.repair(cursor, (row[:3] for row in values), earliest=min(days))
    return written


# In PostgreSQL's binary format: the driver writes each figure and instant as it is in memory, in about a
# quarter of the time it takes to write them as text, and the server has no text to parse back.
_COPY = f"COPY {{table}} ({', '.join(COLUMNS)}) FROM STDIN (FORMAT BINARY)"
_INSERT = (
    f"INSERT INTO monitoring_sample ({', '.join(COLUMNS)}) SELECT * FROM "
    f"unnest({', '.join(f'%s::{kind}[]' for kind in TYPES)}) ON CONFLICT DO NOTHING"
)


def _copy(cursor, values: Sequence[tuple], days: dict[datetime, date]) -> int:
    by_day: dict[date, list[tuple]] = {}
    for row in values:
        by_day.setdefault(days[row[2]], []).append(row)
    try:
        for day, rows in by_day.items():
            with cursor.copy(_COPY.format(table=partition_name(day))) as copy:
                copy.set_types(TYPES)
                for row in rows:
                    copy.write_row(row)
    except UniqueViolation as error:
        raise StoredBefore(str(error)) from error
    return len(values)


def _typed(value, kind: str):
    """A value as its column's Python type, so that each column is sent as one type."""
    if value is None:
        return None
    if kind == "double precision":
        return float(value)
    if kind in ("bigint", "smallint"):
        return int(value)
    return value


# --- pruning -----------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Pruned:
    partitions: tuple[str, ...]
    rollups: int


def prune(*, now: datetime | None = None) -> Pruned:
    """Drop raw-sample days past MONITORING_RAW_DAYS and roll-ups past their own retention."""
    now = now or datetime.now(UTC)
    keep_from = (now - timedelta(days=settings.MONITORING_RAW_DAYS)).date()
    dropped = []
    with transaction.atomic(), connection.cursor() as cursor:
        cursor.execute("SELECT pg_advisory_xact_lock(%s)", [_PARTITIONS_LOCK])
        for day in partitions():
            if day < keep_from:
                cursor.execute(f"DROP TABLE {partition_name(day)}")
                dropped.append(partition_name(day))
                _known_partitions.discard(day)
        removed = 0
        for seconds, days in (
            (FIVE_MINUTES, settings.MONITORING_5M_DAYS),
            (ONE_HOUR, settings.MONITORING_1H_DAYS),
        ):
            cursor.execute(
                "DELETE FROM monitoring_rollup WHERE seconds = %s AND bucket < %s",
                [seconds, now - timedelta(days=days)],
            )
            removed += cursor.rowcount
        events_from = now - timedelta(days=settings.MONITORING_1H_DAYS)
        cursor.execute("DELETE FROM monitoring_gpuevent WHERE at < %s", [events_from])
    return Pruned(tuple(dropped), removed)


def prepare_partitions(*, now: datetime | None = None) -> None:
    """Today's partition and the next DAYS_AHEAD days'."""
    today = (now or datetime.now(UTC)).date()
    ensure_partitions(today + timedelta(days=n) for n in range(DAYS_AHEAD + 1))


# --- reading -----------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Point:
    """One point of a chart: the bucket's start and its min / avg / max (equal for a raw sample)."""

    at: datetime
    low: float | None
    value: float | None
    high: float | None


def resolution_for(span: timedelta, *, now: datetime, start: datetime) -> int:
    """The coarsest detail a chart of `span` needs (about 300 points at most), within what is still kept:
    0 for raw samples, else the roll-up's seconds."""
    raw_kept = now - timedelta(days=settings.MONITORING_RAW_DAYS)
    if span <= timedelta(hours=6) and start >= raw_kept:
        return 0
    if span <= timedelta(days=2) and start >= now - timedelta(days=settings.MONITORING_5M_DAYS):
        return FIVE_MINUTES
    return ONE_HOUR


@dataclass(frozen=True)
class Window:
    """A (GPU, slot) and the time [since, until) it counts in a series: an allocation while it was held, so
    that a pool's chart shows no figure of the instance from before or after its pool held it. A roll-up
    bucket counts when its middle falls inside."""

    gpu_id: int
    slot: int
    since: datetime
    until: datetime | None = None  # still held


# Raw samples are put in steps of at least this many seconds, so that GPUs read at different instants
# add up (memory) or average (the rest) in the same point.
RAW_STEP_SECONDS = 60
RAW_POINTS = 360


def series(
    *,
    metric: str,
    start: datetime,
    end: datetime,
    gpu_ids: Sequence[int] | None = None,
    slots: Sequence[tuple[int, int]] | None = None,
    windows: Sequence[Window] | None = None,
    now: datetime | None = None,
) -> tuple[int, list[Point]]:
    """A metric over [start, end): of one GPU or several (`gpu_ids`, whole-GPU figures), of given
    (gpu, slot) pairs (`slots`), of (gpu, slot) pairs each within its own time (`windows`: a pool's
    allocations), or of the whole fleet (none of these). Each GPU or instance is first reduced to one figure
    per point (raw samples in steps of RAW_STEP_SECONDS or more); then several are averaged per point
    (low: the lowest, high: the highest), except memory, which adds up. Returns the resolution used
    (0: raw samples) and the points."""
    if metric not in METRICS:
        raise ValueError(f"unknown metric {metric!r}")
    now = now or datetime.now(UTC)
    seconds = resolution_for(end - start, now=now, start=start)
    combine = "sum" if metric == "memory_used_bytes" else "avg"
    low, high = ("sum", "sum") if combine == "sum" else ("min", "max")
    moment = "s.at" if seconds == 0 else f"s.bucket + interval '{seconds // 2} seconds'"
    where, params = [], []
    if windows is not None:
        if not windows:
            return seconds, []
        where.append(
            "(s.gpu_id, s.slot) IN (SELECT * FROM unnest(%s::bigint[], %s::smallint[])) AND EXISTS ("
            "SELECT 1 FROM unnest(%s::bigint[], %s::smallint[], %s::timestamptz[], %s::timestamptz[]) "
            "AS w(w_gpu, w_slot, w_since, w_until) WHERE w_gpu = s.gpu_id AND w_slot = s.slot "
            f"AND {moment} >= w_since AND {moment} < COALESCE(w_until, 'infinity'))"
        )
        pairs = [(w.gpu_id, w.slot) for w in windows]
        params += [[g for g, _ in pairs], [s for _, s in pairs]]
        params += [[w.gpu_id for w in windows], [w.slot for w in windows]]
        params += [[w.since for w in windows], [w.until for w in windows]]
    elif slots is not None:
        if not slots:
            return seconds, []
        where.append("(s.gpu_id, s.slot) IN (SELECT * FROM unnest(%s::bigint[], %s::smallint[]))")
        params += [[g for g, _ in slots], [s for _, s in slots]]
    else:
        where.append("s.slot = -1")
        if gpu_ids is not None:
            where.append("s.gpu_id = ANY(%s::bigint[])")
            params.append(list(gpu_ids))
    if seconds == 0:
        step = max(RAW_STEP_SECONDS, -(-int((end - start).total_seconds()) // RAW_POINTS))
        per_slot = (
            f"SELECT s.gpu_id, s.slot, to_timestamp(floor(extract(epoch FROM s.at) / {step}) * {step}) AS t, "
            f"min(s.{metric}) AS lo, avg(s.{metric}) AS v, max(s.{metric}) AS hi FROM monitoring_sample s "
            f"WHERE s.at >= %s AND s.at < %s AND {' AND '.join(where)} GROUP BY 1, 2, 3"
        )
    else:
        per_slot = (
            f"SELECT s.gpu_id, s.slot, s.bucket AS t, s.{metric}_min AS lo, s.{metric}_avg AS v, "
            f"s.{metric}_max AS hi FROM monitoring_rollup s WHERE s.seconds = {seconds} "
            f"AND s.bucket >= %s AND s.bucket < %s AND {' AND '.join(where)}"
        )
    sql = (
        f"SELECT t, {low}(lo)::float8, {combine}(v)::float8, {high}(hi)::float8 "
        f"FROM ({per_slot}) AS per_slot GROUP BY t ORDER BY t"
    )
    with connection.cursor() as cursor:
        cursor.execute(sql, [start, end, *params])
        return seconds, [Point(at, low, value, high) for at, low, value, high in cursor.fetchall()]
