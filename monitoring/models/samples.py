"""What the GPUs read, kept three ways.

- Sample: every reading, raw. The table is partitioned by day in PostgreSQL (see the migration), so pruning
  drops whole partitions instead of deleting rows. One row per (GPU, slot, instant); slot is -1 for the
  whole GPU and, for a MIG instance, the first memory slice it occupies (the `start` of the GPU's layout and
  the lower bound of an allocation's slices), so samples of an instance follow the allocation holding it.
- Rollup: min / avg / max of each figure over 5-minute and 1-hour buckets, kept far longer than raw samples.
- Latest: the newest figures of each GPU and instance, one row each, for the fleet view, alerts and /metrics.

GpuEvent records what happened at an instant rather than what was measured: XID errors, a rise of the
uncorrected ECC count, a GPU gone from its host's reading.
"""

from __future__ import annotations

from django.db import models
from django.utils.translation import gettext_lazy as _

from pools.kinds import kind_of

WHOLE_GPU = -1


def figures_slot(profile: str, start: int) -> int:
    """Where the figures of a unit of `profile` whose allocation starts at `start` are kept: on its GPU's
    row for a kind measured on the whole GPU, else on its instance's (pools/kinds/)."""
    return WHOLE_GPU if kind_of(profile).gpu_figures else start


# The figures a sample carries, in the order of the table's columns. Roll-ups keep min / avg / max of each.
METRICS = ("power_w", "temperature_c", "utilisation_pct", "sm_active_pct", "memory_used_bytes")
COUNTERS = ("ecc_corrected", "ecc_uncorrected")


class Figures(models.Model):
    """The columns every sample and every latest row share."""

    power_w = models.FloatField(_("power (W)"), null=True, blank=True)
    temperature_c = models.FloatField(_("temperature (°C)"), null=True, blank=True)
    utilisation_pct = models.FloatField(_("utilisation (%)"), null=True, blank=True)
    sm_active_pct = models.FloatField(_("SM activity (%)"), null=True, blank=True)
    memory_used_bytes = models.BigIntegerField(_("memory used (bytes)"), null=True, blank=True)
    memory_total_bytes = models.BigIntegerField(_("memory (bytes)"), null=True, blank=True)
    ecc_corrected = models.BigIntegerField(_("corrected ECC errors"), null=True, blank=True)
    ecc_uncorrected = models.BigIntegerField(_("uncorrected ECC errors"), null=True, blank=True)

    class Meta:
        abstract = True


class Sample(Figures):
    pk = models.CompositePrimaryKey("gpu", "slot", "at")
    gpu = models.ForeignKey(
        "pools.GpuCapacity",
        on_delete=models.DO_NOTHING,
        db_constraint=False,  # partitions are dropped whole; a foreign key would make every insert check
        related_name="+",
        verbose_name=_("GPU"),
    )
    slot = models.SmallIntegerField(_("slot"), help_text=_("-1: the whole GPU; else the instance's start."))
    at = models.DateTimeField(_("at"))

    class Meta:
        managed = False  # a partitioned table: the migration creates it and its partitions
        db_table = "monitoring_sample"
        verbose_name = _("sample")
        verbose_name_plural = _("samples")

    def __str__(self) -> str:
        return f"GPU {self.gpu_id} slot {self.slot} at {self.at:%Y-%m-%d %H:%M:%S}"


class Latest(Figures):
    gpu = models.ForeignKey(
        "pools.GpuCapacity", on_delete=models.CASCADE, related_name="latest_figures", verbose_name=_("GPU")
    )
    slot = models.SmallIntegerField(_("slot"))
    at = models.DateTimeField(_("at"))
    profile = models.CharField(_("profile"), max_length=32, blank=True)
    instance_uuid = models.CharField(_("instance UUID"), max_length=64, blank=True)
    source = models.CharField(_("source"), max_length=16)
    host = models.CharField(_("host"), max_length=253, blank=True)
    problems = models.JSONField(_("problems"), default=list, blank=True)

    class Meta:
        verbose_name = _("newest figures")
        verbose_name_plural = _("newest figures")
        # No index on what an upsert changes, and room left in each page (migration 0010: fillfactor), so
        # that the writer's update of a GPU's figures every 15 s stays on its page and touches no index.
        constraints = [models.UniqueConstraint(fields=["gpu", "slot"], name="latest_one_per_gpu_slot")]

    def __str__(self) -> str:
        return f"GPU {self.gpu_id} slot {self.slot} at {self.at:%Y-%m-%d %H:%M:%S}"


