"""Quotas and the tenants' admission policy, set by operators and approvers, audited.

`set_quota` creates or replaces one row: a tenant's guarantee and limit in a GPU group and model, or a
project's limit inside its tenant's. The sum of the guarantees in a key may not pass the compute slices in
service there, nor the guarantees of a model over all its groups the model's: a guarantee is a promise the
portal must be able to keep. A quota lowered below what the tenant holds takes nothing away; new requests
are judged against it. `set_auto_approve` turns on or off the approval, by the policy itself, of requests
within the tenant's guarantee. Both run under the capacity lock, so that two changes cannot together
promise more than is there.
"""

from __future__ import annotations

from django.db import transaction
from django.utils.translation import gettext as _
from django.utils.translation import gettext_noop

from pools.apps import SET_QUOTAS
from pools.models import GpuCapacity, GpuGroup, Quota, TenantPolicy
from pools.selectors.quotas import in_service_slices
from pools.services.reservations import lock_capacity
from portal import audit
from portal.errors import InvalidInput
from portal.models import Project, Tenant
from portal.permissions import require_staff_action

QUOTA_SET = gettext_noop(
    "Quota of %(owner)s in %(where)s: %(guaranteed)s compute slices guaranteed, limit %(limit)s"
)
AUTO_APPROVE_ON = gettext_noop("%(tenant)s: requests within the guarantee are approved by the policy")
AUTO_APPROVE_OFF = gettext_noop("%(tenant)s: every request goes to the approvers")
MAX_DURATION_SET = gettext_noop("%(tenant)s: every pool ends within %(hours)s hours")
MAX_DURATION_OFF = gettext_noop("%(tenant)s: pools need no end")
NO_LIMIT = gettext_noop("none")
UNSET = object()
MAX_SLICES = 10_000_000


def _require_quota_setter(user) -> None:
    require_staff_action(
        user=user, permission=SET_QUOTAS, refusal=_("Only operators and approvers set quotas.")
    )


