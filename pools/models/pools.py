"""Pools: what tenants ask for and what they get.

- PoolRequest: a project's ask for GPUs (items: GPU model × profile × count), decided
  by an approver, then admitted by the queue when placement finds room.
- RequestItem: one line of a request, e.g. 3 × H200-141GB 1g.18gb, or 2 × full H100-80GB.
- Pool: the GPUs a fulfilled request reserved, from reservation to release.
- Allocation: one MIG instance (a run of memory slices on a GPU) or one full GPU bound
  to a pool. A database exclusion constraint makes two live allocations of one GPU's
  memory slices impossible, whatever the code above it does.
- PoolItem: what a pool holds by design, per spec: its request's items, grown and shrunk since.
- PoolEvent: who moved a request or pool from which state to which, when and why.

A request is of one kind: a new pool, the extension of a pool's end, or the growth of a pool (resize).

States move only through `pools.services`, along the transitions listed here.
"""

from __future__ import annotations

from django.contrib.postgres.constraints import ExclusionConstraint
from django.contrib.postgres.fields import IntegerRangeField, RangeOperators
from django.db import models
from django.utils import timezone
from django.utils.translation import gettext_lazy as _

from pools.conf import settings
from pools.kinds import kind_of
from pools.specs import profile_label
from portal.models import visible_tenant_ids


class RequestState(models.TextChoices):
    SUBMITTED = "submitted", _("submitted")
    APPROVED = "approved", _("approved")
    QUEUED = "queued", _("queued")
    FULFILLED = "fulfilled", _("fulfilled")
    REJECTED = "rejected", _("rejected")
    CANCELLED = "cancelled", _("cancelled")


class PoolState(models.TextChoices):
    PROVISIONING = "provisioning", _("provisioning")
    ACTIVE = "active", _("active")
    RECLAIMING = "reclaiming", _("reclaiming")
    RELEASING = "releasing", _("releasing")
    RELEASED = "released", _("released")
    FAILED = "failed", _("failed")


# A pool whose capacity its project uses: active, or reclaiming (still usable until its notice ends).
IN_USE_STATES = (PoolState.ACTIVE, PoolState.RECLAIMING)

REQUEST_TRANSITIONS: dict[str, set[str]] = {
    RequestState.SUBMITTED: {RequestState.APPROVED, RequestState.REJECTED, RequestState.CANCELLED},
    RequestState.APPROVED: {RequestState.QUEUED, RequestState.FULFILLED, RequestState.CANCELLED},
    RequestState.QUEUED: {RequestState.FULFILLED, RequestState.CANCELLED, RequestState.REJECTED},
    RequestState.FULFILLED: set(),
    RequestState.REJECTED: set(),
    RequestState.CANCELLED: set(),
}
POOL_TRANSITIONS: dict[str, set[str]] = {
    PoolState.PROVISIONING: {PoolState.ACTIVE, PoolState.FAILED, PoolState.RELEASING},
    PoolState.ACTIVE: {PoolState.RECLAIMING, PoolState.RELEASING},
    # A borrowed pool under notice: usable until its reclaim_at, then released; back to active if called off.
    PoolState.RECLAIMING: {PoolState.ACTIVE, PoolState.RELEASING},
    PoolState.RELEASING: {PoolState.RELEASED},
    PoolState.RELEASED: set(),
    PoolState.FAILED: set(),
}


class ProjectRowsQuerySet(models.QuerySet):
    """Rows of a project (requests, pools): who sees them is who sees its tenant (`visible_tenant_ids`)."""

    def visible_to(self, user) -> models.QuerySet:
        ids = visible_tenant_ids(user)
        return self if ids is None else self.filter(project__tenant_id__in=ids)


class PoolRequestQuerySet(ProjectRowsQuerySet):
    def waiting(self) -> PoolRequestQuerySet:
        """Approved requests not admitted yet, in queue order: priority, then approval time; with the pool a
        growth would join (placement reads its end)."""
        return (
            self.filter(state__in=[RequestState.APPROVED, RequestState.QUEUED])
            .select_related("target_pool")
            .order_by("-priority", "approved_at", "pk")
        )


class RequestKind(models.TextChoices):
    """What a request asks for: a new pool, a later end of a pool, or more GPUs in a pool."""

    NEW = "new", _("new pool")
    EXTENSION = "extension", _("extension")
    RESIZE = "resize", _("resize")


class QuotaVerdict(models.TextChoices):
    """What a request is against its tenant's quotas (pools/placement/admission.py)."""

    WITHIN = "within", _("within the guarantee")
    BORROWED = "borrowed", _("borrowed")
    BEYOND_LIMIT = "beyond_limit", _("beyond the limit")


