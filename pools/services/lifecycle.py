"""A pool's life after admission: extensions and growth asked for, instances given back, reminders of the
end, and the release at the end.

- An extension (`request_extension`) and a growth (`request_growth`) are pool requests of their own kind,
  naming the pool; approvers decide them as any request (pools/services/requests.py), a growth is placed by
  the queue in the pool's cluster and group and joins the pool (pools/services/queue.py: `_grow`).
- A shrink (`shrink_pool`) gives back chosen allocations, or the portal's choice of them: the namespace's
  quota is lowered first, through the driver, then the instances are freed in one transaction; each
  allocation is billed until its own release.
- The sweeper (pools/services/deadlines.py) sends the reminders (`send_reminders`, at POOL_END_REMINDERS
  before the end, each once per end) and releases every pool whose end has come (`release_ended`),
  billing stopping exactly at the end however late the sweep runs.
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Sequence
from datetime import datetime, timedelta

from django.db import transaction
from django.db.models import Count
from django.utils import timezone
from django.utils.translation import gettext as _
from django.utils.translation import gettext_noop

from pools import task_names
from pools.drivers.base import ClusterUnreachable, DriverError, driver_for
from pools.models import (
    IN_USE_STATES,
    Allocation,
    Pool,
    PoolEvent,
    PoolRequest,
    PoolState,
    RequestKind,
)
from pools.notifications import END_REMINDER
from pools.placement import Item
from pools.placement.admission import BEYOND_LIMIT, BORROWED
from pools.placement.reasons import Reason
from pools.selectors import capacity_picture, render_reason
from pools.selectors.ends import reminder_leads
from pools.selectors.quotas import ledger
from pools.services.binding import bind_pool
from pools.services.ends import check_end, when
from pools.services.provisioning import release_locked
from pools.services.requests import (
    Judged,
    _check_items,
    _file,
    _judged,
    approve_by_policy,
    asked_or_administers,
)
from pools.services.reservations import lock_capacity, recount_allocated, release_allocations, take_items
from pools.services.transitions import record_event
from pools.specs import UnknownSpec, parse_spec
from portal import dispatch
from portal.errors import Conflict, InvalidInput, NotAllowed

log = logging.getLogger(__name__)

ENDED = gettext_noop("its end date came: released")
SHRUNK = gettext_noop("gave back %(items)s")


def _pool_for_change(pool_id: int, user, *, states: Sequence[str], refusal: str) -> Pool:
    """The pool a member changes, locked: who asked for it or an admin of its tenant, in one of `states`."""
    pool = (
        Pool.objects.select_for_update(of=("self",))
        .select_related("request__project__tenant", "project", "cluster")
        .filter(pk=pool_id)
        .first()
    )
    if pool is None:
        raise InvalidInput(_("Pool #%(id)s does not exist.") % {"id": pool_id})
    if not asked_or_administers(user, pool.request):
        raise NotAllowed(_("Only who asked for the pool, or an admin of the tenant, can change it."))
    if pool.state not in states:
        raise Conflict(refusal % {"id": pool.pk, "state": PoolState(pool.state).label})
    return pool


def request_extension(*, pool_id: int, user, end_at: datetime, justification: str = "") -> PoolRequest:
    """Ask for the pool's end to move to `end_at`: an extension request that approvers decide; the end stays
    as it is until one approves it."""
    if len(justification) > 4000:
        raise InvalidInput(_("The justification has at most 4000 characters."))
    with transaction.atomic():
        pool = _pool_for_change(
            pool_id,
            user,
            states=IN_USE_STATES,
            refusal=_("Pool #%(id)s is %(state)s; only a pool in use can be extended."),
        )
        now = timezone.now()
        if pool.end_at is None:
            raise Conflict(_("Pool #%(id)s has no end date; it lives until released.") % {"id": pool.pk})
        if pool.end_at <= now:
            raise Conflict(_("Pool #%(id)s has ended; it can no longer be extended.") % {"id": pool.pk})
        if not isinstance(end_at, datetime) or end_at <= pool.end_at:
            raise InvalidInput(
                _("An extension ends after the pool's present end (%(end)s).") % {"end": when(pool.end_at)}
            )
        check_end(pool.project.tenant_id, end_at=end_at, hold_seconds=None, now=now)
        items = [Item(i.gpu_model, i.profile, i.count) for i in pool.items.all()]
        judged = _extension_verdict(pool)
        return _file_change(pool, RequestKind.EXTENSION, items, judged, user, justification, end_at=end_at)


def _extension_verdict(pool: Pool) -> Judged:
    """An extension asks for nothing more than the pool holds: within the guarantee, unless the pool is
    borrowed (then it stays borrowed longer, and an approver decides)."""
    books, holdings = ledger([pool.project.tenant_id])
    verdict = books.verdict(pool.project.tenant_id, pool.project_id, {})
    borrowed = pool.pk in books.borrowed_pools(holdings)
    return Judged(BORROWED if borrowed else verdict.kind, books.in_force, verdict)


def request_growth(
    *, pool_id: int, user, items: Sequence[tuple[str, int]], justification: str = ""
) -> PoolRequest:
    """Ask for more instances in a pool, of its specs or new ones: a resize request that approvers decide
    and the queue places in the pool's cluster and GPU group; it joins the pool and its namespace."""
    if len(justification) > 4000:
        raise InvalidInput(_("The justification has at most 4000 characters."))
    picture = capacity_picture()
    with transaction.atomic():
        pool = _pool_for_change(
            pool_id,
            user,
            states=(PoolState.ACTIVE,),
            refusal=_("Pool #%(id)s is %(state)s; only an active pool can grow."),
        )
        if pool.end_at is not None and pool.end_at <= timezone.now():
            raise Conflict(_("Pool #%(id)s has ended; it can no longer grow.") % {"id": pool.pk})
        original = pool.request
        checked = _check_items(items, pool.cluster, original.purpose, picture)
        asked = [Item(spec.gpu_model, spec.profile, count) for spec, count in checked]
        judged = _judged(pool.project, asked, original.purpose)
        if judged.kind == BEYOND_LIMIT:
            raise InvalidInput(
                _("This growth goes beyond a quota: %(why)s.")
                % {"why": render_reason(judged.refusal(pool.project).as_data())}
            )
        return _file_change(pool, RequestKind.RESIZE, asked, judged, user, justification)


