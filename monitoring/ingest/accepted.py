"""Agents' batches between the answer and storage: checked whole when they come, stored many at a time.

A fleet of 100,000 GPUs posts 12,500 batches every 15 s. Storing each as it comes costs a transaction of a
few statements per batch, far more than the rows themselves; so the endpoint checks a batch as strictly as
storage would (its shape, its times, its hosts and GPUs: monitoring.ingest.readings.check), puts its
readings on a Redis list and answers 202. A writer on MONITORING_QUEUE then takes up to
MONITORING_STORE_BATCHES of them at a time and stores each cluster's share in one transaction
(monitoring.ingest.readings.ingest: one read of the hosts' GPUs, one COPY of the samples, one upsert of the
newest figures, and the events they show).

- waiting: a batch on the list, `<cluster> <token> <accepted at>` and a newline before its checked readings
  in the wire's JSON (see _Entry), which the writer reads back without checking again.
  The first batch on an empty list sends the writer's task; beat sends it every
  MONITORING_STORE_SECONDS too, so a lost message delays a batch by that much at most (its deadline).
- revoked: the same call that puts a batch refuses it when its token was revoked lately
  (monitoring.ingest.tokens tells the broker), so that a web process's copy of a token (monitoring.ingest.
  copies) stops taking batches the moment the token is revoked.
- full: MONITORING_ACCEPTED_MAX_BATCHES waiting. The endpoint answers 503 and the agents keep their
  readings and try again after their back-off, so that a writer that is down costs Redis a bounded memory
  (a node's batch of 8 GPUs is about 5 kB).
- writer: one at a time (a Redis lock; another run finds it held and leaves the list to the holder, which
  looks again once it lets go). A run stores until nothing has come for MONITORING_STORE_LINGER_SECONDS,
  for MONITORING_STORE_SECONDS at most, then sends for itself again behind the queue's other tasks. Its
  rounds begin MONITORING_STORE_GATHER_SECONDS apart at least, unless a full round waits: a round's fixed
  cost (a few statements, the commit) is then shared by every batch that came in that time, rather than by
  the few that came while the last round was stored; a batch waits that much longer at most. A
  batch is stored with the times taken when it was accepted; a host or GPU gone since then is passed over
  and logged, and a batch that its token brought once revoked is dropped. When the database fails, what
  was not stored is put back at the head of the list and the task fails, to be run again. A worker killed
  in the middle of a write loses the batches it held (MONITORING_STORE_BATCHES at most): figures, never
  money.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import math
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta

import msgspec
import redis
from django.db import InterfaceError, OperationalError

from monitoring import task_names
from monitoring.collectors import Reading
from monitoring.conf import settings
from monitoring.ingest import broker, tokens
from monitoring.ingest.readings import ingest
from monitoring.models import AgentToken
from monitoring.storage.statements import bound
from pools.models import Cluster
from portal.celery import app

log = logging.getLogger(__name__)

# What a failing database raises: the batches are put back for the next run. Anything else is the batch's
# own fault (it cannot be stored however often it is tried) and is dropped with its reason logged.
_DATABASE_DOWN = (OperationalError, InterfaceError)


_client = broker.client


def _key() -> str:
    """The list of this database's waiting batches."""
    return broker.key("accepted")


def _writer(key: str) -> str:
    """The lock of the writer at work on `key`'s list."""
    return f"{key}:writer"


class Full(Exception):
    """MONITORING_ACCEPTED_MAX_BATCHES batches wait already."""


class Revoked(Exception):
    """The batch's token was revoked (a process's copy of it did not know yet)."""


def waiting() -> int:
    """How many accepted batches wait to be stored."""
    return _client().llen(_key())


def idle() -> bool:
    """Whether nothing waits and no writer is at work: all accepted so far is stored."""
    client, key = _client(), _key()
    return not client.llen(key) and not client.exists(_writer(key))


# In one round trip: -2 when the token was revoked lately, -1 when the list is full; else the batch is put
# last, and 1 says that the writer is to be sent for (the list was empty and no writer holds it: a holder
# looks at the list again once it lets go).
_PUT = """
if redis.call('ZSCORE', KEYS[3], ARGV[3]) then return -2 end
if redis.call('LLEN', KEYS[1]) >= tonumber(ARGV[2]) then return -1 end
if redis.call('RPUSH', KEYS[1], ARGV[1]) == 1 and redis.call('EXISTS', KEYS[2]) == 0 then return 1 end
return 0
"""


def _put_script():
    """_PUT on this process's own connection to the broker (the call is on every agent's request)."""
    return _script_on(broker.own_connection())


@functools.cache
def _script_on(client: redis.Redis):
    return client.register_script(_PUT)