class PoolRequest(models.Model):
    project = models.ForeignKey(
        "portal.Project", on_delete=models.PROTECT, related_name="pool_requests", verbose_name=_("project")
    )
    cluster = models.ForeignKey(
        "pools.Cluster",
        on_delete=models.PROTECT,
        null=True,
        blank=True,
        related_name="pool_requests",
        verbose_name=_("cluster"),
        help_text=_("Empty: any cluster."),
    )
    purpose = models.CharField(
        _("purpose"), max_length=40, blank=True, help_text=_("Workload type, e.g. training, inference.")
    )
    justification = models.TextField(_("justification"), max_length=4000, blank=True)
    state = models.CharField(
        _("state"), max_length=16, choices=RequestState.choices, default=RequestState.SUBMITTED
    )
    priority = models.SmallIntegerField(
        _("priority"), default=0, help_text=_("Higher goes first in the queue.")
    )
    submitted_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.PROTECT, related_name="+", verbose_name=_("submitted by")
    )
    submitted_at = models.DateTimeField(_("submitted"), auto_now_add=True)
    decided_by = models.ForeignKey(
        settings.AUTH_USER_MODEL,
        on_delete=models.PROTECT,
        null=True,
        blank=True,
        related_name="+",
        verbose_name=_("decided by"),
    )
    decided_at = models.DateTimeField(_("decided"), null=True, blank=True)
    approved_at = models.DateTimeField(_("approved"), null=True, blank=True)
    decision_reason = models.TextField(_("reason of the decision"), max_length=2000, blank=True)
    quota_verdict = models.CharField(
        _("against the quotas"),
        max_length=16,
        choices=QuotaVerdict.choices,
        blank=True,
        help_text=_("As judged at submission, and again when admitted."),
    )
    waiting_reason = models.CharField(_("why it waits"), max_length=500, blank=True)
    # The same reason as its template and values, to show it in the reader's language.
    waiting_reason_data = models.JSONField(null=True, blank=True, editable=False)
    # Where the request asks again for the work of a pool that was reclaimed (RECLAIM_REQUEUE).
    asked_again_for = models.ForeignKey(
        "Pool",
        on_delete=models.SET_NULL,
        null=True,
        blank=True,
        related_name="asked_again",
        editable=False,
        verbose_name=_("asked again for pool"),
    )

    kind = models.CharField(_("kind"), max_length=16, choices=RequestKind.choices, default=RequestKind.NEW)
    # The pool an extension or a resize changes (a new pool's request has its pool as `pool`).
    target_pool = models.ForeignKey(
        "Pool",
        on_delete=models.PROTECT,
        null=True,
        blank=True,
        related_name="changes",
        verbose_name=_("pool changed"),
    )
    end_at = models.DateTimeField(
        _("ends"),
        null=True,
        blank=True,
        help_text=_("When the pool is released by itself; for an extension, the new end. Empty: no end."),
    )
    hold_seconds = models.PositiveIntegerField(
        _("duration"),
        null=True,
        blank=True,
        help_text=_("How long the pool lives once admitted, where the request gives a duration, not a date."),
    )

    objects = PoolRequestQuerySet.as_manager()

    class Meta:
        ordering = ["-submitted_at"]
        verbose_name = _("pool request")
        verbose_name_plural = _("pool requests")
        permissions = [("approve_poolrequest", _("Can approve or reject pool requests"))]
        constraints = [
            models.CheckConstraint(
                condition=models.Q(state__in=RequestState.values), name="pool_request_state_valid"
            ),
            models.CheckConstraint(
                condition=models.Q(kind=RequestKind.NEW, target_pool__isnull=True)
                | (~models.Q(kind=RequestKind.NEW) & models.Q(target_pool__isnull=False)),
                name="pool_request_change_names_its_pool",
            ),
            models.CheckConstraint(
                condition=models.Q(end_at__isnull=True) | models.Q(hold_seconds__isnull=True),
                name="pool_request_one_end",
            ),
        ]
        indexes = [models.Index(fields=["state", "-priority", "approved_at"], name="pool_request_queue")]

    def __str__(self) -> str:
        return f"#{self.pk} {self.project}"

    @property
    def duration_hours(self) -> int | None:
        """The duration asked for, in whole hours (as the form and the API take it); None: none."""
        return None if self.hold_seconds is None else self.hold_seconds // 3600


