"""Pool requests from submission to decision: submit, approve, reject, cancel, prioritise.

Each function locks the request, checks the move against REQUEST_TRANSITIONS,
writes a PoolEvent, and refuses anything else with a PortalError (4xx).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime

from django.db import transaction
from django.utils import timezone
from django.utils.translation import gettext as _
from django.utils.translation import gettext_lazy, gettext_noop

from pools import budgets, placement, task_names
from pools.apps import APPROVE
from pools.conf import settings
from pools.models import (
    REQUEST_TRANSITIONS,
    Cluster,
    Pool,
    PoolRequest,
    RequestItem,
    RequestKind,
    RequestState,
)
from pools.placement.admission import BEYOND_LIMIT, WITHIN, QuotaVerdict, asked_slices
from pools.placement.reasons import Reason
from pools.selectors import CapacityPicture, capacity_picture, render_reason
from pools.selectors.quotas import approves_within_guarantee, ledger, quota_owner
from pools.services.budget_checks import budget_override, request_budgets
from pools.services.ends import check_end, extend, set_approved_end
from pools.services.reclaims import call_off
from pools.services.transitions import record_event, transition
from pools.specs import Spec, UnknownSpec, parse_spec
from portal import dispatch
from portal.errors import Conflict, InvalidInput, NotAllowed
from portal.models import Project, namespace_problem
from portal.permissions import made_it_or_administers, require_pool_requester, require_staff_action

MAX_ITEMS = 20
BY_POLICY = gettext_noop("approved by the policy: within the tenant's guarantee")
ASKED_AGAIN = gettext_noop("asked again for the work of pool #%(pool)s, reclaimed: approved as it was before")
CANCELLED = gettext_noop("was cancelled")
REJECTED = gettext_noop("was rejected")
PRIORITY_SET = gettext_noop("priority set to %(p)s")  # an event's reason, translated when shown
TOO_MANY = gettext_lazy(
    "%(count)s × %(spec)s is more than %(where)s could ever hold (%(ceiling)s); it is in: %(places)s."
)
MAX_COUNT = 10_000


def _locked(request_id: int) -> PoolRequest:
    request = PoolRequest.objects.select_for_update().filter(pk=request_id).first()
    if request is None:
        raise InvalidInput(_("Request #%(id)s does not exist.") % {"id": request_id})
    return request


def check_purpose(picture: CapacityPicture, purpose: str, cluster: Cluster | None) -> None:
    """A purpose names a GPU group of the clusters it may land on, when any of them has groups."""
    if len(purpose) > 40:
        raise InvalidInput(_("The purpose has at most 40 characters."))
    candidates = [c for c in picture.clusters if cluster is None or c.pk == cluster.pk]
    groups = picture.groups(candidates)
    if purpose and groups and purpose not in groups:
        where = cluster.name if cluster else _("The portal")
        raise InvalidInput(
            _("%(where)s places work by GPU group; choose a purpose among: %(groups)s.")
            % {"where": where, "groups": ", ".join(sorted(groups))}
        )


def _where_it_exists(picture: CapacityPicture, spec: Spec) -> str:
    """Each cluster (any workload type) and GPU group holding the spec, with the most one request
    could get there."""
    places = [
        f"{cluster}/{group} ({found.ever})" if group else f"{cluster} ({found.ever})"
        for (cluster, group, model, profile), found in sorted(
            picture.found.items(), key=lambda entry: (entry[0][0], entry[0][1] or "")
        )
        if model == spec.gpu_model and profile == spec.profile and found.ever
    ]
    return ", ".join(places) or _("no cluster")


def _check_items(
    items: Sequence[tuple[str, int]], cluster: Cluster | None, purpose: str, picture: CapacityPicture
) -> list[tuple[Spec, int]]:
    if not items:
        raise InvalidInput(_("A request needs at least one item."))
    if len(items) > MAX_ITEMS:
        raise InvalidInput(_("A request has at most %(n)s items.") % {"n": MAX_ITEMS})
    candidates = [c for c in picture.clusters if cluster is None or c.pk == cluster.pk]
    checked, seen = [], set()
    for spec_id, count in items:
        try:
            spec = parse_spec(spec_id)
        except UnknownSpec as error:
            raise InvalidInput(str(error)) from None
        if spec in seen:
            raise InvalidInput(
                _("%(spec)s is listed twice; give it once with the total count.") % {"spec": spec.id}
            )
        seen.add(spec)
        if not isinstance(count, int) or isinstance(count, bool) or count <= 0:
            raise InvalidInput(
                _("The count of %(spec)s must be a whole number above zero.") % {"spec": spec.id}
            )
        if count > MAX_COUNT:
            raise InvalidInput(
                _("A request asks for at most %(max)s of %(spec)s.")
                % {"max": f"{MAX_COUNT:,}", "spec": spec.id}
            )
        offers = [picture.offer(c, purpose, spec) for c in candidates]
        ceiling = max((found.ever for found in offers if found is not None), default=0)
        if count > ceiling:
            where = cluster.name if cluster else _("any cluster")
            if purpose:
                where = _("%(where)s in group %(group)s") % {"where": where, "group": purpose}
            raise InvalidInput(
                str(TOO_MANY)
                % {
                    "count": count,
                    "spec": spec.id,
                    "where": where,
                    "ceiling": ceiling,
                    "places": _where_it_exists(picture, spec),
                }
            )
        checked.append((spec, count))
    _check_placeable_together(checked, candidates, purpose, picture)
    return checked


def _check_placeable_together(
    checked: list[tuple[Spec, int]], candidates: list[Cluster], purpose: str, picture: CapacityPicture
) -> None:
    """A request lands whole on one cluster: some cluster must hold all its items at once, were it free."""
    for candidate in candidates:
        fleet = picture.emptied_fleets.get(candidate.name)
        if fleet is None:
            continue
        request = placement.Request(
            id="check",
            items=tuple(placement.Item(spec.gpu_model, spec.profile, count) for spec, count in checked),
            group=picture.group_for(candidate, purpose),
        )
        if placement.place(fleet, request).placed:
            return
    raise InvalidInput(
        _(
            "These items fit one by one but not together on any one cluster, even when it is free; "
            "ask for them in separate requests."
        )
    )


def submit_request(
    *,
    project: Project,
    user,
    items: Sequence[tuple[str, int]],
    cluster: Cluster | None = None,
    purpose: str = "",
    justification: str = "",
    end_at: datetime | None = None,
    hold_seconds: int | None = None,
) -> PoolRequest:
    """A member (or admin) of the project's tenant asks for GPUs: items are (spec id, count); the pool ends
    at `end_at`, or `hold_seconds` after its admission, or (neither given) when released."""
    require_pool_requester(user=user, tenant_id=project.tenant_id)
    check_end(project.tenant_id, end_at=end_at, hold_seconds=hold_seconds, now=timezone.now())
    problem = namespace_problem(project)
    if problem:
        raise InvalidInput(
            _("GPUs cannot go to this project's namespace: %(why)s Ask for them in a new project.")
            % {"why": problem}
        )
    if len(justification) > 4000:
        raise InvalidInput(_("The justification has at most 4000 characters."))
    picture = capacity_picture()
    check_purpose(picture, purpose, cluster)
    checked = _check_items(items, cluster, purpose, picture)
    judged = judge_against_quotas(project, checked, purpose)
    if judged.kind == BEYOND_LIMIT:
        raise InvalidInput(
            _("This request goes beyond a quota: %(why)s.")
            % {"why": render_reason(judged.refusal(project).as_data())}
        )
    with transaction.atomic():
        request = _file(
            project,
            [placement.Item(spec.gpu_model, spec.profile, count) for spec, count in checked],
            judged,
            actor=user,
            cluster=cluster,
            purpose=purpose,
            justification=justification,
            submitted_by=user,
            end_at=end_at,
            hold_seconds=hold_seconds,
        )
        approve_by_policy(request, judged)
    return request


def approve_by_policy(request: PoolRequest, judged: Judged) -> None:
    """Approve a request just filed where its tenant's policy approves what lies within its guarantee."""
    if (
        judged.kind == WITHIN
        and judged.in_force
        and approves_within_guarantee(request.project.tenant_id)
        and budgets.most_passed(request_budgets(request)) is None
    ):
        _approve(request, None, reason=Reason(BY_POLICY))