@dataclass
class _Entry:
    """An entry's checked readings as JSON in the wire's shapes (monitoring.collectors.wire), written and
    read by msgspec in C straight from the collectors' structs, at a tenth of the time of the wire's own
    functions; an entry an earlier release wrote with those reads the same."""

    readings: list[Reading]


_ENCODER = msgspec.json.Encoder()
_DECODER = msgspec.json.Decoder(type=_Entry)


def put(*, cluster_id: int, token_id: int, at: datetime, readings: Sequence[Reading]) -> None:
    """Leave a checked batch to the writer, sending it when it is not at work (Full: no room; Revoked: the
    token was revoked, which this process's copy of it may not know)."""
    key = _key()
    entry = f"{cluster_id} {token_id} {at.timestamp()!r}\n".encode() + _ENCODER.encode(_Entry(list(readings)))
    put = _put_script()(
        keys=[key, _writer(key), broker.revoked_tokens_key()],
        args=[entry, settings.MONITORING_ACCEPTED_MAX_BATCHES, token_id],
    )
    if put == -2:
        raise Revoked
    if put < 0:
        raise Full
    if put:
        app.send_task(task_names.STORE_ACCEPTED)


@dataclass
class Batch:
    cluster_id: int
    token_id: int
    at: datetime
    readings: list[Reading]


def _batch(entry: bytes) -> Batch | None:
    head, _, body = entry.partition(b"\n")
    try:
        cluster_id, token_id, at = head.split()
        readings = _DECODER.decode(body).readings
        return Batch(int(cluster_id), int(token_id), datetime.fromtimestamp(float(at), UTC), readings)
    except ValueError as error:  # only a foreign or damaged entry (msgspec's errors are ValueErrors)
        log.error("Dropped an accepted batch that cannot be read (%s): %r", error, entry[:200])
        return None


@dataclass
class Stored:
    batches: int = 0
    samples: int = 0
    events: int = 0
    dropped: int = 0  # batches that could not be stored at all
    passed_over: list[str] = field(default_factory=list)  # readings of hosts or GPUs gone since they came

    def summary(self) -> str:
        text = f"{self.batches} batches, {self.samples} samples, {self.events} events"
        if self.dropped:
            text += f", {self.dropped} batches dropped"
        if self.passed_over:
            text += f", {len(self.passed_over)} readings passed over"
        return text


def _next(client: redis.Redis, key: str, most: int, linger: float) -> list[bytes]:
    """Up to `most` waiting batches; none waiting, the first to come within `linger` seconds (waited for in
    Redis) with any that came with it."""
    entries = client.lpop(key, most)
    if entries or not linger:
        return entries or []
    first = client.blpop([key], timeout=min(linger, broker.LONGEST_WAIT))
    if first is None:
        return []
    rest = client.lpop(key, most - 1) if most > 1 else None
    return [first[1], *(rest or [])]


def store(
    *, most: int | None = None, linger: float = 0.0, within: float | None = None, gather: float = 0.0
) -> Stored:
    """Store what waits, `most` batches (MONITORING_STORE_BATCHES) a round, until the list is empty or
    another writer holds it; with `linger`, until nothing has come for that many seconds (while agents post,
    one run of the writer stores them all, in rounds as large as they come). With `gather` too, a round that
    found fewer than `most` waiting is followed by a pause until that many seconds have passed since it
    began, so that the next round stores together what came meanwhile. With `within`, no round begins once
    that many seconds have passed: the run sends for the writer again, behind whatever else waits on its
    queue (agents never stop posting, and the roll-ups and alerts take turns with the writer)."""
    client, key = _client(), _key()
    most = most or settings.MONITORING_STORE_BATCHES
    stored = Stored()
    ends = None if within is None else time.monotonic() + within
    while True:
        lock = client.lock(_writer(key), timeout=settings.MONITORING_STORE_LOCK_SECONDS, blocking=False)
        if not lock.acquire(token=uuid.uuid4().hex):
            return stored  # the holder looks at the list again once it lets go
        try:
            while (ends is None or time.monotonic() < ends) and (entries := _next(client, key, most, linger)):
                began = time.monotonic()
                lock.reacquire()  # a round lasts seconds; the lock outlives each one
                _store(entries, stored, put_back=lambda rest: client.lpush(key, *reversed(rest)))
                if linger and len(entries) < most:
                    pause = min(gather, broker.LONGEST_WAIT)  # well within the lock's life
                    _pause(until=min(began + pause, ends if ends is not None else math.inf))
        finally:
            with contextlib.suppress(redis.exceptions.LockError):  # expired, maybe taken: that writer goes on
                lock.release()
        if not client.llen(key):  # a batch put between the last pop and the release sent no task
            return stored
        if ends is not None and time.monotonic() >= ends:
            app.send_task(task_names.STORE_ACCEPTED)
            return stored


def _pause(*, until: float) -> None:
    """Wait until the monotonic clock reads `until` (not at all once it has)."""
    left = until - time.monotonic()
    if left > 0:
        time.sleep(left)


