"""The events a batch's readings show: XID errors (once each, for a source whose figure is the last XID
seen), a rise of the uncorrected ECC count, a MIG layout other than the one the portal knows (once until it
changes), and a GPU gone from a fully reported host (once, until it is reported again).
"""

from __future__ import annotations

from collections.abc import Sequence

from django.db.models import Max, Q
from django.utils.translation import gettext as _

from monitoring.collectors import GpuReading, Reading
from monitoring.faults import services as faults
from monitoring.ingest.hosts import Gpu, Hosts, Target
from monitoring.models import GpuEvent
from monitoring.models.samples import WHOLE_GPU
from pools.models import GpuCapacity

FAULT_XIDS = faults.FAULT_XIDS  # the fatal XIDs, defined with the rules that act on them
# Sources whose XID figure is the last XID seen (a gauge), not the XIDs since the previous reading.
LAST_XID_SOURCES = frozenset({"dcgm"})


def shown(targets: list[Target], found: Hosts, readings: Sequence[Reading], source: str) -> list[GpuEvent]:
    """The events `targets` (the batch's GPU readings) show that are not recorded yet, unsaved; `found`, the
    reporting hosts' GPUs, tells which of them a fully reported host left out."""
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
            events.append(
                GpuEvent(gpu_id=gpu.pk, at=target.at, kind=GpuEvent.Kind.XID, code=xid, detail=detail)
            )
        # The count is since the driver loaded: a lower figure than before is a reload, not a repair.
        if g.ecc_uncorrected and g.ecc_uncorrected > (gpu.ecc_before or 0):
            events.append(
                GpuEvent(gpu_id=gpu.pk, at=target.at, kind=GpuEvent.Kind.ECC, code=g.ecc_uncorrected)
            )
        mismatch = mismatches[gpu.pk]
        if mismatch and mismatch != last_layout.get(gpu.pk):
            events.append(GpuEvent(gpu_id=gpu.pk, at=target.at, kind=GpuEvent.Kind.LAYOUT, detail=mismatch))
    events += _lost(targets, found, readings)
    return events


def _last_of_kind(gpu_ids: list[int], kind: str, field: str) -> dict:
    """`field` of each GPU's newest event of `kind` (its last layout complaint, its last XID), so that the
    same one is not recorded again at every reading."""
    newest = (
        GpuEvent.objects.filter(gpu_id__in=gpu_ids, kind=kind).order_by("gpu_id", "-at").distinct("gpu_id")
    )
    return {event.gpu_id: getattr(event, field) for event in newest}


def _layout_mismatch(gpu: Gpu, reading: GpuReading) -> str:
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


def _lost(targets: list[Target], found: Hosts, readings: Sequence[Reading]) -> list[GpuEvent]:
    """GPUs of a fully reported host that the host no longer reports, once: each GPU reported since it
    was last found missing."""
    complete = {found.nodes[t.host] for t in targets if t.complete}
    if not complete:
        return []
    reported = {t.gpu.pk for t in targets}
    missing = [gpu.pk for gpu in found.gpus if gpu.node_id in complete and gpu.pk not in reported]
    if not missing:
        return []
    at = {reading.host: reading.at for reading in readings}
    missing = GpuCapacity.objects.filter(pk__in=missing).annotate(
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