@dataclass(frozen=True)
class Judged:
    """A request's verdict against its tenant's quotas; `in_force` is False where no quota says anything."""

    kind: str
    in_force: bool
    verdict: QuotaVerdict

    def refusal(self, project: Project) -> Reason | None:
        """Why it is beyond a limit, naming the tenant or project whose quota it is; None where it is not."""
        return self.verdict.reason(quota_owner(project, self.verdict.project))


def judge_against_quotas(project: Project, checked: Sequence[tuple[Spec, int]], purpose: str) -> Judged:
    """What items of a new request for `project` are against its tenant's quotas, counting what the tenant
    holds and what its approved requests still wait for: within the guarantee, borrowed, or beyond a limit.
    The request form tells it before sending, and submission acts on it."""
    return _judged(
        project, [placement.Item(spec.gpu_model, spec.profile, count) for spec, count in checked], purpose
    )


def _judged(project: Project, items: Sequence[placement.Item], purpose: str) -> Judged:
    books, _holdings = ledger([project.tenant_id], waiting=True)
    verdict = books.verdict(project.tenant_id, project.pk, asked_slices(items, purpose))
    return Judged(verdict.kind, books.in_force, verdict)


def ask_again(*, pool: Pool) -> PoolRequest | None:
    """The request of a pool just released at its reclaim's end, asked again (RECLAIM_REQUEUE): the same
    project, cluster, purpose, items, priority, end and requester, approved as that work was before (unless it
    would pass a hard budget: then it waits for an approver's override, as any request), waiting in
    the queue for room like any request (and cancelled like one where the work is done). In the caller's
    transaction. None where the setting is off, the project can take no pool any more, or the request would
    now go beyond a limit."""
    if not settings.RECLAIM_REQUEUE:
        return None
    original = (
        PoolRequest.objects.select_related("project", "cluster", "submitted_by")
        .prefetch_related("items")
        .get(pk=pool.request_id)
    )
    project = original.project
    items = [placement.Item(i.gpu_model, i.profile, i.count) for i in original.items.all()]
    judged = _judged(project, items, original.purpose)
    if namespace_problem(project) or judged.kind == BEYOND_LIMIT:
        return None
    if pool.end_at is not None and pool.end_at <= timezone.now():
        return None  # the work was to end by now anyway
    reason = Reason(ASKED_AGAIN, pool=pool.pk)
    request = _file(
        project,
        items,
        judged,
        actor=None,
        reason=reason,
        cluster=original.cluster,
        purpose=original.purpose,
        justification=original.justification,
        submitted_by=original.submitted_by,
        priority=original.priority,
        asked_again_for=pool,
        end_at=pool.end_at,
    )
    if budgets.most_passed(request_budgets(request)) is not None:
        return request  # past a hard budget it waits for an approver's override, as any request would
    return _approve(request, None, reason=reason)


