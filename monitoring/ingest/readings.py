"""Readings into storage: the one path for every collector (node agents, the simulated fleet, a cluster's
Prometheus).

A batch is checked whole before anything is written (monitoring.ingest.hosts): a host that is not a node of
the cluster, a GPU the portal does not know on that node, a time too far in the past or the future refuses
the batch with a clear reason and stores nothing. What is stored, in one transaction: a sample per GPU and
per MIG instance, the newest figures, and the events the readings show (monitoring.ingest.events) — XID
errors, a rise of the uncorrected ECC count, a GPU gone from its host, a MIG layout other than the one the
portal expects. Instance UUIDs a host reports are bound to the allocations holding those instances.

A node agent's batch comes every 15 s from every node, so the usual batch costs a fixed, small number of
statements whatever it holds: one query reads the hosts' GPUs with all ingest needs of them (their newest
figures' time and ECC count, their live allocations' instances), the samples go in by COPY (new ones: a
sample of a GPU with figures at or after its instant may be a resend, and is inserted passing over what is
there, with the other such rows of the batch), the newest figures by one upsert. Events, faults and
bindings cost a statement only when the readings show one.
"""

from __future__ import annotations

import contextlib
import gc
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime

import msgspec
from django.db import connection, transaction
from django.utils.translation import gettext as _

from monitoring.collectors import InstanceReading, Reading
from monitoring.faults import services as faults
from monitoring.ingest import hosts
from monitoring.ingest.events import shown
from monitoring.ingest.hosts import Target
from monitoring.models import GpuEvent
from monitoring.models.samples import WHOLE_GPU
from monitoring.storage import samples
from monitoring.storage.statements import bound
from pools.models import Cluster, GpuCapacity
from pools.services import capacity
from portal.errors import InvalidInput


@dataclass
class Ingested:
    samples: int = 0
    gpus: int = 0
    events: list[GpuEvent] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)  # what was skipped, one line each


def ingest(
    *,
    cluster: Cluster,
    readings: Sequence[Reading],
    source: str,
    strict: bool = True,
    now: datetime | None = None,
    also: Callable[[], object] | None = None,
    times: tuple[datetime, datetime] | None = None,
    complete: bool | None = None,
) -> Ingested:
    """Store `readings` of `cluster`'s hosts. With `strict` (a node agent's batch), anything unknown
    refuses the whole batch (InvalidInput); without it (the portal's own collectors), unknown hosts and
    GPUs are skipped and named in `problems`. `also` runs in the batch's transaction once it is stored.
    `times` and `complete`: as monitoring.ingest.hosts.targets takes them (agents' batches checked when
    they were accepted are stored later, with the times of their acceptance, and not strictly)."""
    now = now or datetime.now(UTC)
    given = dict(source=source, strict=strict, now=now, also=also, times=times, complete=complete)
    with _no_cycle_collection():
        try:
            return _ingest(cluster, readings, **given, new=None)
        # Sent before after all (a resend racing the first), or an instance twice.
        except samples.StoredBefore:
            return _ingest(cluster, readings, **given, new=False)


@contextlib.contextmanager
def _no_cycle_collection() -> Iterator[None]:
    """Python's collector of reference cycles off for one ingest, back on after. A writer's round holds a
    few objects per sample (the GPUs read, the targets, the rows) until it ends: hundreds of thousands at
    100,000 GPUs. As they pile up they set off the collector again and again, each time walking all of them
    and the process's whole heap besides, a quarter of the writer's time. They hold no cycles but for the
    odd exception's traceback, which the collector finds on its next run once it is on again."""
    if not gc.isenabled():  # off already (another thread's ingest, or the process's own choice): left so
        yield
        return
    gc.disable()
    try:
        yield
    finally:
        gc.enable()


@dataclass(frozen=True)
class Checked:
    gpus: int
    samples: int