def _file_change(
    pool: Pool, kind: str, items: list[Item], judged: Judged, user, justification: str, **fields
) -> PoolRequest:
    """A change of `pool` asked for by `user`: a request of `kind` for `items` in the pool's cluster, with its
    purpose and priority, approved at once where the tenant's policy approves it; in the caller's
    transaction."""
    original = pool.request
    request = _file(
        pool.project,
        items,
        judged,
        actor=user,
        kind=kind,
        target_pool=pool,
        cluster=pool.cluster,
        purpose=original.purpose,
        justification=justification,
        submitted_by=user,
        priority=original.priority,
        **fields,
    )
    approve_by_policy(request, judged)
    return request


def _chosen(pool: Pool, live: list[Allocation], release: Sequence[tuple[str, int]]) -> list[Allocation]:
    """The portal's choice of `count` live allocations per spec: those on GPUs this release frees whole
    first (no other pool there, fewest of this pool's left behind), then the rest, in a stable order."""
    others = dict(
        Allocation.objects.filter(gpu_id__in={a.gpu_id for a in live}, released_at__isnull=True)
        .exclude(pool=pool)
        .values_list("gpu_id")
        .annotate(n=Count("id"))
    )
    mine = Counter(a.gpu_id for a in live)
    chosen: list[Allocation] = []
    for spec_id, count in release:
        try:
            spec = parse_spec(spec_id)
        except UnknownSpec as error:
            raise InvalidInput(str(error)) from None
        if not isinstance(count, int) or isinstance(count, bool) or count <= 0:
            raise InvalidInput(
                _("The count of %(spec)s must be a whole number above zero.") % {"spec": spec.id}
            )
        candidates = [
            a for a in live if a.gpu.model == spec.gpu_model and a.profile == spec.profile and a not in chosen
        ]
        if len(candidates) < count:
            raise InvalidInput(
                _("Pool #%(id)s holds %(held)s × %(spec)s; it cannot give back %(count)s.")
                % {"id": pool.pk, "held": len(candidates), "spec": spec.id, "count": count}
            )
        candidates.sort(key=lambda a: (others.get(a.gpu_id, 0), mine[a.gpu_id], a.gpu_id, a.slices.lower))
        chosen += candidates[:count]
    return chosen