class RequestItem(models.Model):
    request = models.ForeignKey(
        PoolRequest, on_delete=models.CASCADE, related_name="items", verbose_name=_("request")
    )
    gpu_model = models.CharField(_("GPU model"), max_length=32)
    profile = models.CharField(_("profile"), max_length=32, help_text=_("A MIG profile, or full."))
    count = models.PositiveSmallIntegerField(_("count"))

    class Meta:
        ordering = ["pk"]
        verbose_name = _("request item")
        verbose_name_plural = _("request items")
        constraints = [
            models.UniqueConstraint(fields=["request", "gpu_model", "profile"], name="request_item_once"),
            models.CheckConstraint(condition=models.Q(count__gt=0), name="request_item_count_positive"),
        ]

    def __str__(self) -> str:
        return f"{self.count} × {self.gpu_model} {profile_label(self.profile)}"


class Pool(models.Model):
    request = models.OneToOneField(
        PoolRequest, on_delete=models.PROTECT, related_name="pool", verbose_name=_("request")
    )
    project = models.ForeignKey(
        "portal.Project", on_delete=models.PROTECT, related_name="pools", verbose_name=_("project")
    )
    cluster = models.ForeignKey(
        "pools.Cluster", on_delete=models.PROTECT, related_name="pools", verbose_name=_("cluster")
    )
    state = models.CharField(
        _("state"), max_length=16, choices=PoolState.choices, default=PoolState.PROVISIONING
    )
    reserved_at = models.DateTimeField(_("reserved"), help_text=_("Billing counts from here."))
    active_at = models.DateTimeField(_("active since"), null=True, blank=True)
    released_at = models.DateTimeField(_("released"), null=True, blank=True)
    failure_reason = models.TextField(_("why it failed"), blank=True)
    # A borrowed pool chosen to make room for a request within its tenant's guarantee: released at reclaim_at.
    reclaim_at = models.DateTimeField(_("reclaimed at"), null=True, blank=True)
    reclaimed_for = models.ForeignKey(
        PoolRequest,
        on_delete=models.SET_NULL,
        null=True,
        blank=True,
        related_name="reclaims",
        verbose_name=_("reclaimed for"),
    )
    # When the pool is released by itself, billing stopping exactly there; None: it lives until released.
    end_at = models.DateTimeField(_("ends"), null=True, blank=True)
    # The reminders of the end sent, as seconds before `end_at`: emptied when the end moves.
    reminders_sent = models.JSONField(_("reminders sent"), default=list, blank=True, editable=False)
    # Per node, the MIG config provisioning asked the GPU Operator for: {"node-name": "portal-node-…"}, and
    # the device plugin config under "sharing:node-name".
    mig_configs = models.JSONField(_("MIG configs asked for"), default=dict, blank=True)

    objects = ProjectRowsQuerySet.as_manager()

    class Meta:
        ordering = ["-reserved_at"]
        verbose_name = _("pool")
        verbose_name_plural = _("pools")
        indexes = [
            # Metering asks each period which pools held capacity in it: the live ones, and those
            # released after it began.
            models.Index(
                fields=["reserved_at"], condition=models.Q(released_at__isnull=True), name="pool_live"
            ),
            models.Index(fields=["released_at"], name="pool_released_at"),
            models.Index(fields=["end_at"], condition=models.Q(released_at__isnull=True), name="pool_ends"),
        ]
        constraints = [
            models.CheckConstraint(condition=models.Q(state__in=PoolState.values), name="pool_state_valid"),
        ]

    def __str__(self) -> str:
        return f"pool #{self.pk} of {self.project}"

    def forget_configs(self, nodes: set[str]) -> None:
        """Forget the MIG and device-plugin configs asked for on these nodes, which a later change of its
        own (a growth, a move) must ask for anew."""
        kept = {key: c for key, c in self.mig_configs.items() if key.rpartition(":")[2] not in nodes}
        if kept != self.mig_configs:
            self.mig_configs = kept
            self.save(update_fields=["mig_configs"])

    @property
    def billing_ended_at(self):
        """When billing stopped: at the release, or at the end date where that came first (also before the
        sweeper releases the pool); None while it is billed."""
        if self.end_at is not None and self.end_at <= (self.released_at or timezone.now()):
            return self.end_at
        return self.released_at