def _slices(value, what: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= MAX_SLICES:
        raise InvalidInput(
            _("%(what)s is a whole number of compute slices, 0 or more (got %(value)s).")
            % {"what": what, "value": repr(value)}
        )
    return value


def _check_key(group: str, gpu_model: str) -> None:
    if not isinstance(group, str) or not isinstance(gpu_model, str):
        raise InvalidInput(_("The GPU group and model are names."))
    if not GpuCapacity.objects.filter(model=gpu_model).exists():
        models = sorted(set(GpuCapacity.objects.values_list("model", flat=True)))
        raise InvalidInput(
            _("No GPU of the fleet is a %(model)s; its models: %(models)s.")
            % {"model": gpu_model or "''", "models": ", ".join(models) or _("none yet")}
        )
    if group and not GpuGroup.objects.filter(name=group).exists():
        groups = sorted(set(GpuGroup.objects.values_list("name", flat=True)))
        raise InvalidInput(
            _(
                "No cluster has a GPU group %(group)s; the groups: %(groups)s (or none, for requests "
                "without one)."
            )
            % {"group": group, "groups": ", ".join(groups) or _("none yet")}
        )


def _check_capacity(tenant: Tenant, group: str, gpu_model: str, guaranteed: int) -> None:
    """The guarantees in the key, and of the model over all its groups, with this one: within service."""
    others = Quota.objects.filter(project__isnull=True, gpu_model=gpu_model).exclude(
        tenant=tenant, group=group
    )
    capacity = in_service_slices()
    in_key = sum(q.guaranteed for q in others if q.group == group) + guaranteed
    where = _where(group, gpu_model)
    if in_key > capacity.get((group, gpu_model), 0):
        raise InvalidInput(
            _(
                "The guarantees in %(where)s would come to %(sum)s compute slices, but %(capacity)s are in "
                "service there; at most %(most)s more can be guaranteed to %(tenant)s."
            )
            % {
                "where": where,
                "sum": in_key,
                "capacity": capacity.get((group, gpu_model), 0),
                "most": max(0, capacity.get((group, gpu_model), 0) - in_key + guaranteed),
                "tenant": tenant.name,
            }
        )
    of_model = sum(q.guaranteed for q in others) + guaranteed
    if of_model > capacity.get(("", gpu_model), 0):
        raise InvalidInput(
            _(
                "The guarantees of %(model)s over all its groups would come to %(sum)s compute slices, but "
                "%(capacity)s are in service."
            )
            % {"model": gpu_model, "sum": of_model, "capacity": capacity.get(("", gpu_model), 0)}
        )


def _where(group: str, gpu_model: str) -> str:
    return f"{group}/{gpu_model}" if group else gpu_model


def check_quota(
    *,
    tenant: Tenant,
    gpu_model: str,
    group: str = "",
    guaranteed=0,
    limit=UNSET,
    project: Project | None = None,
) -> tuple[int, int | None]:
    """What `set_quota` refuses, checked without writing (the admin's form asks it before saving): returns
    the guarantee and the limit as they would be kept. The capacity in service is checked again under the
    lock as the row is written."""
    guaranteed = _slices(guaranteed, _("The guarantee"))
    if limit is UNSET:
        limit = guaranteed
    if limit is not None:
        limit = _slices(limit, _("The limit"))
        if limit < guaranteed:
            raise InvalidInput(
                _(
                    "The limit (%(limit)s) is below the guarantee (%(guaranteed)s): it includes what is "
                    "guaranteed."
                )
                % {"limit": limit, "guaranteed": guaranteed}
            )
    if project is not None:
        if project.tenant_id != tenant.pk:
            raise InvalidInput(
                _("Project %(project)s is not of tenant %(tenant)s.") % {"project": project, "tenant": tenant}
            )
        if guaranteed or limit is None:
            raise InvalidInput(
                _("A project's quota is a limit inside its tenant's: it guarantees nothing and has a limit.")
            )
    _check_key(group, gpu_model)
    if project is None:
        _check_capacity(tenant, group, gpu_model, guaranteed)
    return guaranteed, limit


def set_quota(
    *,
    actor,
    tenant: Tenant,
    gpu_model: str,
    group: str = "",
    guaranteed=0,
    limit=UNSET,
    project: Project | None = None,
) -> Quota:
    """Create or replace one quota row. `limit` left out is the guarantee (no borrowing); None is no limit.
    A project's row is a limit only: its guarantee must be 0 and its limit given."""
    _require_quota_setter(actor)
    guaranteed, limit = check_quota(
        tenant=tenant, gpu_model=gpu_model, group=group, guaranteed=guaranteed, limit=limit, project=project
    )
    with transaction.atomic():
        lock_capacity()
        if project is None:
            _check_capacity(tenant, group, gpu_model, guaranteed)
        before = Quota.objects.filter(
            tenant=tenant, project=project, group=group, gpu_model=gpu_model
        ).first()
        quota, _created = Quota.objects.update_or_create(
            tenant=tenant,
            project=project,
            group=group,
            gpu_model=gpu_model,
            defaults={"guaranteed": guaranteed, "limit": limit},
        )
        audit.record(
            "quota.changed",
            summary=QUOTA_SET,
            values={
                "owner": str(project or tenant.name),
                "where": _where(group, gpu_model),
                "guaranteed": guaranteed,
                "limit": audit.term(NO_LIMIT) if limit is None else limit,
            },
            actor=actor,
            tenant_id=tenant.pk,
            subject=("quota", quota.pk),
            details={
                "before": None
                if before is None
                else {"guaranteed": before.guaranteed, "limit": before.limit},
                "after": {"guaranteed": guaranteed, "limit": limit},
            },
        )
    return quota


def set_auto_approve(*, actor, tenant: Tenant, on: bool) -> TenantPolicy:
    """Whether requests of the tenant within its guarantee are approved by the policy, skipping approvers."""
    _require_quota_setter(actor)
    if not isinstance(on, bool):
        raise InvalidInput(_("auto_approve_within_guarantee is true or false."))
    with transaction.atomic():
        policy, _created = TenantPolicy.objects.select_for_update().get_or_create(tenant=tenant)
        if policy.auto_approve_within_guarantee != on:
            policy.auto_approve_within_guarantee = on
            policy.save(update_fields=["auto_approve_within_guarantee"])
            audit.record(
                "quota.auto_approve",
                summary=AUTO_APPROVE_ON if on else AUTO_APPROVE_OFF,
                values={"tenant": tenant.name},
                actor=actor,
                tenant_id=tenant.pk,
                subject=("tenant", tenant.pk),
            )
    return policy


def set_max_duration(*, actor, tenant: Tenant, hours: int | None) -> TenantPolicy:
    """The longest a pool of the tenant may live, in hours: every request must then give an end within it
    (pools/services/ends.py); None: no end required. Pools already admitted keep their ends."""
    _require_quota_setter(actor)
    if hours is not None and (
        not isinstance(hours, int) or isinstance(hours, bool) or not 1 <= hours <= 87_600
    ):
        raise InvalidInput(_("max_duration_hours is a whole number of hours from 1 to 87600, or null."))
    with transaction.atomic():
        policy, _created = TenantPolicy.objects.select_for_update().get_or_create(tenant=tenant)
        if policy.max_duration_hours != hours:
            policy.max_duration_hours = hours
            policy.save(update_fields=["max_duration_hours"])
            audit.record(
                "tenant.max_duration",
                summary=MAX_DURATION_SET if hours is not None else MAX_DURATION_OFF,
                values={"tenant": tenant.name, "hours": hours},
                actor=actor,
                tenant_id=tenant.pk,
                subject=("tenant", tenant.pk),
            )
    return policy


__all__ = ["check_quota", "set_auto_approve", "set_max_duration", "set_quota"]