def shrink_pool(
    *,
    pool_id: int,
    user,
    allocation_ids: Sequence[int] | None = None,
    release: Sequence[tuple[str, int]] | None = None,
) -> Pool:
    """Give back some of an active pool's instances: those named (`allocation_ids`), or the portal's choice
    of `release` (spec id, count) that frees whole GPUs first. The namespace's quota is lowered first: a
    cluster that refuses it leaves everything as it was. Then the instances are freed at once, billed until
    that moment, and the queue runs. Giving back every instance is a release, not a shrink."""
    if (allocation_ids is None) == (release is None):
        raise InvalidInput(_("Name the allocations to give back, or the specs and counts, not both."))
    with transaction.atomic():
        pool = _pool_for_change(
            pool_id,
            user,
            states=(PoolState.ACTIVE,),
            refusal=_("Pool #%(id)s is %(state)s; only an active pool can shrink."),
        )
        live = list(
            Allocation.objects.filter(pool=pool, released_at__isnull=True)
            .select_related("gpu")
            .order_by("pk")
        )
        if allocation_ids is not None:
            wanted = _ids(allocation_ids)
            by_id = {a.pk: a for a in live}
            unknown = sorted(set(wanted) - set(by_id))
            if unknown:
                raise InvalidInput(
                    _("Pool #%(id)s holds no live allocation %(ids)s.")
                    % {"id": pool.pk, "ids": ", ".join(f"#{n}" for n in unknown)}
                )
            chosen = [by_id[n] for n in wanted]
        else:
            chosen = _chosen(pool, live, release)
        if not chosen:
            raise InvalidInput(_("Name at least one allocation to give back."))
        if len(chosen) == len(live):
            raise InvalidInput(_("That is every instance of the pool: release the pool instead."))
        try:  # the namespace lets go of them first: then they are free for the next pool
            bind_pool(pool, driver_for(pool.cluster), without=[a.pk for a in chosen])
        except (ClusterUnreachable, DriverError) as error:
            raise Conflict(
                _("The cluster did not let go of them (%(error)s); nothing was given back.")
                % {"error": error}
            ) from None
        _free_chosen(pool, chosen, actor=user)
    return pool


def _ids(values) -> list[int]:
    if not isinstance(values, list | tuple) or not all(
        isinstance(v, int) and not isinstance(v, bool) for v in values
    ):
        raise InvalidInput(_("release_allocations is a list of allocation ids."))
    return list(dict.fromkeys(values))


def _free_chosen(pool: Pool, chosen: list[Allocation], *, actor) -> None:
    """Free the chosen allocations now, shrink the pool's items, record it; the queue runs after commit."""
    lock_capacity()
    recount_allocated(
        release_allocations(Allocation.objects.filter(pk__in=[a.pk for a in chosen]), timezone.now())
    )
    given = Counter((a.gpu.model, a.profile) for a in chosen)
    take_items(pool, given)
    reason = Reason(
        SHRUNK,
        items=", ".join(f"{n} × {model} {profile}" for (model, profile), n in sorted(given.items())),
    )
    record_event(
        tenant_id=pool.project.tenant_id,
        action="pool.shrunk",
        request_id=pool.request_id,
        pool=pool,
        actor=actor,
        from_state=pool.state,
        to_state=pool.state,
        reason=str(reason),
        reason_data=reason.as_data(),
    )
    dispatch.after_commit(task_names.ADMIT)


def release_ended(*, now: datetime | None = None) -> list[int]:
    """Release every pool in use whose end has come, billing stopping at its `end_at` however late this runs
    (the workers were down); returns the pools released. Safe to run twice at once: the second finds them
    released, or locked and being released."""
    now = now or timezone.now()
    with transaction.atomic():
        due = list(
            Pool.objects.select_for_update(skip_locked=True)
            .select_related("project")
            .filter(state__in=[PoolState.PROVISIONING, *IN_USE_STATES], end_at__lte=now)
            .order_by("end_at", "pk")
        )
        for pool in due:
            release_locked(pool, at=pool.end_at, reason=Reason(ENDED))
    return [pool.pk for pool in due]


def send_reminders(*, now: datetime | None = None) -> list[int]:
    """Remind the people of each pool in use whose end is near: one event (and its e-mail) per lead time
    of POOL_END_REMINDERS that has come, each once per end (an extension starts them again); where several
    came at once (a young pool, or the sweeper was down), only the nearest. Returns the pools reminded."""
    now = now or timezone.now()
    leads = reminder_leads()
    if not leads:
        return []
    reminded = []
    with transaction.atomic():
        due = (
            Pool.objects.select_for_update(skip_locked=True)
            .select_related("project")
            .filter(state__in=IN_USE_STATES, end_at__gt=now, end_at__lte=now + timedelta(seconds=leads[0]))
        )
        for pool in due:
            came = [lead for lead in leads if pool.end_at - timedelta(seconds=lead) <= now]
            if not came or came[-1] in pool.reminders_sent:
                continue
            pool.reminders_sent = sorted({*pool.reminders_sent, *came}, reverse=True)
            pool.save(update_fields=["reminders_sent"])
            _remind(pool)
            reminded.append(pool.pk)
    return reminded


def _remind(pool: Pool) -> PoolEvent:
    reason = Reason(END_REMINDER, at=when(pool.end_at))
    event = record_event(
        tenant_id=pool.project.tenant_id,
        action="pool.end_reminder",
        request_id=pool.request_id,
        pool=pool,
        from_state=pool.state,
        to_state=pool.state,
        reason=str(reason),
        reason_data=reason.as_data(),
    )
    dispatch.after_commit(task_names.EVENT_EMAIL, event.pk)
    return event


__all__ = [
    "release_ended",
    "request_extension",
    "request_growth",
    "send_reminders",
    "shrink_pool",
]