def check(*, cluster: Cluster, readings: Sequence[Reading], now: datetime) -> Checked:
    """What `readings` of `cluster`'s hosts would store, checked as a strict ingest checks them
    (InvalidInput: the first reason to refuse them), from the hosts' present GPUs alone; writes nothing.
    The hosts' GPUs come from this process's copies where it holds them (monitoring.ingest.copies); a
    batch is refused only on a fresh read of them."""
    names = {reading.host for reading in readings}
    found, copied = hosts.known(cluster, names)
    problems: list[str] = []
    try:
        found_targets = hosts.targets(cluster, readings, found, strict=True, now=now, problems=problems)
    except InvalidInput:
        if not copied:
            raise
        found, _copied = hosts.known(cluster, names, fresh=True)
        found_targets = hosts.targets(cluster, readings, found, strict=True, now=now, problems=problems)
    # A sample of each GPU (each is read once an instant: targets refuses it twice) and of each of its
    # instances that _rows places; an instance reported twice is one (the second passed over as stored).
    count = 0
    for target in found_targets:
        layout = target.gpu.layout
        starts = {_start(instance, layout) for instance in target.reading.instances}
        starts.discard(None)
        count += 1 + len(starts)
    return Checked(gpus=len(found_targets), samples=count)


def _ingest(
    cluster: Cluster,
    readings: Sequence[Reading],
    *,
    source: str,
    strict: bool,
    now: datetime,
    also: Callable[[], object] | None,
    times: tuple[datetime, datetime] | None,
    complete: bool | None,
    new: bool | None,
) -> Ingested:
    result = Ingested()
    with transaction.atomic():
        _without_compiling()
        found = hosts.read(cluster, {reading.host for reading in readings})
        targets = hosts.targets(
            cluster,
            readings,
            found,
            strict=strict,
            now=now,
            problems=result.problems,
            times=times,
            complete=complete,
        )
        values, latest = _rows(targets, result.problems)
        if new is None:
            result.samples = _store_samples(values, {t.gpu.pk: t.gpu.newest for t in targets})
        else:
            result.samples = samples.store_values(values, new=new)
        _store_latest(latest, source=source)
        events = shown(targets, found, readings, source)
        if events:
            result.events = GpuEvent.objects.bulk_create(events)
        _bind_instances(targets)
        # In the batch's transaction: a fault (the drain, the flagged pools) is stored with the events that
        # show it or not at all. After commit, a failure would leave events that never open their fault,
        # and no later reading repeats them (the ECC count is stored now; a GPU is lost once).
        faults.handle(result.events)
        if also is not None:
            also()
    result.gpus = len(targets)
    return result


def _store_samples(values: list[tuple], newest: dict[int, datetime | None]) -> int:
    """Store the rows, each by COPY unless the newest figures of its GPU (`newest`, by GPU id) say that a
    sample at its instant may be there already (a resend): those are inserted passing over what is there,
    which costs several times as much a row. One agent's resend costs the writer's round only its own rows."""
    fresh: list[tuple] = []
    maybe_stored: list[tuple] = []
    for row in values:
        before = newest[row[0]]
        (fresh if before is None or row[2] > before else maybe_stored).append(row)
    return samples.store_values(fresh, new=True) + samples.store_values(maybe_stored, new=False)


def _without_compiling() -> None:
    """For the rest of the batch's transaction, no statement compiled to machine code (PostgreSQL's JIT): its
    statements are lookups and writes of a bounded size, which the planner may still estimate dear enough
    (the hosts' read of a writer's round of 2,000 batches) to spend a few hundred milliseconds compiling,
    far more than running them takes."""
    with connection.cursor() as cursor:
        cursor.execute("SET LOCAL jit = off")


# --- rows --------------------------------------------------------------------------------------------


def _real(value):
    if value is None:
        return None
    value = value if type(value) is float else float(value)
    return value if value - value == 0.0 else None  # a NaN or an infinity is no figure


def _whole(value):
    return value if value is None or type(value) is int else int(value)


def _rows(targets: list[Target], problems: list[str]) -> tuple[list[tuple], list[tuple]]:
    """The sample of each GPU and instance, as a tuple in the order of samples.COLUMNS, and its newest
    figures, as a tuple in the order of _LATEST_COLUMNS (the problems as a tuple)."""
    values: list[tuple] = []
    latest: list[tuple] = []
    for target in targets:
        g, gpu, at, host = target.reading, target.gpu, target.at, target.host
        row = (
            gpu.pk,
            WHOLE_GPU,
            at,
            _real(g.power_w),
            _real(g.temperature_c),
            _real(g.utilisation_pct),
            _real(g.sm_active_pct),
            _whole(g.memory_used_bytes),
            _whole(g.memory_total_bytes),
            _whole(g.ecc_corrected),
            _whole(g.ecc_uncorrected),
        )
        values.append(row)
        latest.append((*row, host, "", "", g.problems))
        if not g.instances:
            continue
        layout = gpu.layout
        for instance in g.instances:
            start = _start(instance, layout)
            if start is None:
                problems.append(
                    _("Instance %(uuid)s of GPU %(gpu)s: no placement, so its pool cannot be told.")
                    % {"uuid": instance.uuid or instance.gpu_instance_id, "gpu": gpu.name}
                )
                continue
            row = (
                gpu.pk,
                start,
                at,
                None,
                None,
                None,
                _real(instance.sm_active_pct),
                _whole(instance.memory_used_bytes),
                _whole(instance.memory_total_bytes),
                None,
                None,
            )
            values.append(row)
            profile = instance.profile or _layout_profile(layout, start)
            latest.append((*row, host, profile, instance.uuid or "", instance.problems))
    return values, latest


