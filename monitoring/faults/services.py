"""GPU faults: a fatal GPU event drains the GPU and flags the pools on it; an operator clears it after repair.

Rules.
- A fault is an uncorrected ECC error (an `ecc` event: the count rose), an XID of FAULT_XIDS, or a GPU gone
  from its host's reading (`lost`). Other XIDs and layout complaints are only events.
- The first fault event of a GPU opens a GpuFault and drains the GPU through the pools service
  (`set_gpu_drained`): nothing new is placed there, what runs there stays. While the fault is open, further
  events of the GPU change nothing (the GPU row's lock and a partial unique constraint keep it to one).
- Opening it flags every pool holding live capacity on the GPU (a FaultNotice each). Who asked for each
  pool, the tenant's admins and the approvers are then told, once each, by the notifications every alert
  goes through (`monitoring.notifications`): the next alert evaluation, sent for at once, records it with
  the alert the same event fires, so that a person hears of the event in one e-mail (faults/audience.py
  says who and in what words). A fault that flags no pool has nobody to tell but the operators, whom its
  alert tells. Approvers may then re-place the pools (`pools.services.replacement`), when there is room.
- An operator clears the fault after repair (`clear_fault`): the GPU is undrained if the fault drained it,
  and a later fatal event opens a new fault.

`handle` runs inside ingest's transaction, so a fault is stored with the events that show it, or not at
all.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

from django.db import transaction
from django.utils import timezone
from django.utils.translation import gettext as _

from monitoring.models import FaultNotice, GpuEvent, GpuFault
from monitoring.task_names import EVALUATE_ALERTS
from pools.models import GpuCapacity
from pools.selectors.monitoring import live_pools_on
from pools.services import capacity
from portal import dispatch
from portal.errors import Conflict, NotAllowed
from portal.permissions import staff_may

log = logging.getLogger(__name__)

# XIDs after which a GPU is not to be trusted with new work (double-bit ECC, row-remap failure, fallen off
# the bus, uncontained ECC, GSP errors, unrecovered ECC).
FAULT_XIDS = frozenset({48, 64, 79, 95, 119, 120, 140})
# Who sees the faults and re-places pools; who clears faults (operators run capacity and drains).
APPROVER_PERMISSION = "pools.approve_poolrequest"
OPERATOR_PERMISSION = "pools.change_gpucapacity"


def is_fault(event: GpuEvent) -> bool:
    if event.kind == GpuEvent.Kind.XID:
        return event.code in FAULT_XIDS
    return event.kind in (GpuEvent.Kind.ECC, GpuEvent.Kind.LOST)


def handle(events: Sequence[GpuEvent]) -> list[GpuFault]:
    """Open a fault for each GPU that `events` (just stored by ingest) show to be faulty, unless one is open;
    returns the faults opened."""
    first: dict[int, GpuEvent] = {}
    for event in sorted(events, key=lambda e: (e.at, e.pk or 0)):
        if is_fault(event):
            first.setdefault(event.gpu_id, event)
    opened = []
    for gpu_id in sorted(first):  # in key order: two batches of one host lock their GPUs alike
        fault = _open(first[gpu_id])
        if fault is not None:
            opened.append(fault)
    return opened


def _open(event: GpuEvent) -> GpuFault | None:
    with transaction.atomic():
        gpu = GpuCapacity.objects.select_for_update().get(pk=event.gpu_id)
        if GpuFault.objects.open().filter(gpu=gpu).exists():
            return None  # already faulty: drained, flagged and told
        drained_before = gpu.drained
        capacity.set_gpu_drained(gpu=gpu, drained=True, fault=f"{event.kind} {event.code}".strip())
        now = timezone.now()
        pools = sorted(live_pools_on([gpu.pk]).get(gpu.pk, ()))
        fault = GpuFault.objects.create(
            gpu=gpu,
            event=event,
            kind=event.kind,
            code=event.code,
            detail=event.detail,
            at=event.at,
            drained_by_portal=not drained_before,
            notified_at=None if pools else now,  # no pool: nobody to tell of it besides its alert's
        )
        FaultNotice.objects.bulk_create(FaultNotice(fault=fault, pool_id=pk, flagged_at=now) for pk in pools)
        if pools:
            dispatch.after_commit(EVALUATE_ALERTS)
    log.warning("GPU %s is faulty (%s %s): drained; pools flagged: %s", gpu.pk, event.kind, event.code, pools)
    return fault


def clear_fault(*, fault: GpuFault, user) -> GpuFault:
    """An operator says the GPU is repaired: the fault closes and the GPU takes work again, unless it was
    drained before the fault (that drain is an operator's to lift)."""
    if not staff_may(user=user, permission=OPERATOR_PERMISSION):
        raise NotAllowed(_("Only operators clear GPU faults."))
    with transaction.atomic():
        fault = GpuFault.objects.select_for_update().select_related("gpu").filter(pk=fault.pk).first()
        if fault is None or fault.cleared_at is not None:
            raise Conflict(_("This fault is cleared already."))
        fault.cleared_at = max(timezone.now(), fault.at)
        fault.cleared_by = user
        fault.save(update_fields=["cleared_at", "cleared_by"])
        if fault.drained_by_portal:
            capacity.set_gpu_drained(gpu=fault.gpu, drained=False, actor=user)
    log.info("GPU fault %s cleared by %s", fault.pk, user)
    return fault
