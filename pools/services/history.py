"""Pools of the past, recorded as the services would have written them then: a demo's history to meter
and invoice.

A past pool was asked for, approved, reserved, made active and released, all before now. Its request,
items, pool, allocations and events say what the services write on that way (the states and their
order, who acted, the moments), and nothing of it holds capacity now. It is placed on the fleet as it
is: the GPUs' present MIG layouts (no re-partitioning), a GPU group of the pool's purpose, and instances
no other pool recorded with it holds at the same time. Its events are written without the e-mails the
services queue for them, so that nobody is told now of what happened then.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from django.contrib.auth.models import AbstractBaseUser
from django.db import transaction
from django.db.backends.postgresql.psycopg_any import NumericRange

from pools import kinds, mig
from pools.kinds import WHOLE
from pools.models import (
    Allocation,
    GpuCapacity,
    Pool,
    PoolEvent,
    PoolItem,
    PoolRequest,
    PoolState,
    RequestItem,
    RequestState,
)
from pools.specs import parse_spec
from portal.models import Project

# The moments around a reservation, as the services take them: a request waits for its approver, the
# queue admits it at once, provisioning takes a minute, a release a few seconds.
SUBMITTED_BEFORE = timedelta(minutes=95)
APPROVED_BEFORE = timedelta(seconds=4)
ACTIVE_AFTER = timedelta(seconds=75)
RELEASED_AFTER = timedelta(seconds=9)


@dataclass(frozen=True)
class PastPool:
    """A pool asked for by `submitted_by` in `project`, approved by `approved_by`, holding capacity from
    `reserved_at` until `released_at` (when its owner released it). `items` are (spec id, count), e.g.
    ("h200-141gb.mig-3g.71gb", 2)."""

    project: Project
    submitted_by: AbstractBaseUser
    approved_by: AbstractBaseUser
    purpose: str
    justification: str
    items: tuple[tuple[str, int], ...]
    reserved_at: datetime
    released_at: datetime


@dataclass
class _Slot:
    """One MIG instance, or one full GPU, of the fleet as it is, and when the pools recorded hold it."""

    gpu: GpuCapacity
    profile: str
    lower: int
    upper: int
    uuid: str
    held: list[tuple[datetime, datetime]] = field(default_factory=list)

    def free(self, begins: datetime, ends: datetime) -> bool:
        return all(ends <= since or begins >= until for since, until in self.held)


def _slots() -> dict[tuple[int, str, str, str], list[_Slot]]:
    """(cluster id, GPU group, GPU model, profile) → the fleet's instances and full GPUs, in the order
    placement reads the fleet."""
    found: dict[tuple[int, str, str, str], list[_Slot]] = defaultdict(list)
    gpus = (
        GpuCapacity.objects.filter(present=True, node__present=True, node__group__isnull=False)
        .select_related("node__group")
        .order_by("node__cluster__name", "node__name", "index")
    )
    for gpu in gpus:
        key = (gpu.node.cluster_id, gpu.node.group.name, gpu.model)
        if not gpu.mig_enabled:
            found[(*key, WHOLE.profile)].append(_Slot(gpu, WHOLE.profile, 0, mig.MEMORY_SLICES, gpu.uuid))
            continue
        model = mig.gpu_model(gpu.model)
        for instance in gpu.layout:
            profile, start = instance["profile"], instance["start"]
            size = model.profile(profile).memory_slices
            found[(*key, profile)].append(_Slot(gpu, profile, start, start + size, instance.get("uuid", "")))
    return found


def _place(
    slots: dict[tuple[int, str, str, str], list[_Slot]], past: PastPool
) -> tuple[int, list[_Slot]] | None:
    """The first cluster where every item of the pool finds instances free over its whole time."""
    begins, ends = past.reserved_at, past.released_at
    for cluster_id in sorted({key[0] for key in slots}):
        chosen: list[_Slot] = []
        for spec_id, count in past.items:
            spec = parse_spec(spec_id)
            free = [
                slot
                for slot in slots.get((cluster_id, past.purpose, spec.gpu_model, spec.profile), [])
                if slot.free(begins, ends)
            ]
            if len(free) < count:
                break
            chosen += free[:count]
        else:
            return cluster_id, chosen
    return None


@dataclass
class _Rows:
    """The rows written together at the end; events' moments are written over once they exist (creating one
    stamps it with the present)."""

    requests: list[PoolRequest] = field(default_factory=list)
    allocations: list[Allocation] = field(default_factory=list)
    events: list[PoolEvent] = field(default_factory=list)

    def event(self, request, at, to, *, pool=None, actor=None, was="") -> None:
        made = PoolEvent(request=request, pool=pool, actor=actor, from_state=was, to_state=to)
        made.when = at
        self.events.append(made)

    def write(self) -> None:
        PoolRequest.objects.bulk_update(self.requests, ["submitted_at"])
        Allocation.objects.bulk_create(self.allocations)
        PoolEvent.objects.bulk_create(self.events)
        for event in self.events:
            event.at = event.when
        PoolEvent.objects.bulk_update(self.events, ["at"], batch_size=500)


def _record(past: PastPool, cluster_id: int, chosen: list[_Slot], rows: _Rows) -> Pool:
    reserved, released, who, approver = (
        past.reserved_at,
        past.released_at,
        past.submitted_by,
        past.approved_by,
    )
    submitted, approved = reserved - SUBMITTED_BEFORE, reserved - APPROVED_BEFORE
    active, closed = reserved + ACTIVE_AFTER, released + RELEASED_AFTER
    request = PoolRequest.objects.create(
        project=past.project, purpose=past.purpose, justification=past.justification,
        state=RequestState.FULFILLED, submitted_by=who, decided_by=approver, decided_at=approved,
        approved_at=approved,
    )  # fmt: skip
    request.submitted_at = submitted
    rows.requests.append(request)
    specs = [(parse_spec(spec_id), count) for spec_id, count in past.items]
    RequestItem.objects.bulk_create(
        RequestItem(request=request, gpu_model=spec.gpu_model, profile=spec.profile, count=count)
        for spec, count in specs
    )
    pool = Pool.objects.create(
        request=request, project=past.project, cluster_id=cluster_id, state=PoolState.RELEASED,
        reserved_at=reserved, active_at=active, released_at=released,
    )  # fmt: skip
    PoolItem.objects.bulk_create(
        PoolItem(pool=pool, gpu_model=spec.gpu_model, profile=spec.profile, count=count)
        for spec, count in specs
    )
    for slot in chosen:
        slot.held.append((reserved, released))
        allocation = Allocation(
            pool=pool, gpu=slot.gpu, profile=slot.profile, slices=NumericRange(slot.lower, slot.upper),
            resource_name=kinds.resource_name(slot.profile), instance_uuid=slot.uuid, released_at=released,
            allocated_at=reserved, request=request,
        )  # fmt: skip
        rows.allocations.append(allocation)
    rows.event(request, submitted, RequestState.SUBMITTED, actor=who)
    rows.event(request, approved, RequestState.APPROVED, actor=approver, was=RequestState.SUBMITTED)
    rows.event(request, reserved, RequestState.FULFILLED, was=RequestState.APPROVED)
    rows.event(request, reserved, PoolState.PROVISIONING, pool=pool)
    rows.event(request, active, PoolState.ACTIVE, pool=pool, was=PoolState.PROVISIONING)
    rows.event(request, released, PoolState.RELEASING, pool=pool, actor=who, was=PoolState.ACTIVE)
    rows.event(request, closed, PoolState.RELEASED, pool=pool, was=PoolState.RELEASING)
    return pool


def record_past_pools(pools: Sequence[PastPool], *, now: datetime) -> list[Pool]:
    """Record each pool that was released by `now` and finds room on the fleet, in the order given (an
    earlier one keeps its instances from a later one); returns the pools recorded. All or nothing."""
    slots, rows, recorded = _slots(), _Rows(), []
    with transaction.atomic():
        for past in pools:
            placed = _place(slots, past) if past.released_at <= now else None
            if placed is not None:
                recorded.append(_record(past, *placed, rows))
        rows.write()
    return recorded