def _start(instance: InstanceReading, layout: list | None) -> int | None:
    """The first memory slice of a reported instance: its placement, else that of its UUID in the GPU's
    layout; None when neither tells (its pool cannot be told, and it is not stored)."""
    if instance.placement:
        return instance.placement[0]
    uuid = instance.uuid
    return next((entry["start"] for entry in layout or () if uuid and entry.get("uuid") == uuid), None)


def _layout_profile(layout: list | None, start: int) -> str:
    return next((entry.get("profile", "") for entry in layout or () if entry["start"] == start), "")


_LATEST_COLUMNS = (*samples.COLUMNS, "host", "profile", "instance_uuid", "problems")
_LATEST_TYPES = (*samples.TYPES, "text", "text", "text", "jsonb")
# The rows travel as one JSON array of arrays: PostgreSQL reads it faster than the driver writes 15 arrays. As
# jsonb, each row's fields are read by position; json would parse a row's text again for each of them.
_LATEST_VALUES = [f"(r->>{n})::{kind}" for n, kind in enumerate(_LATEST_TYPES)]
_LATEST_VALUES[-1] = f"(r->{len(_LATEST_TYPES) - 1})::jsonb"  # the problems, a JSON value itself
_LATEST_SQL = (
    f"INSERT INTO monitoring_latest ({', '.join(_LATEST_COLUMNS)}, source) SELECT {', '.join(_LATEST_VALUES)}"
    + ", %s::text FROM jsonb_array_elements(%s::jsonb) r ON CONFLICT (gpu_id, slot) DO UPDATE SET "
    + ", ".join(f"{c} = EXCLUDED.{c}" for c in (*_LATEST_COLUMNS[2:], "source"))
    + " WHERE monitoring_latest.at <= EXCLUDED.at"
)


_ROWS = msgspec.json.Encoder()


def _store_latest(latest: list[tuple], *, source: str) -> None:
    """Upsert the newest figures in one statement; a row older than what is there already changes nothing."""
    if not latest:
        return
    # One statement may not upsert a row twice: of a slot read at several instants (an agent's buffered
    # batch), only the newest reading counts.
    newest: dict[tuple[int, int], tuple] = {}
    for entry in latest:
        key = (entry[0], entry[1])
        if key not in newest or newest[key][2] <= entry[2]:
            newest[key] = entry
    # In the order of the rows' keys, so that two writers upserting some of the same rows lock them in one
    # order and wait for each other rather than deadlock.
    ordered = (newest[key] for key in sorted(newest))
    rows = _ROWS.encode(list(ordered)).decode()  # times in RFC 3339, which PostgreSQL reads
    with bound(prepared=True) as cursor:
        cursor.execute(_LATEST_SQL, [source, rows])


def _bind_instances(targets: list[Target]) -> None:
    """Bind the instance UUIDs hosts report to the allocations holding those instances, where they
    differ from what the allocations say (seldom: after a MIG change)."""
    stale: dict[int, dict[int, str]] = {}
    for target in targets:
        if not target.gpu.held or not target.reading.instances:
            continue
        reported = {i.placement[0]: i.uuid for i in target.reading.instances if i.placement and i.uuid}
        if any(reported.get(start, uuid) != uuid for start, uuid in target.gpu.held):
            stale.setdefault(target.gpu.pk, {}).update(reported)
    for gpu in GpuCapacity.objects.filter(pk__in=stale) if stale else ():
        capacity.bind_instance_uuids(gpu=gpu, uuids=stale[gpu.pk])
