"""Readings into storage: the one path for every collector (node agents, the simulated fleet, a cluster's
Prometheus).

A batch is checked whole before anything is written: a host that is not a node of the cluster, a GPU the
portal does not know on that node, a time too far in the past or the future refuses the batch with a
clear reason and stores nothing. What is stored, in one transaction: a sample per GPU and per MIG
instance, the newest figures, and the events the readings show — XID errors, a rise of the uncorrected
ECC count, a GPU gone from its host, a MIG layout other than the one the portal expects. Instance UUIDs
a host reports are bound to the allocations holding those instances.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta

from django.db import connection, transaction
from django.db.models import Max, Q
from django.utils.translation import gettext as _

from monitoring.collectors import GpuReading, Reading
from monitoring.conf import settings
from monitoring.faults import services as faults
from monitoring.models import GpuEvent, Latest
from monitoring.models.samples import WHOLE_GPU
from monitoring.storage import samples
from pools.models import Allocation, Cluster, GpuCapacity, NodeCapacity
from pools.services import capacity
from portal.errors import InvalidInput

FAULT_XIDS = faults.FAULT_XIDS  # the fatal XIDs, defined with the rules that act on them
# Sources whose XID figure is the last XID seen (a gauge), not the XIDs since the previous reading.
LAST_XID_SOURCES = frozenset({"dcgm"})


@dataclass
class Ingested:
    samples: int = 0
    gpus: int = 0
    events: list[GpuEvent] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)  # what was skipped, one line each


@dataclass(frozen=True)
class _Target:
    gpu: GpuCapacity
    reading: GpuReading
    host: str
    at: datetime
    complete: bool  # the host reported all its GPUs (an agent does); a missing GPU is then lost


def ingest(
    *,
    cluster: Cluster,
    readings: Sequence[Reading],
    source: str,
    strict: bool = True,
    now: datetime | None = None,
) -> Ingested:
    """Store `readings` of `cluster`'s hosts. With `strict` (a node agent's batch), anything unknown
    refuses the whole batch (InvalidInput); without it (the portal's own collectors), unknown hosts and
    GPUs are skipped and named in `problems`."""
    now = now or datetime.now(UTC)
    result = Ingested()
    targets = _targets(cluster, readings, strict=strict, now=now, problems=result.problems)
    rows, latest = [], []
    for target in targets:
        gpu_rows, gpu_latest = _rows(target, result.problems)
        rows += gpu_rows
        latest += gpu_latest
    with transaction.atomic():
        previous = _previous_counts([t.gpu.pk for t in targets if t.reading.ecc_uncorrected])
        result.samples = samples.store(rows)
        _store_latest(latest, source=source)
        result.events = GpuEvent.objects.bulk_create(_events(targets, previous, readings, cluster, source))
        _bind_instances(targets)
        # In the batch's transaction: a fault (the drain, the flagged pools) is stored with the events that
        # show it or not at all. After commit, a failure would leave events that never open their fault,
        # and no later reading repeats them (the ECC count is stored now; a GPU is lost once).
        faults.handle(result.events)
    result.gpus = len(targets)
    return result


# --- checking ----------------------------------------------------------------------------------------


def accepted_times(*, now: datetime) -> tuple[datetime, datetime]:
    """The oldest and the newest time a reading may carry at `now`; outside them a batch is refused."""
    return (
        now - timedelta(seconds=settings.MONITORING_SAMPLE_MAX_AGE_SECONDS),
        now + timedelta(seconds=settings.MONITORING_SAMPLE_MAX_AHEAD_SECONDS),
    )


def _targets(
    cluster: Cluster, readings: Sequence[Reading], *, strict: bool, now: datetime, problems: list[str]
) -> list[_Target]:
    oldest, newest = accepted_times(now=now)
    hosts = {reading.host for reading in readings}
    nodes = {
        node.name: node for node in NodeCapacity.objects.filter(cluster=cluster, name__in=hosts, present=True)
    }
    gpus: dict[tuple[int, str], GpuCapacity] = {}
    by_index: dict[tuple[int, int], GpuCapacity] = {}
    for gpu in GpuCapacity.objects.filter(node__in=nodes.values(), present=True).select_related("node"):
        if gpu.uuid:
            gpus[(gpu.node_id, gpu.uuid)] = gpu
        by_index[(gpu.node_id, gpu.index)] = gpu
    targets: list[_Target] = []
    seen: set[tuple[int, datetime]] = set()
    for reading in readings:
        at = reading.at
        if at.tzinfo is None:
            raise InvalidInput(_("Reading times must carry a time zone."))
        if not oldest <= at <= newest:
            why = _("Host %(host)s reported a reading at %(at)s, outside %(oldest)s to %(newest)s.") % {
                "host": reading.host,
                "at": at.isoformat(),
                "oldest": oldest.isoformat(timespec="seconds"),
                "newest": newest.isoformat(timespec="seconds"),
            }
            _refuse_or_note(why, strict=strict, problems=problems)
            continue
        node = nodes.get(reading.host)
        if node is None:
            why = _("%(host)s is not a node of cluster %(cluster)s.") % {
                "host": reading.host,
                "cluster": cluster.name,
            }
            _refuse_or_note(why, strict=strict, problems=problems)
            continue
        for gpu_reading in reading.gpus:
            gpu = gpus.get((node.pk, gpu_reading.uuid))
            if gpu is None:
                candidate = by_index.get((node.pk, gpu_reading.index))
                gpu = candidate if candidate is not None and not candidate.uuid else None
            if gpu is None:
                why = _("Node %(node)s has no GPU %(uuid)s (index %(index)s) in the portal's inventory.") % {
                    "node": node.name,
                    "uuid": gpu_reading.uuid or "?",
                    "index": gpu_reading.index,
                }
                _refuse_or_note(why, strict=strict, problems=problems)
                continue
            if (gpu.pk, at) in seen:
                _refuse_or_note(
                    _("GPU %(uuid)s appears twice at %(at)s.") % {"uuid": gpu_reading.uuid, "at": at},
                    strict=strict,
                    problems=problems,
                )
                continue
            seen.add((gpu.pk, at))
            targets.append(_Target(gpu, gpu_reading, reading.host, at, complete=strict))
    return targets


def _refuse_or_note(why: str, *, strict: bool, problems: list[str]) -> None:
    if strict:
        raise InvalidInput(why)
    problems.append(why)


# --- rows --------------------------------------------------------------------------------------------


def _rows(target: _Target, problems: list[str]) -> tuple[list[samples.Row], list[dict]]:
    g = target.reading
    rows = [
        samples.Row(
            target.gpu.pk,
            WHOLE_GPU,
            target.at,
            power_w=g.power_w,
            temperature_c=g.temperature_c,
            utilisation_pct=g.utilisation_pct,
            sm_active_pct=g.sm_active_pct,
            memory_used_bytes=g.memory_used_bytes,
            memory_total_bytes=g.memory_total_bytes,
            ecc_corrected=g.ecc_corrected,
            ecc_uncorrected=g.ecc_uncorrected,
        )
    ]
    latest = [_latest(rows[0], host=target.host, problems=list(g.problems))]
    starts = {entry["start"]: entry for entry in target.gpu.layout or []}
    by_uuid = {entry.get("uuid"): entry["start"] for entry in target.gpu.layout or [] if entry.get("uuid")}
    for instance in g.instances:
        start = instance.placement[0] if instance.placement else by_uuid.get(instance.uuid)
        if start is None:
            problems.append(
                _("Instance %(uuid)s of GPU %(gpu)s: no placement, so its pool cannot be told.")
                % {"uuid": instance.uuid or instance.gpu_instance_id, "gpu": target.gpu}
            )
            continue
        row = samples.Row(
            target.gpu.pk,
            start,
            target.at,
            sm_active_pct=instance.sm_active_pct,
            memory_used_bytes=instance.memory_used_bytes,
            memory_total_bytes=instance.memory_total_bytes,
        )
        rows.append(row)
        profile = instance.profile or starts.get(start, {}).get("profile", "")
        latest.append(
            _latest(
                row,
                host=target.host,
                problems=list(instance.problems),
                profile=profile,
                instance_uuid=instance.uuid,
            )
        )
    return rows, latest


def _latest(row: samples.Row, *, host: str, problems: list[str], profile: str = "", instance_uuid=""):
    return {
        **{column: getattr(row, column) for column in samples.COLUMNS},
        "host": host,
        "problems": problems,
        "profile": profile,
        "instance_uuid": instance_uuid or "",
    }


_LATEST_COLUMNS = (*samples.COLUMNS, "host", "profile", "instance_uuid", "problems")
_LATEST_TYPES = (*samples.TYPES, "text", "text", "text", "text")


def _store_latest(latest: list[dict], *, source: str) -> None:
    """Upsert the newest figures in one statement; a row older than what is there already changes nothing."""
    if not latest:
        return
    # One statement may not upsert a row twice: of a slot read at several instants (an agent's buffered
    # batch), only the newest reading counts.
    newest: dict[tuple[int, int], dict] = {}
    for entry in latest:
        key = (entry["gpu_id"], entry["slot"])
        if key not in newest or newest[key]["at"] <= entry["at"]:
            newest[key] = entry
    latest = list(newest.values())
    names = ", ".join(_LATEST_COLUMNS)
    values = ", ".join(f"{c}::jsonb" if c == "problems" else c for c in _LATEST_COLUMNS)
    arrays = ", ".join(f"%s::{kind}[]" for kind in _LATEST_TYPES)
    updates = ", ".join(f"{c} = EXCLUDED.{c}" for c in (*_LATEST_COLUMNS[2:], "source"))
    columns = [
        [json.dumps(entry[c]) if c == "problems" else entry[c] for entry in latest] for c in _LATEST_COLUMNS
    ]
    with connection.cursor() as cursor:
        cursor.execute(
            f"INSERT INTO monitoring_latest ({names}, source) SELECT {values}, %s "
            f"FROM unnest({arrays}) AS t({names}) "
            f"ON CONFLICT (gpu_id, slot) DO UPDATE SET {updates} WHERE monitoring_latest.at <= EXCLUDED.at",
            [source, *columns],
        )


def _bind_instances(targets: list[_Target]) -> None:
    """Bind the instance UUIDs hosts report to the allocations holding those instances, where they
    differ from what the allocations say (seldom: after a MIG change)."""
    reported = {
        (t.gpu.pk, i.placement[0]): i.uuid
        for t in targets
        for i in t.reading.instances
        if i.placement and i.uuid
    }
    if not reported:
        return
    live = Allocation.objects.filter(gpu_id__in={gpu for gpu, _ in reported}, released_at__isnull=True)
    stale = {
        gpu_id
        for gpu_id, slices, uuid in live.values_list("gpu_id", "slices", "instance_uuid")
        if reported.get((gpu_id, slices.lower), uuid) != uuid
    }
    for target in targets:
        if target.gpu.pk in stale:
            uuids = {s: u for (gpu, s), u in reported.items() if gpu == target.gpu.pk}
            capacity.bind_instance_uuids(gpu=target.gpu, uuids=uuids)


# --- events ------------------------------------------------------------------------------------------


def _previous_counts(gpu_ids: list[int]) -> dict[int, int | None]:
    """The uncorrected ECC count each GPU last reported, read before this batch changes it."""
    return dict(
        Latest.objects.filter(gpu_id__in=gpu_ids, slot=WHOLE_GPU).values_list("gpu_id", "ecc_uncorrected")
    )


def _events(
    targets: list[_Target],
    previous: dict[int, int | None],
    readings: Sequence[Reading],
    cluster: Cluster,
    source: str,
) -> list[GpuEvent]:
    events = []
    mismatches = {t.gpu.pk: _layout_mismatch(t.gpu, t.reading) for t in targets}
    with_mismatch = [gpu for gpu, mismatch in mismatches.items() if mismatch]
    last_layout = _last_of_kind(with_mismatch, GpuEvent.Kind.LAYOUT, "detail") if with_mismatch else {}
    # dcgm-exporter's XID figure is the last XID until the driver reloads: the same one again is no news.
    with_xids = [t.gpu.pk for t in targets if t.reading.xid_events]
    gauge = source in LAST_XID_SOURCES and with_xids
    last_xid = _last_of_kind(with_xids, GpuEvent.Kind.XID, "code") if gauge else {}
    for target in targets:
        g, gpu = target.reading, target.gpu
        for xid in g.xid_events:
            if last_xid.get(gpu.pk) == xid:
                continue
            detail = _("fatal: the GPU takes no new work") if xid in FAULT_XIDS else ""
            events.append(GpuEvent(gpu=gpu, at=target.at, kind=GpuEvent.Kind.XID, code=xid, detail=detail))
        before = previous.get(gpu.pk)
        # The count is since the driver loaded: a lower figure than before is a reload, not a repair.
        if g.ecc_uncorrected and g.ecc_uncorrected > (before or 0):
            events.append(GpuEvent(gpu=gpu, at=target.at, kind=GpuEvent.Kind.ECC, code=g.ecc_uncorrected))
        mismatch = mismatches[gpu.pk]
        if mismatch and mismatch != last_layout.get(gpu.pk):
            events.append(GpuEvent(gpu=gpu, at=target.at, kind=GpuEvent.Kind.LAYOUT, detail=mismatch))
    events += _lost(targets, readings, cluster)
    return events


def _last_of_kind(gpu_ids: list[int], kind: str, field: str) -> dict:
    """`field` of each GPU's newest event of `kind` (its last layout complaint, its last XID), so that the
    same one is not recorded again at every reading."""
    newest = (
        GpuEvent.objects.filter(gpu_id__in=gpu_ids, kind=kind).order_by("gpu_id", "-at").distinct("gpu_id")
    )
    return {event.gpu_id: getattr(event, field) for event in newest}


def _layout_mismatch(gpu: GpuCapacity, reading: GpuReading) -> str:
    """What differs between the layout the host reports and the one the portal knows, or ""."""
    if gpu.planned_layout is not None:
        return ""  # a change is under way: the portal itself expects the layout to move
    if reading.mig_enabled is not None and reading.mig_enabled != gpu.mig_enabled:
        return _("MIG is %(seen)s on the host, %(expected)s in the portal.") % {
            "seen": _("on") if reading.mig_enabled else _("off"),
            "expected": _("on") if gpu.mig_enabled else _("off"),
        }
    if not gpu.mig_enabled or not reading.instances:
        return ""
    seen = sorted((i.placement[0], i.profile) for i in reading.instances if i.placement and i.profile)
    if len(seen) < len(reading.instances):
        return ""  # the host could not say where every instance lies: nothing to compare
    expected = sorted((entry["start"], entry["profile"]) for entry in gpu.layout or [])
    if seen == expected:
        return ""
    return _("The host has %(seen)s; the portal expects %(expected)s.") % {
        "seen": ", ".join(f"{p}@{s}" for s, p in seen) or "—",
        "expected": ", ".join(f"{p}@{s}" for s, p in expected) or "—",
    }


def _lost(targets: list[_Target], readings: Sequence[Reading], cluster: Cluster) -> list[GpuEvent]:
    """GPUs of a fully reported host that the host no longer reports, once: each GPU reported since it
    was last found missing."""
    complete = {t.host for t in targets if t.complete}
    if not complete:
        return []
    reported = {t.gpu.pk for t in targets}
    at = {reading.host: reading.at for reading in readings}
    missing = GpuCapacity.objects.filter(
        node__cluster=cluster, node__name__in=complete, present=True
    ).exclude(pk__in=reported)
    if not missing.exists():
        return []
    missing = missing.annotate(
        seen=Max("latest_figures__at", filter=Q(latest_figures__slot=WHOLE_GPU)),
        lost=Max("events__at", filter=Q(events__kind=GpuEvent.Kind.LOST)),
    )
    return [
        GpuEvent(
            gpu=gpu, at=at[gpu.node.name], kind=GpuEvent.Kind.LOST, detail=_("not in the host's reading")
        )
        for gpu in missing.select_related("node")
        if gpu.lost is None or (gpu.seen is not None and gpu.seen > gpu.lost)
    ]
