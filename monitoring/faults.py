"""GPU faults: a fatal GPU event drains the GPU, flags the pools on it, tells their people and the approvers.

Rules.
- A fault is an uncorrected ECC error (an `ecc` event: the count rose), an XID of FAULT_XIDS, or a GPU gone
  from its host's reading (`lost`). Other XIDs and layout complaints are only events.
- The first fault event of a GPU opens a GpuFault and drains the GPU through the pools service
  (`set_gpu_drained`): nothing new is placed there, what runs there stays. While the fault is open, further
  events of the GPU change nothing (the GPU row's lock and a partial unique constraint keep it to one).
- Opening it flags every pool holding live capacity on the GPU (a FaultNotice each). Their people — who
  asked for the pool and the tenant's admins — and the approvers are e-mailed about each (fault, pool) once,
  unless they turned the topic FAULT_EMAIL_TOPIC off. Approvers may then re-place the pools
  (`pools.services.replacement`), when there is room.
- An operator clears the fault after repair (`clear_fault`): the GPU is undrained if the fault drained it,
  and a later fatal event opens a new fault.

`handle` runs inside ingest's transaction, so a fault is stored with the events that show it, or not at
all; the e-mails leave after commit, from a Celery task (`send_notices`).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass

from django.conf import settings
from django.contrib.auth import get_user_model
from django.core.mail import EmailMessage
from django.db import transaction
from django.template.loader import render_to_string
from django.urls import reverse
from django.utils import timezone, translation
from django.utils.translation import gettext as _

from monitoring.apps import FAULT_EMAIL_TOPIC
from monitoring.models import FaultNotice, GpuEvent, GpuFault
from pools.models import Allocation, GpuCapacity, Pool
from pools.selectors import LIVE_POOL_STATES
from pools.services import capacity, dispatch
from pools.services.replacement import Replaceability, replaceable_pools
from portal import mail
from portal.errors import Conflict, NotAllowed
from portal.models import Preferences, Role
from portal.permissions import staff_may
from portal.roles import PlatformRole

log = logging.getLogger(__name__)

# XIDs after which a GPU is not to be trusted with new work (double-bit ECC, row-remap failure, fallen off
# the bus, uncontained ECC, GSP errors, unrecovered ECC).
FAULT_XIDS = frozenset({48, 64, 79, 95, 119, 120, 140})
NOTICES_TASK = "monitoring.tasks.send_fault_notices"
# Who sees the faults and re-places pools; who clears faults (operators run capacity and drains).
APPROVER_PERMISSION = "pools.approve_poolrequest"
OPERATOR_PERMISSION = "pools.change_gpucapacity"
SENT, ALREADY_SENT, NOBODY = "sent", "already sent", "nobody to send to"


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
        fault = GpuFault.objects.create(
            gpu=gpu,
            event=event,
            kind=event.kind,
            code=event.code,
            detail=event.detail,
            at=event.at,
            drained_by_portal=not drained_before,
        )
        pools = _pools_on(gpu.pk)
        FaultNotice.objects.bulk_create(FaultNotice(fault=fault, pool_id=pk, flagged_at=now) for pk in pools)
        if pools:
            dispatch.after_commit(NOTICES_TASK, fault.pk)
    log.warning("GPU %s is faulty (%s %s): drained; pools flagged: %s", gpu.pk, event.kind, event.code, pools)
    return fault


def _pools_on(gpu_id: int) -> list[int]:
    """Pools holding live capacity on the GPU."""
    return sorted(
        set(
            Allocation.objects.filter(
                gpu_id=gpu_id, released_at__isnull=True, pool__state__in=LIVE_POOL_STATES
            ).values_list("pool_id", flat=True)
        )
    )


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


# --- e-mails -----------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Recipients:
    tenant: list[str]
    approvers: list[str]


def recipients(pool: Pool) -> Recipients:
    """Who asked for the pool and the tenant's admins; the approvers; each only if they want the topic."""
    users = get_user_model().objects.filter(is_active=True).exclude(email="")
    tenant = users.filter(memberships__tenant_id=pool.project.tenant_id, memberships__role=Role.ADMIN)
    people = {u.pk: u for u in tenant}
    asker = pool.request.submitted_by
    if asker.is_active and asker.email:
        people[asker.pk] = asker
    approvers = users.filter(is_staff=True, groups__name=PlatformRole.APPROVER).distinct()

    def wanted(found) -> list[str]:
        return sorted({u.email for u in found if Preferences.wants_email(u, FAULT_EMAIL_TOPIC)})

    return Recipients(wanted(people.values()), wanted(approvers))