class Allocation(models.Model):
    pool = models.ForeignKey(
        Pool, on_delete=models.PROTECT, related_name="allocations", verbose_name=_("pool")
    )
    gpu = models.ForeignKey(
        "pools.GpuCapacity", on_delete=models.PROTECT, related_name="allocations", verbose_name=_("GPU")
    )
    profile = models.CharField(_("profile"), max_length=32, help_text=_("A MIG profile, or full."))
    # The memory slices [start, end) the instance occupies; a full GPU holds [0, 8).
    slices = IntegerRangeField(_("memory slices"))
    resource_name = models.CharField(_("resource"), max_length=64)
    instance_uuid = models.CharField(_("instance UUID"), max_length=64, blank=True)
    # Under DRA, since when the cluster's GPU driver no longer publishes the device with that UUID (a sync
    # saw its node without it); cleared when it comes back or the allocation gets its new device's UUID.
    device_vanished_at = models.DateTimeField(_("device vanished"), null=True, blank=True)
    # Billed from its own reservation to its own release (billing/services.py).
    allocated_at = models.DateTimeField(_("allocated"), default=timezone.now)
    released_at = models.DateTimeField(_("released"), null=True, blank=True)
    # The request that reserved it: the pool's own, or a resize that grew it; empty for a move.
    request = models.ForeignKey(
        PoolRequest,
        on_delete=models.SET_NULL,
        null=True,
        blank=True,
        related_name="allocations",
        verbose_name=_("reserved for request"),
    )

    class Meta:
        ordering = ["gpu_id", "slices"]
        verbose_name = _("allocation")
        verbose_name_plural = _("allocations")
        indexes = [
            # Metering asks each period which allocations were held in it, as for pools.
            models.Index(
                fields=["allocated_at"], condition=models.Q(released_at__isnull=True), name="allocation_live"
            ),
            models.Index(fields=["released_at"], name="allocation_released_at"),
        ]
        constraints = [
            # Over-commit is impossible, not unlikely: live allocations of one GPU never share a slice.
            ExclusionConstraint(
                name="allocation_no_shared_slices",
                expressions=[("gpu", RangeOperators.EQUAL), ("slices", RangeOperators.OVERLAPS)],
                condition=models.Q(released_at__isnull=True),
            ),
        ]

    def __str__(self) -> str:
        return f"{self.profile} on {self.gpu_id} [{self.slices.lower},{self.slices.upper})"

    @property
    def start(self) -> int | None:
        return None if kind_of(self.profile).takes_whole_gpu else self.slices.lower


class PoolItem(models.Model):
    """What a pool holds by design of one spec: its request's count, plus what resizes added, less what they
    gave back. A live allocation short of it is missing (pools/services/replacement.py)."""

    pool = models.ForeignKey(Pool, on_delete=models.CASCADE, related_name="items", verbose_name=_("pool"))
    gpu_model = models.CharField(_("GPU model"), max_length=32)
    profile = models.CharField(_("profile"), max_length=32)
    count = models.PositiveSmallIntegerField(_("count"))

    class Meta:
        ordering = ["pk"]
        verbose_name = _("pool item")
        verbose_name_plural = _("pool items")
        constraints = [
            models.UniqueConstraint(fields=["pool", "gpu_model", "profile"], name="pool_item_once"),
            models.CheckConstraint(condition=models.Q(count__gt=0), name="pool_item_count_positive"),
        ]

    def __str__(self) -> str:
        return f"{self.count} × {self.gpu_model} {profile_label(self.profile)}"


class PoolEvent(models.Model):
    request = models.ForeignKey(
        PoolRequest, on_delete=models.CASCADE, related_name="events", verbose_name=_("request")
    )
    pool = models.ForeignKey(
        Pool, on_delete=models.CASCADE, null=True, blank=True, related_name="events", verbose_name=_("pool")
    )
    actor = models.ForeignKey(
        settings.AUTH_USER_MODEL,
        on_delete=models.SET_NULL,
        null=True,
        blank=True,
        related_name="+",
        verbose_name=_("who"),
        help_text=_("Empty when the portal itself acted (queue, provisioning)."),
    )
    at = models.DateTimeField(_("when"), auto_now_add=True)
    from_state = models.CharField(_("from"), max_length=16, blank=True)
    to_state = models.CharField(_("to"), max_length=16)
    reason = models.TextField(_("why"), blank=True)
    # The reason's template and values where it has them, so that each reader sees it in their language.
    reason_data = models.JSONField(null=True, blank=True, editable=False)

    class Meta:
        ordering = ["at", "pk"]
        verbose_name = _("pool event")
        verbose_name_plural = _("pool events")

    def __str__(self) -> str:
        return f"{self.from_state or '∅'} → {self.to_state}"

    # An event's states are a request's or a pool's: their values do not overlap.
    def get_from_state_display(self) -> str:
        return state_label(self.from_state)

    def get_to_state_display(self) -> str:
        return state_label(self.to_state)


def state_label(value: str) -> str:
    """A request's or a pool's state in the reader's language; an unknown value as it is."""
    for states in (RequestState, PoolState):
        if value in states.values:
            return str(states(value).label)
    return value
