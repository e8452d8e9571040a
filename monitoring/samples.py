"""Samples in and out of storage: write a batch, keep day partitions ahead, roll up, prune, read a series.

Writes are idempotent: a (GPU, slot, instant) written twice is kept once, so an agent that resends a
batch it was not sure arrived changes nothing. Roll-ups are recomputed, not added to, for the same reason.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import UTC, date, datetime, timedelta

from django.conf import settings
from django.db import connection, transaction

from monitoring.models import RollupMark
from monitoring.models.samples import COUNTERS, METRICS

# The columns of a sample row, in order.
COLUMNS = ("gpu_id", "slot", "at", *METRICS, "memory_total_bytes", *COUNTERS)
_TYPES = (
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
FIVE_MINUTES = 300
ONE_HOUR = 3600
RESOLUTIONS = (FIVE_MINUTES, ONE_HOUR)
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
        for day in missing:
            if partition_name(day) not in existing:
                start = datetime(day.year, day.month, day.day, tzinfo=UTC)
                cursor.execute(
                    f"CREATE TABLE {partition_name(day)} PARTITION OF monitoring_sample "
                    "FOR VALUES FROM (%s) TO (%s)",
                    [start, start + timedelta(days=1)],
                )
    _known_partitions.update(missing)


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


def store(rows: Sequence[Row]) -> int:
    """Write samples and bring the newest figures up to date; returns how many samples were new.

    Runs in the caller's transaction when there is one, so a batch is stored whole or not at all.
    """
    if not rows:
        return 0
    ensure_partitions({row.at.astimezone(UTC).date() for row in rows})
    columns = list(zip(*(row.values() for row in rows), strict=True))
    unnest = ", ".join(f"%s::{kind}[]" for kind in _TYPES)
    names = ", ".join(COLUMNS)
    with transaction.atomic(), connection.cursor() as cursor:
        cursor.execute(
            f"INSERT INTO monitoring_sample ({names}) SELECT * FROM unnest({unnest}) ON CONFLICT DO NOTHING",
            [list(column) for column in columns],
        )
        written = cursor.rowcount
        _mark_late(cursor, min(row.at for row in rows))
    return written


def _mark_late(cursor, earliest: datetime) -> None:
    """Samples older than what is rolled up already: have their buckets rolled up again."""
    cursor.execute(
        "UPDATE monitoring_rollupmark SET redo_from = LEAST(COALESCE(redo_from, %s), %s) "
        "WHERE done_until > %s",
        [earliest, earliest, earliest],
    )


# --- roll-ups ----------------------------------------------------------------------------------------


def _floor(at: datetime, seconds: int) -> datetime:
    epoch = int(at.timestamp())
    return datetime.fromtimestamp(epoch - epoch % seconds, tz=UTC)


def _rollup_sql(seconds: int) -> str:
    """Buckets of `seconds` from raw samples (5 minutes) or from 5-minute roll-ups (1 hour)."""
    bucket = f"to_timestamp(floor(extract(epoch FROM {{at}}) / {seconds}) * {seconds})"
    if seconds == FIVE_MINUTES:
        figures = ", ".join(f"min({m}), avg({m}), max({m})" for m in METRICS)
        select = (
            f"SELECT gpu_id, slot, {seconds}, {bucket.format(at='at')}, count(*), {figures}, "
            "max(memory_total_bytes) FROM monitoring_sample WHERE at >= %s AND at < %s GROUP BY 1, 2, 4"
        )
    else:
        figures = ", ".join(
            f"min({m}_min), sum({m}_avg * samples) FILTER (WHERE {m}_avg IS NOT NULL) "
            f"/ NULLIF(sum(samples) FILTER (WHERE {m}_avg IS NOT NULL), 0), max({m}_max)"
            for m in METRICS
        )
        select = (
            f"SELECT gpu_id, slot, {seconds}, {bucket.format(at='bucket')}, sum(samples), {figures}, "
            f"max(memory_total_bytes) FROM monitoring_rollup "
            f"WHERE seconds = {FIVE_MINUTES} AND bucket >= %s AND bucket < %s GROUP BY 1, 2, 4"
        )
    targets = ", ".join(f"{m}_min, {m}_avg, {m}_max" for m in METRICS)
    updates = ", ".join(
        f"{column} = EXCLUDED.{column}"
        for column in (
            "samples",
            *(f"{m}_{s}" for m in METRICS for s in ("min", "avg", "max")),
            "memory_total_bytes",
        )
    )
    return (
        f"INSERT INTO monitoring_rollup (gpu_id, slot, seconds, bucket, samples, {targets}, "
        f"memory_total_bytes) {select} ON CONFLICT (gpu_id, slot, seconds, bucket) DO UPDATE SET {updates}"
    )


def roll_up(*, now: datetime | None = None) -> dict[int, int]:
    """Roll up every bucket that has ended (5 minutes from samples, then 1 hour from those), including
    buckets that late samples changed. Returns how many roll-up rows each resolution wrote."""
    now = now or datetime.now(UTC)
    written: dict[int, int] = {}
    for seconds in RESOLUTIONS:
        with transaction.atomic(), connection.cursor() as cursor:
            mark = RollupMark.objects.select_for_update().filter(seconds=seconds).first()
            end = _floor(now, seconds)
            if mark is None:  # the first run: from the oldest sample (or 5-minute roll-up) there is
                source = (
                    "min(at) FROM monitoring_sample"
                    if seconds == FIVE_MINUTES
                    else (f"min(bucket) FROM monitoring_rollup WHERE seconds = {FIVE_MINUTES}")
                )
                cursor.execute(f"SELECT {source}")
                oldest = cursor.fetchone()[0]
                start = _floor(oldest, seconds) if oldest is not None else end
            else:
                start = min(mark.done_until, mark.redo_from or mark.done_until)
                start = _floor(start, seconds)
            if start >= end:
                written[seconds] = 0
                continue
            cursor.execute(_rollup_sql(seconds), [start, end])
            written[seconds] = cursor.rowcount
            RollupMark.objects.update_or_create(
                seconds=seconds, defaults={"done_until": end, "redo_from": None}
            )
            if seconds == FIVE_MINUTES and mark is not None and start < mark.done_until:
                # Hours that the redone 5-minute buckets belong to are redone too.
                RollupMark.objects.filter(seconds=ONE_HOUR, done_until__gt=start).update(redo_from=start)
    return written


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


def series(
    *,
    metric: str,
    start: datetime,
    end: datetime,
    gpu_ids: Sequence[int] | None = None,
    slots: Sequence[tuple[int, int]] | None = None,
    now: datetime | None = None,
) -> tuple[int, list[Point]]:
    """A metric over [start, end): of one GPU or several (`gpu_ids`, whole-GPU figures), of given
    (gpu, slot) pairs (a pool's instances), or of the whole fleet (neither). Several GPUs or instances are
    averaged per point (low: the lowest, high: the highest), except memory, which adds up. Returns the
    resolution used and the points."""
    if metric not in METRICS:
        raise ValueError(f"unknown metric {metric!r}")
    now = now or datetime.now(UTC)
    seconds = resolution_for(end - start, now=now, start=start)
    combine = "sum" if metric == "memory_used_bytes" else "avg"
    where, params = ["TRUE"], []
    if slots is not None:
        if not slots:
            return seconds, []
        where.append("(gpu_id, slot) IN (SELECT * FROM unnest(%s::bigint[], %s::smallint[]))")
        params += [[g for g, _ in slots], [s for _, s in slots]]
    else:
        where.append("slot = -1")
        if gpu_ids is not None:
            where.append("gpu_id = ANY(%s::bigint[])")
            params.append(list(gpu_ids))
    low, high = ("sum", "sum") if combine == "sum" else ("min", "max")
    if seconds == 0:
        sql = (
            f"SELECT at, {low}({metric}), {combine}({metric}), {high}({metric}) FROM monitoring_sample "
            f"WHERE at >= %s AND at < %s AND {' AND '.join(where)} GROUP BY at ORDER BY at"
        )
    else:
        sql = (
            f"SELECT bucket, {low}({metric}_min), {combine}({metric}_avg), {high}({metric}_max) "
            f"FROM monitoring_rollup WHERE seconds = {seconds} AND bucket >= %s AND bucket < %s "
            f"AND {' AND '.join(where)} GROUP BY bucket ORDER BY bucket"
        )
    params = [start, end, *params]
    with connection.cursor() as cursor:
        cursor.execute(sql, params)
        return seconds, [Point(at, low, value, high) for at, low, value, high in cursor.fetchall()]