def send_notices(fault_id: int) -> str:
    """E-mail about each pool the fault flagged, unless done already (safe to run twice, or twice at once)."""
    pending = FaultNotice.objects.filter(fault_id=fault_id, sent_at__isnull=True).values_list("pk", flat=True)
    outcomes = [_send_notice(pk) for pk in list(pending)]
    return ", ".join(outcomes) or ALREADY_SENT


def _send_notice(notice_id: int) -> str:
    with transaction.atomic():
        notice = (
            FaultNotice.objects.select_for_update(of=("self",))
            .select_related(
                "fault__gpu__node__cluster", "pool__project__tenant", "pool__request__submitted_by"
            )
            .get(pk=notice_id)
        )
        if notice.sent_at is not None:
            return ALREADY_SENT
        pool, fault = notice.pool, notice.fault
        to = recipients(pool)
        tenant = pool.project.tenant
        context = {
            "fault": fault,
            "gpu": fault.gpu,
            "pool": pool,
            "tenant": tenant,
            "project": pool.project,
            "pool_link": settings.PORTAL_BASE_URL
            + reverse("pool", kwargs={"tenant_slug": tenant.slug, "pk": pool.pk}),
            "faults_link": settings.PORTAL_BASE_URL + reverse("monitoring-faults"),
        }
        for audience, addresses in (("tenant", to.tenant), ("approvers", to.approvers)):
            for language, group in mail.by_language(addresses).items():
                with translation.override(language):
                    _send(f"fault_{audience}", {**context, "what": describe(fault)}, group)
        notice.recipients = ", ".join([*to.tenant, *to.approvers])
        notice.sent_at = timezone.now()
        notice.save(update_fields=["recipients", "sent_at"])
    return SENT if notice.recipients else NOBODY


def _send(template: str, context: dict, to: list[str]) -> None:
    subject = render_to_string(f"monitoring/email/{template}_subject.txt", context).strip()
    body = render_to_string(f"monitoring/email/{template}_message.txt", context)
    EmailMessage(settings.EMAIL_SUBJECT_PREFIX + subject, body, to=to).send()


def describe(fault: GpuFault) -> str:
    """The fault in words."""
    if fault.kind == GpuEvent.Kind.ECC:
        return _("uncorrected ECC errors (count %(count)s)") % {"count": fault.code}
    if fault.kind == GpuEvent.Kind.XID:
        return _("XID %(xid)s") % {"xid": fault.code}
    return _("the GPU is gone from its node's reading")


# --- reading, for pages ------------------------------------------------------------------------------


@dataclass(frozen=True)
class AffectedPool:
    pool: Pool
    on_gpu: bool  # still holds capacity on the faulty GPU (else: flagged, and still short of instances)
    verdict: Replaceability


@dataclass(frozen=True)
class OpenFault:
    fault: GpuFault
    pools: list[AffectedPool]


def open_faults(found: Sequence[GpuFault] | None = None) -> list[OpenFault]:
    """Open faults (`found`, a page of them, or all), newest first, each with the pools that still need
    re-placing because of it and whether that fits now (the same assessment re-placing acts on); a constant
    number of queries."""
    if found is None:
        found = list(GpuFault.objects.open().select_related("gpu__node__cluster", "cleared_by"))
    on_gpu: dict[int, set[int]] = {}
    for gpu_id, pool_id in Allocation.objects.filter(
        gpu_id__in=[f.gpu_id for f in found], released_at__isnull=True, pool__state__in=LIVE_POOL_STATES
    ).values_list("gpu_id", "pool_id"):
        on_gpu.setdefault(gpu_id, set()).add(pool_id)
    flagged: dict[int, set[int]] = {}
    for fault_id, pool_id in FaultNotice.objects.filter(fault__in=found).values_list("fault_id", "pool_id"):
        flagged.setdefault(fault_id, set()).add(pool_id)
    ids = set().union(*on_gpu.values(), *flagged.values())
    pools = {p.pk: p for p in Pool.objects.filter(pk__in=ids).select_related("project__tenant", "cluster")}
    verdicts = replaceable_pools(list(pools.values()))
    listed = []
    for fault in found:
        here = on_gpu.get(fault.gpu_id, set())
        affected = [
            AffectedPool(pools[pk], pk in here, verdicts[pk])
            for pk in sorted(here | flagged.get(fault.pk, set()))
            if pk in pools and (pk in here or verdicts[pk].needed)
        ]
        listed.append(OpenFault(fault, affected))
    return listed


def pool_faults(pool: Pool) -> list[GpuFault]:
    """Open faults of the GPUs that hold the pool's live capacity."""
    return list(
        GpuFault.objects.open()
        .filter(gpu__allocations__pool=pool, gpu__allocations__released_at__isnull=True)
        .select_related("gpu__node")
        .distinct()
    )
