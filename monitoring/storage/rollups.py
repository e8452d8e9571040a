"""Roll-ups of GPU samples: min / avg / max of each figure over 5-minute buckets of raw samples and 1-hour
buckets of those, written incrementally.

- A run (`roll_up`, beat's every minute) writes each bucket that ended at least SETTLE_SECONDS ago and was not
  written yet (`RollupMark.done_until`), 5 minutes from samples, then 1 hour from the 5-minute ones; a mark's
  `redo_from` has a run write its buckets again from there.
- A late sample (older than a bucket already written: an agent's buffer after the portal was away) repairs
  its own buckets in the transaction that stores it (`repair`): its GPU's and slot's alone, so that one node's
  buffer never has the whole fleet rolled up again.

Why a run waits SETTLE_SECONDS: a batch in flight when a run reads its bucket would be neither in the bucket
nor late. A batch whose samples are at most RECENT_SECONDS old (the usual one, posted as it is read) cannot
be late, since any run that writes their bucket starts at least SETTLE_SECONDS - RECENT_SECONDS after the
batch began; so it reads no mark at all, provided its transaction lasts less than that (seconds, where the
web's request timeout is a minute). An older batch reads the marks under a share lock, which a run waits
for before it reads the samples: either the run sees the batch, or the batch sees the run's mark and
repairs.

Roll-ups are recomputed, not added to, so that writing a bucket twice changes nothing.
"""

from __future__ import annotations

from collections.abc import Iterable
from datetime import UTC, datetime, timedelta

from django.db import connection, transaction

from monitoring.models import RollupMark
from monitoring.models.samples import METRICS

FIVE_MINUTES = 300
ONE_HOUR = 3600
RESOLUTIONS = (FIVE_MINUTES, ONE_HOUR)
SETTLE_SECONDS = 60
RECENT_SECONDS = 10

_FIGURES = (*(f"{m}_{s}" for m in METRICS for s in ("min", "avg", "max")), "memory_total_bytes")
_TARGET = f"monitoring_rollup (gpu_id, slot, seconds, bucket, samples, {', '.join(_FIGURES)})"
_UPSERT = "ON CONFLICT (gpu_id, slot, seconds, bucket) DO UPDATE SET " + ", ".join(
    f"{column} = EXCLUDED.{column}" for column in ("samples", *_FIGURES)
)


def floor(at: datetime, seconds: int) -> datetime:
    """The start of the bucket of `seconds` that holds `at`."""
    epoch = int(at.timestamp())
    return datetime.fromtimestamp(epoch - epoch % seconds, tz=UTC)


def _insert(seconds: int, *, bucket: str, source: str, group: str) -> str:
    """The roll-up rows of `seconds` from the rows `s` of `source` (samples for 5 minutes, 5-minute roll-ups
    for an hour), grouped by `group`, each written at `bucket`."""
    if seconds == FIVE_MINUTES:
        figures = ", ".join(f"min(s.{m}), avg(s.{m}), max(s.{m})" for m in METRICS)
        count = "count(*)"
    else:
        figures = ", ".join(
            f"min(s.{m}_min), sum(s.{m}_avg * s.samples) FILTER (WHERE s.{m}_avg IS NOT NULL) "
            f"/ NULLIF(sum(s.samples) FILTER (WHERE s.{m}_avg IS NOT NULL), 0), max(s.{m}_max)"
            for m in METRICS
        )
        count = "sum(s.samples)"
    return (
        f"INSERT INTO {_TARGET} SELECT s.gpu_id, s.slot, {seconds}, {bucket}, {count}, {figures}, "
        f"max(s.memory_total_bytes) FROM {source} GROUP BY {group} {_UPSERT}"
    )


def _source(seconds: int) -> str:
    return "monitoring_sample s" if seconds == FIVE_MINUTES else "monitoring_rollup s"


def _time(seconds: int) -> str:
    return "s.at" if seconds == FIVE_MINUTES else "s.bucket"


def _kept(seconds: int) -> str:
    """What of the source a roll-up of `seconds` reads: all samples, or the 5-minute roll-ups."""
    return "TRUE" if seconds == FIVE_MINUTES else f"s.seconds = {FIVE_MINUTES}"


def _of_bucket(seconds: int) -> str:
    """One bucket of `seconds`: its start (written), then its start and end (read)."""
    where = f"{_kept(seconds)} AND {_time(seconds)} >= %s AND {_time(seconds)} < %s"
    source = f"{_source(seconds)} WHERE {where}"
    return _insert(seconds, bucket="%s::timestamptz", source=source, group="s.gpu_id, s.slot")