class Rollup(models.Model):
    pk = models.CompositePrimaryKey("gpu", "slot", "seconds", "bucket")
    gpu = models.ForeignKey(
        "pools.GpuCapacity", on_delete=models.DO_NOTHING, db_constraint=False, related_name="+"
    )
    slot = models.SmallIntegerField()
    seconds = models.PositiveIntegerField(help_text=_("300 or 3600"))
    bucket = models.DateTimeField(help_text=_("Start of the bucket."))
    samples = models.PositiveIntegerField()
    power_w_min = models.FloatField(null=True)
    power_w_avg = models.FloatField(null=True)
    power_w_max = models.FloatField(null=True)
    temperature_c_min = models.FloatField(null=True)
    temperature_c_avg = models.FloatField(null=True)
    temperature_c_max = models.FloatField(null=True)
    utilisation_pct_min = models.FloatField(null=True)
    utilisation_pct_avg = models.FloatField(null=True)
    utilisation_pct_max = models.FloatField(null=True)
    sm_active_pct_min = models.FloatField(null=True)
    sm_active_pct_avg = models.FloatField(null=True)
    sm_active_pct_max = models.FloatField(null=True)
    memory_used_bytes_min = models.BigIntegerField(null=True)
    memory_used_bytes_avg = models.BigIntegerField(null=True)
    memory_used_bytes_max = models.BigIntegerField(null=True)
    memory_total_bytes = models.BigIntegerField(null=True)

    class Meta:
        verbose_name = _("roll-up")
        verbose_name_plural = _("roll-ups")
        indexes = [models.Index(fields=["seconds", "bucket"], name="rollup_seconds_bucket")]

    def __str__(self) -> str:
        return f"GPU {self.gpu_id} slot {self.slot}, {self.seconds} s from {self.bucket:%Y-%m-%d %H:%M}"


class RollupMark(models.Model):
    """How far each resolution is rolled up: every bucket that ends before `done_until` is written, except
    from `redo_from` on, where samples arrived late (an agent's buffer, after the portal was away)."""

    seconds = models.PositiveIntegerField(primary_key=True)
    done_until = models.DateTimeField()
    redo_from = models.DateTimeField(null=True)

    def __str__(self) -> str:
        return f"{self.seconds} s roll-ups until {self.done_until:%Y-%m-%d %H:%M}"


class GpuEvent(models.Model):
    class Kind(models.TextChoices):
        XID = "xid", _("XID error")
        ECC = "ecc", _("uncorrected ECC error")
        LOST = "lost", _("GPU lost")
        LAYOUT = "layout", _("MIG layout differs")

    gpu = models.ForeignKey(
        "pools.GpuCapacity", on_delete=models.CASCADE, related_name="events", verbose_name=_("GPU")
    )
    at = models.DateTimeField(_("at"))
    kind = models.CharField(_("kind"), max_length=8, choices=Kind.choices)
    code = models.BigIntegerField(_("code"), null=True, blank=True, help_text=_("The XID, or the ECC count."))
    detail = models.CharField(_("detail"), max_length=500, blank=True)

    class Meta:
        ordering = ["-at", "-pk"]
        verbose_name = _("GPU event")
        verbose_name_plural = _("GPU events")
        indexes = [models.Index(fields=["gpu", "-at"], name="gpu_event_gpu_at")]

    def __str__(self) -> str:
        return f"{self.get_kind_display()} {self.code or ''} on {self.gpu_id} at {self.at:%Y-%m-%d %H:%M:%S}"