_REVOKED_SQL = f"SELECT id, revoked_at FROM {AgentToken._meta.db_table} WHERE id = ANY(%s)"
_NEVER = datetime.max.replace(tzinfo=UTC)  # a live token's revocation
_ALWAYS = datetime.min.replace(tzinfo=UTC)  # that of a token deleted since


def _brought_while_live(batches: list[tuple[bytes, Batch]], stored: Stored) -> list[tuple[bytes, Batch]]:
    """Of `batches`, those whose token was live when they were taken: a process's copy of a token may take
    a batch after its revocation, before the broker's word of it is in (monitoring.ingest.copies)."""
    with bound(prepared=True) as cursor:  # one array, not thousands of parameters
        cursor.execute(_REVOKED_SQL, [sorted({batch.token_id for _entry, batch in batches})])
        revoked = {pk: at or _NEVER for pk, at in cursor}
    live = [(entry, batch) for entry, batch in batches if batch.at < revoked.get(batch.token_id, _ALWAYS)]
    if len(live) < len(batches):
        log.warning("Dropped %d batches that tokens brought once revoked.", len(batches) - len(live))
        stored.dropped += len(batches) - len(live)
    return live


def _store(entries: list[bytes], stored: Stored, *, put_back) -> None:
    batches = [(entry, batch) for entry in entries if (batch := _batch(entry)) is not None]
    stored.dropped += len(entries) - len(batches)
    try:
        batches = _brought_while_live(batches, stored)
        by_cluster: dict[int, list[tuple[bytes, Batch]]] = {}
        for entry, batch in batches:
            by_cluster.setdefault(batch.cluster_id, []).append((entry, batch))
        clusters = Cluster.objects.in_bulk(list(by_cluster))
    except _DATABASE_DOWN:  # all of them wait for the next run
        put_back([entry for entry, _batch in batches])
        raise
    groups = list(by_cluster.items())
    for n, (cluster_id, group) in enumerate(groups):
        cluster = clusters.get(cluster_id)
        if cluster is None:
            log.warning("Dropped %d batches of a cluster deleted since (id %s).", len(group), cluster_id)
            stored.dropped += len(group)
            continue
        try:
            _store_cluster(cluster, [batch for _entry, batch in group], stored)
        except _DATABASE_DOWN:  # this cluster's batches and those after it wait for the next run
            put_back([entry for _id, rest in groups[n:] for entry, _batch in rest])
            raise


def _times(batches: list[Batch]) -> tuple[datetime, datetime]:
    """The oldest and newest times any of `batches` was accepted with."""
    return (
        min(batch.at for batch in batches) - timedelta(seconds=settings.MONITORING_SAMPLE_MAX_AGE_SECONDS),
        max(batch.at for batch in batches) + timedelta(seconds=settings.MONITORING_SAMPLE_MAX_AHEAD_SECONDS),
    )


def _ingest(cluster: Cluster, batches: list[Batch], stored: Stored) -> None:
    uses: dict[int, tuple[datetime, str]] = {}  # each token's newest batch: when it came, its last host
    for batch in batches:
        if batch.readings and (batch.token_id not in uses or uses[batch.token_id][0] <= batch.at):
            uses[batch.token_id] = (batch.at, batch.readings[-1].host)
    readings, seen = [], set()
    for batch in batches:
        for reading in batch.readings:
            if (reading.host, reading.at) not in seen:  # else a resend taken before the first was stored
                seen.add((reading.host, reading.at))
                readings.append(reading)
    result = ingest(
        also=lambda: tokens.record_agent_hosts(uses),
        cluster=cluster,
        readings=readings,
        source="agent",
        strict=False,  # checked when they came; what went since is passed over, not the rest refused
        complete=True,  # an agent reports every GPU of its host
        times=_times(batches),
    )
    stored.batches += len(batches)
    stored.samples += result.samples
    stored.events += len(result.events)
    if result.problems:
        stored.passed_over += result.problems
        log.warning("Passed over readings of cluster %s: %s", cluster.name, "; ".join(result.problems[:5]))


def _store_cluster(cluster: Cluster, batches: list[Batch], stored: Stored) -> None:
    """One transaction for all; should it fail for a reason of its own, each batch in its own, so that one
    batch that cannot be stored costs only itself."""
    if len(batches) > 1:
        try:
            _ingest(cluster, batches, stored)
            return
        except _DATABASE_DOWN:
            raise
        except Exception:  # the batches' own fault: the same again would fail again
            log.exception("Could not store %d batches of %s at once; each alone now", len(batches), cluster)
    for batch in batches:
        try:
            _ingest(cluster, [batch], stored)
        except _DATABASE_DOWN:
            raise
        except Exception:
            log.exception("Dropped an accepted batch of %s that cannot be stored", cluster)
            stored.dropped += 1
