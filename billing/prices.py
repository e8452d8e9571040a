"""Prices: which is in force for a spec at a moment, the checks on a new or changed price, and the
lookup that pools' estimates use (`pools.pricing`), cached until a price changes."""

from __future__ import annotations

from datetime import datetime, timedelta
from decimal import Decimal

from django.core.cache import cache
from django.db import transaction
from django.db.models import Max, Q, QuerySet
from django.utils import timezone
from django.utils.translation import gettext as _

from billing.conf import settings
from billing.models import MeteredPeriod, Price
from pools.specs import Spec, UnknownSpec, parse_spec
from portal.errors import InvalidInput

CACHE_KEY = "billing:prices-now"
CACHE_SECONDS = 60  # also bounds how late a price that starts by the clock is seen


def valid_during(start: datetime, end: datetime) -> QuerySet[Price]:
    """Every price in force at some moment of [start, end]."""
    return Price.objects.filter(Q(valid_to__isnull=True) | Q(valid_to__gt=start), valid_from__lte=end)


def in_force(at: datetime) -> dict[tuple[str, str], Decimal]:
    """(GPU model, profile) → hourly price of every price valid at `at`."""
    rows = valid_during(at, at)
    return {
        (model, profile): price
        for model, profile, price in rows.values_list("gpu_model", "profile", "hourly_price")
    }


def in_force_over(first: datetime, last: datetime) -> list[tuple[datetime, dict[tuple[str, str], Decimal]]]:
    """What `in_force` gives at every moment of [first, last], in one query: (since, table) pairs, oldest
    first, the first since `first`, each table in force until the next pair's `since`."""
    fields = ("gpu_model", "profile", "hourly_price", "valid_from", "valid_to")
    rows = list(valid_during(first, last).values_list(*fields))
    bounds = {bound for *_spec, since, until in rows for bound in (since, until) if bound is not None}
    return [
        (
            at,
            {
                (model, profile): price
                for model, profile, price, since, until in rows
                if since <= at and (until is None or until > at)
            },
        )
        for at in sorted({first, *(bound for bound in bounds if first < bound <= last)})
    ]


def forget_cached() -> None:
    cache.delete(CACHE_KEY)


def forget_after_change(sender, **kwargs) -> None:
    """Signal receiver: a price was saved or deleted."""
    transaction.on_commit(forget_cached)
    forget_cached()


def hourly_price(spec: Spec) -> Decimal | None:
    """The price in force now; registered as the price lookup of `pools.pricing`."""
    table = cache.get(CACHE_KEY)
    if table is None:
        table = in_force(timezone.now())
        cache.set(CACHE_KEY, table, CACHE_SECONDS)
    return table.get((spec.gpu_model, spec.profile))


def metered_until() -> datetime | None:
    """The end of the last metered period: a price may not start or change before it."""
    last = MeteredPeriod.objects.aggregate(last=Max("start"))["last"]
    return None if last is None else last + timedelta(seconds=settings.METERING_PERIOD_SECONDS)


def check_price(price: Price, *, before: Price | None = None) -> None:
    """Refuse a price that is unknown, negative, empty, overlapping another of its spec, or that would
    rewrite time already metered. `before` is the stored price when an existing one is changed."""
    try:
        spec = parse_spec(Spec(price.gpu_model, price.profile).id)
    except UnknownSpec as error:
        raise InvalidInput(str(error), field="profile") from error
    if spec.profile != price.profile:
        raise InvalidInput(_("Unknown profile %(profile)s.") % {"profile": price.profile}, field="profile")
    if price.hourly_price is None or price.hourly_price < 0:
        raise InvalidInput(_("A price cannot be negative."), field="hourly_price")
    if price.valid_from is None:
        raise InvalidInput(_("Say from when the price applies."), field="valid_from")
    if price.valid_to is not None and price.valid_to <= price.valid_from:
        raise InvalidInput(_("A price must end after it starts."), field="valid_to")
    frozen = metered_until()
    if frozen is not None:
        _check_not_rewriting(price, before, frozen)
    overlapping = Price.objects.filter(gpu_model=price.gpu_model, profile=price.profile).exclude(pk=price.pk)
    overlapping = overlapping.filter(Q(valid_to__isnull=True) | Q(valid_to__gt=price.valid_from))
    if price.valid_to is not None:
        overlapping = overlapping.filter(valid_from__lt=price.valid_to)
    clash = overlapping.first()
    if clash is not None:
        raise InvalidInput(
            _("%(spec)s already has a price over that time (%(clash)s); end it first.")
            % {"spec": spec.id, "clash": clash},
            field="valid_from",
        )


def _check_not_rewriting(price: Price, before: Price | None, frozen: datetime) -> None:
    changed_past = (
        before is not None
        and before.valid_from < frozen
        and (
            before.hourly_price != price.hourly_price
            or before.valid_from != price.valid_from
            or (before.gpu_model, before.profile) != (price.gpu_model, price.profile)
        )
    )
    if changed_past or (before is None and price.valid_from < frozen):
        raise InvalidInput(
            _(
                "Usage up to %(frozen)s is metered with the prices then in force; a new price starts "
                "at %(frozen)s or later."
            )
            % {"frozen": timezone.localtime(frozen).strftime("%Y-%m-%d %H:%M")},
            field="valid_from",
        )
    if (
        before is not None
        and price.valid_to is not None
        and price.valid_to < frozen
        and (before.valid_to is None or before.valid_to != price.valid_to)
    ):
        raise InvalidInput(
            _("Usage up to %(frozen)s is metered; a price can end there at the earliest.")
            % {"frozen": timezone.localtime(frozen).strftime("%Y-%m-%d %H:%M")},
            field="valid_to",
        )