def _of_keys(seconds: int) -> str:
    """The buckets of `seconds` named by (GPU, slot, bucket start) arrays."""
    keys = (
        "(SELECT DISTINCT * FROM unnest(%s::bigint[], %s::smallint[], %s::timestamptz[]) "
        "AS k(gpu_id, slot, bucket)) k"
    )
    join = (
        f"{keys} JOIN {_source(seconds)} ON s.gpu_id = k.gpu_id AND s.slot = k.slot AND {_kept(seconds)} "
        f"AND {_time(seconds)} >= k.bucket AND {_time(seconds)} < k.bucket + interval '{seconds} seconds'"
    )
    return _insert(seconds, bucket="k.bucket", source=join, group="s.gpu_id, s.slot, k.bucket")


_BUCKET_SQL = {seconds: _of_bucket(seconds) for seconds in RESOLUTIONS}
_KEYS_SQL = {seconds: _of_keys(seconds) for seconds in RESOLUTIONS}


def roll_up(*, now: datetime | None = None) -> dict[int, int]:
    """Roll up every bucket that has settled (5 minutes from samples, then 1 hour from those) and any a mark
    asks to redo. Returns how many roll-up rows each resolution wrote."""
    now = now or datetime.now(UTC)
    written: dict[int, int] = {}
    for seconds in RESOLUTIONS:
        with transaction.atomic(), connection.cursor() as cursor:
            mark = RollupMark.objects.select_for_update().filter(seconds=seconds).first()
            end = floor(now - timedelta(seconds=SETTLE_SECONDS), seconds)
            if mark is None:  # the first run: from the oldest sample (or 5-minute roll-up) there is
                source = (
                    "min(at) FROM monitoring_sample"
                    if seconds == FIVE_MINUTES
                    else (f"min(bucket) FROM monitoring_rollup WHERE seconds = {FIVE_MINUTES}")
                )
                cursor.execute(f"SELECT {source}")
                oldest = cursor.fetchone()[0]
                start = floor(oldest, seconds) if oldest is not None else end
            else:
                start = floor(min(mark.done_until, mark.redo_from or mark.done_until), seconds)
            written[seconds] = 0
            if start >= end:
                continue
            # A bucket a statement: its start is a constant, so that rows group by GPU and slot alone.
            step = timedelta(seconds=seconds)
            for bucket in range(int(start.timestamp()), int(end.timestamp()), seconds):
                at = datetime.fromtimestamp(bucket, tz=UTC)
                cursor.execute(_BUCKET_SQL[seconds], [at, at, at + step])
                written[seconds] += cursor.rowcount
            RollupMark.objects.update_or_create(
                seconds=seconds, defaults={"done_until": end, "redo_from": None}
            )
            if seconds == FIVE_MINUTES and mark is not None and start < mark.done_until:
                # Hours that the redone 5-minute buckets belong to are redone too.
                RollupMark.objects.filter(seconds=ONE_HOUR, done_until__gt=start).update(redo_from=start)
    return written


def repair(cursor, keys: Iterable[tuple[int, int, datetime]], *, earliest: datetime) -> int:
    """Write again the written buckets that samples just stored at (GPU, slot, instant) `keys` belong to, in
    the caller's transaction; `earliest` is the oldest instant. Returns how many 5-minute buckets changed."""
    if earliest >= datetime.now(UTC) - timedelta(seconds=RECENT_SECONDS):
        return 0  # too recent for any run to have written its bucket (see above)
    cursor.execute("SELECT seconds, done_until FROM monitoring_rollupmark ORDER BY seconds FOR SHARE")
    done = dict(cursor.fetchall())
    five_done = done.get(FIVE_MINUTES)
    if five_done is None or earliest >= five_done:
        return 0
    buckets = {(gpu, slot, floor(at, FIVE_MINUTES)) for gpu, slot, at in keys if at < five_done}
    cursor.execute(_KEYS_SQL[FIVE_MINUTES], _arrays(buckets))
    repaired = cursor.rowcount
    hour_done = done.get(ONE_HOUR)
    if hour_done is not None:
        hours = {(gpu, slot, floor(at, ONE_HOUR)) for gpu, slot, at in buckets if at < hour_done}
        if hours:
            cursor.execute(_KEYS_SQL[ONE_HOUR], _arrays(hours))
    return repaired


def _arrays(keys: set[tuple[int, int, datetime]]) -> list[list]:
    return [list(column) for column in zip(*sorted(keys), strict=True)]