def _file(
    project: Project, items: Sequence[placement.Item], judged: Judged, *, actor, reason=None, **fields
) -> PoolRequest:
    """A new request of `project` for `items`, with its verdict against the quotas and its submitted event
    (`reason` a Reason, where one says why); in the caller's transaction."""
    request = PoolRequest.objects.create(
        project=project, quota_verdict=judged.kind if judged.in_force else "", **fields
    )
    RequestItem.objects.bulk_create(
        RequestItem(request=request, gpu_model=i.model, profile=i.profile, count=i.count) for i in items
    )
    told = {"reason": str(reason), "reason_data": reason.as_data()} if reason else {}
    record_event(
        tenant_id=project.tenant_id, request=request, actor=actor, to_state=RequestState.SUBMITTED, **told
    )
    return request


def asked_or_administers(user, request: PoolRequest) -> bool:
    """Whether the user asked for this request (or its pool), or is an admin of its tenant."""
    return made_it_or_administers(
        user=user, made_by_id=request.submitted_by_id, tenant_id=request.project.tenant_id
    )


def _require_approver(user) -> None:
    require_staff_action(user=user, permission=APPROVE, refusal=_("Only approvers decide on pool requests."))


def _check_priority(priority: int) -> None:
    if not -1000 <= priority <= 1000:
        raise InvalidInput(_("Priority goes from -1000 to 1000."))


