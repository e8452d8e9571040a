"""Billing records: price lists with their versioned hourly prices, and what metering wrote.

Prices per spec (a GPU model with a MIG profile, or `full`) are valid over a time range; two
prices of one spec never overlap (a PostgreSQL exclusion constraint), none is negative. Metering
copies the price in force onto each usage record, so a later price never rewrites metered usage.
"""

from __future__ import annotations

from django.contrib.postgres.constraints import ExclusionConstraint
from django.contrib.postgres.fields import DateTimeRangeField, RangeBoundary, RangeOperators
from django.db import models
from django.utils.translation import gettext_lazy as _

from pools.specs import Spec

MONEY = {"max_digits": 14, "decimal_places": 4}


class PriceList(models.Model):
    """A set of prices published together, e.g. "2027 list"; its prices say when each applies. Every
    price is in the deployment's currency (BILLING_CURRENCY)."""

    name = models.CharField(_("name"), max_length=100, unique=True)
    description = models.TextField(_("description"), blank=True)
    created_at = models.DateTimeField(_("created"), auto_now_add=True)

    class Meta:
        ordering = ["-created_at"]
        verbose_name = _("price list")
        verbose_name_plural = _("price lists")

    def __str__(self) -> str:
        return self.name


class TsTzRange(models.Func):
    function = "TSTZRANGE"
    output_field = DateTimeRangeField()


class Price(models.Model):
    price_list = models.ForeignKey(
        PriceList, on_delete=models.PROTECT, related_name="prices", verbose_name=_("price list")
    )
    gpu_model = models.CharField(_("GPU model"), max_length=32)
    profile = models.CharField(_("profile"), max_length=32, help_text=_("A MIG profile, or full."))
    hourly_price = models.DecimalField(_("hourly price"), **MONEY, help_text=_("Per instance (or GPU) hour."))
    valid_from = models.DateTimeField(_("valid from"))
    valid_to = models.DateTimeField(
        _("valid until"), null=True, blank=True, help_text=_("Empty: until changed.")
    )

    class Meta:
        ordering = ["gpu_model", "profile", "valid_from"]
        verbose_name = _("price")
        verbose_name_plural = _("prices")
        constraints = [
            models.CheckConstraint(condition=models.Q(hourly_price__gte=0), name="price_not_negative"),
            models.CheckConstraint(
                condition=models.Q(valid_to__isnull=True) | models.Q(valid_to__gt=models.F("valid_from")),
                name="price_range_not_empty",
            ),
            ExclusionConstraint(
                name="price_no_overlap",
                expressions=[
                    ("gpu_model", RangeOperators.EQUAL),
                    ("profile", RangeOperators.EQUAL),
                    (TsTzRange("valid_from", "valid_to", RangeBoundary()), RangeOperators.OVERLAPS),
                ],
            ),
        ]

    def __str__(self) -> str:
        return f"{self.spec.id} {self.hourly_price} from {self.valid_from:%Y-%m-%d %H:%M}"

    @property
    def spec(self) -> Spec:
        return Spec(self.gpu_model, self.profile)


class MeteredPeriod(models.Model):
    """A period metered in full: every pool that held anything in it has its usage records."""

    start = models.DateTimeField(_("period start"), unique=True)
    records = models.PositiveIntegerField(_("usage records written"), default=0)
    metered_at = models.DateTimeField(_("metered"), auto_now_add=True)

    class Meta:
        ordering = ["-start"]
        verbose_name = _("metered period")
        verbose_name_plural = _("metered periods")

    def __str__(self) -> str:
        return f"{self.start:%Y-%m-%d %H:%M} UTC"


class UsageRecord(models.Model):
    """Instance-seconds of one spec a pool held in one period, with the price in force then."""

    pool = models.ForeignKey(
        "pools.Pool", on_delete=models.PROTECT, related_name="usage", verbose_name=_("pool")
    )
    gpu_model = models.CharField(_("GPU model"), max_length=32)
    profile = models.CharField(_("profile"), max_length=32)
    period_start = models.DateTimeField(_("period start"))
    count = models.PositiveSmallIntegerField(_("instances"))
    seconds = models.PositiveIntegerField(_("instance-seconds"))
    unit_price = models.DecimalField(
        _("hourly price"), **MONEY, null=True, blank=True, help_text=_("Empty when no price was in force.")
    )
    currency = models.CharField(_("currency"), max_length=3)
    metered_at = models.DateTimeField(_("metered"), auto_now_add=True)

    class Meta:
        ordering = ["-period_start", "pool_id"]
        verbose_name = _("usage record")
        verbose_name_plural = _("usage records")
        constraints = [
            # A second, concurrent or late metering run writes nothing twice.
            models.UniqueConstraint(
                fields=["pool", "gpu_model", "profile", "period_start"], name="usage_once"
            ),
            models.CheckConstraint(condition=models.Q(seconds__gt=0), name="usage_seconds_positive"),
        ]
        indexes = [models.Index(fields=["period_start"], name="usage_period")]

    def __str__(self) -> str:
        return f"pool #{self.pool_id} {self.spec.id} {self.period_start:%Y-%m-%d %H:%M}: {self.seconds} s"

    @property
    def spec(self) -> Spec:
        return Spec(self.gpu_model, self.profile)
