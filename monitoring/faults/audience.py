"""Who hears of a GPU fault, and the fault in words.

- The people of each pool the fault flagged — who asked for it and the tenant's admins — hear of their own
  pools, with a link to each.
- The approvers hear of every flagged pool, with the faults page where they re-place them. A person who is
  both hears as an approver: of every pool.
Each only while they keep the topic FAULT_EMAIL_TOPIC on. A fault that flagged no pool has no audience here:
the operators hear of it through its alert.
"""

from __future__ import annotations

from dataclasses import dataclass

from django.utils.translation import gettext as _

from monitoring.apps import FAULT_EMAIL_TOPIC
from monitoring.models import FaultNotice, GpuEvent, GpuFault
from portal import permissions
from portal.models import Preferences
from portal.roles import PlatformRole


@dataclass(frozen=True)
class Told:
    """What one person hears of a fault: as an approver or not, and of which flagged pools (ids)."""

    approver: bool
    pools: list[int]


def audience(fault: GpuFault) -> dict[str, Told]:
    """Everyone to tell of `fault`, by e-mail address, in the order found: the pools' people, then the
    approvers."""
    notices = FaultNotice.objects.filter(fault=fault).select_related(
        "pool__project", "pool__request__submitted_by"
    )
    pools = sorted((notice.pool for notice in notices), key=lambda pool: pool.pk)
    if not pools:
        return {}
    wanted: dict[int, bool] = {}

    def wants(user) -> bool:
        if user.pk not in wanted:
            wanted[user.pk] = Preferences.wants_email(user, FAULT_EMAIL_TOPIC)
        return wanted[user.pk]

    told: dict[str, Told] = {}
    for pool in pools:
        people = {
            u.pk: u for u in permissions.tenant_admins(tenant_id=pool.project.tenant_id).exclude(email="")
        }
        asker = pool.request.submitted_by
        if asker.is_active and asker.email:
            people[asker.pk] = asker
        for user in sorted(people.values(), key=lambda u: u.pk):
            if wants(user):
                told.setdefault(user.email, Told(approver=False, pools=[])).pools.append(pool.pk)
    every = [pool.pk for pool in pools]
    for user in permissions.platform_staff(role=PlatformRole.APPROVER).exclude(email=""):
        if wants(user):
            told[user.email] = Told(approver=True, pools=every)
    return told


def describe(fault: GpuFault) -> str:
    """The fault in words."""
    if fault.kind == GpuEvent.Kind.ECC:
        return _("uncorrected ECC errors (count %(count)s)") % {"count": fault.code}
    if fault.kind == GpuEvent.Kind.XID:
        return _("XID %(xid)s") % {"xid": fault.code}
    return _("the GPU is gone from its node's reading")