def approve_request(
    *,
    request_id: int,
    approver,
    priority: int | None = None,
    end_at: datetime | None = None,
    override_budget: bool = False,
) -> PoolRequest:
    """Approve, with the end asked for or (`end_at`) a sooner one; the queue then admits the request when
    placement finds room, and an extension moves its pool's end at once. A request that would take its
    month's projected cost past a hard budget is approved only with `override_budget`."""
    _require_approver(approver)
    if priority is not None:
        _check_priority(priority)
    with transaction.atomic():
        request = _locked(request_id)
        reason = budget_override(request, override_budget)
        return _approve(request, approver, priority=priority, reason=reason, end_at=end_at)


def _approve(
    request: PoolRequest,
    approver,
    *,
    priority: int | None = None,
    reason: Reason | None = None,
    end_at: datetime | None = None,
):
    """Approve a locked request: by an approver, or (`approver` None) by the policy, `reason` saying why."""
    now = timezone.now()
    if request.kind == RequestKind.NEW and request.end_at is not None and request.end_at <= now:
        raise Conflict(_("Request #%(id)s ends at a moment already past.") % {"id": request.pk})
    reason = set_approved_end(request, end_at, now) or reason
    transition(request, RequestState.APPROVED, actor=approver, reason=reason or "")
    request.decided_by, request.decided_at, request.approved_at = approver, now, now
    if priority is not None:
        request.priority = priority
    request.save(
        update_fields=[
            "state", "decided_by", "decided_at", "approved_at", "priority", "end_at", "hold_seconds",
        ]
    )  # fmt: skip
    if request.kind == RequestKind.EXTENSION:
        extend(request, approver)
    else:
        dispatch.after_commit(task_names.ADMIT)
    return request


def reject_request(*, request_id: int, approver, reason: str) -> PoolRequest:
    _require_approver(approver)
    reason = (reason or "").strip()
    if not reason:
        raise InvalidInput(_("Say why the request is rejected: the tenant reads the reason."))
    if len(reason) > 2000:
        raise InvalidInput(_("The reason has at most 2000 characters."))
    with transaction.atomic():
        request = _locked(request_id)
        transition(request, RequestState.REJECTED, actor=approver, reason=reason)
        request.decided_by, request.decided_at, request.decision_reason = approver, timezone.now(), reason
        request.save(update_fields=["state", "decided_by", "decided_at", "decision_reason"])
        call_off(request, REJECTED)
    return request


def cancel_request(*, request_id: int, user, reason: str = "") -> PoolRequest:
    """The requester or an admin of the tenant withdraws a request that has no pool yet."""
    with transaction.atomic():
        request = _locked(request_id)
        if not asked_or_administers(user, request):
            raise NotAllowed(_("Only who asked, or an admin of the tenant, can cancel this request."))
        if request.state == RequestState.FULFILLED:
            raise Conflict(_("Request #%(id)s is fulfilled; release its pool instead.") % {"id": request.pk})
        transition(request, RequestState.CANCELLED, actor=user, reason=reason)
        request.save(update_fields=["state"])
        call_off(request, CANCELLED)
    return request


def set_priority(*, request_id: int, approver, priority: int) -> PoolRequest:
    _require_approver(approver)
    _check_priority(priority)
    with transaction.atomic():
        request = _locked(request_id)
        if not REQUEST_TRANSITIONS[request.state]:
            raise Conflict(_("Request #%(id)s is decided and done.") % {"id": request.pk})
        request.priority = priority
        request.save(update_fields=["priority"])
        record_event(
            tenant_id=request.project.tenant_id,
            action="request.priority",
            request=request,
            actor=approver,
            from_state=request.state,
            to_state=request.state,
            reason=str(reason := Reason(PRIORITY_SET, p=priority)),
            reason_data=reason.as_data(),
        )
    return request


__all__ = [
    "approve_by_policy",
    "approve_request",
    "ask_again",
    "cancel_request",
    "judge_against_quotas",
    "reject_request",
    "set_priority",
    "submit_request",
]
