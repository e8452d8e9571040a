"""Prices: versioned per spec, never negative or overlapping, never rewriting metered time; the price in
force reaches the request form's estimate, the specs API and each pool's hourly cost."""

from datetime import UTC, datetime, timedelta
from decimal import Decimal

import pytest
from django.db import IntegrityError, transaction
from django.urls import reverse

from billing.models import Price
from billing.services import add_price, meter
from pools.services.inventory import sync_inventory
from portal.errors import InvalidInput
from tests.factories import ClusterFactory, PoolFactory, PriceFactory, PriceListFactory
from tests.pools.conftest import SMALL_FLEET

DAY = timedelta(days=1)


def price_args(**changes) -> dict:
    return {
        "price_list": PriceListFactory(name="list"),
        "gpu_model": "H100-80GB",
        "profile": "full",
        "hourly_price": Decimal("4200"),
        "valid_from": datetime.now(UTC),
        **changes,
    }


@pytest.mark.parametrize(
    ("changes", "words"),
    [
        ({"hourly_price": Decimal("-1")}, "negative"),
        ({"profile": "9g.99gb"}, "Unknown"),
        ({"gpu_model": "Z100"}, "Unknown spec"),
        ({"valid_to": datetime.now(UTC) - DAY}, "end after it starts"),
    ],
    ids=["negative", "unknown-profile", "unknown-model", "empty-range"],
)
def test_a_bad_price_is_refused_with_its_reason_and_nothing_is_written(changes, words, db):
    with pytest.raises(InvalidInput, match=words):
        add_price(**price_args(**changes))
    assert not Price.objects.exists()


def test_an_overlapping_price_is_refused_by_the_service_and_by_the_database(db):
    first = add_price(**price_args(valid_from=datetime.now(UTC) - DAY))
    with pytest.raises(InvalidInput, match="already has a price"):
        add_price(**price_args(valid_from=datetime.now(UTC) + DAY))
    with pytest.raises(IntegrityError), transaction.atomic():  # the constraint holds whatever the code does
        Price.objects.create(**price_args(valid_from=datetime.now(UTC) + DAY))
    with pytest.raises(IntegrityError), transaction.atomic():
        Price.objects.filter(pk=first.pk).update(hourly_price=Decimal("-5"))
    # Ending the first price makes room for the next one.
    Price.objects.filter(pk=first.pk).update(valid_to=datetime.now(UTC) + DAY)
    add_price(**price_args(valid_from=datetime.now(UTC) + DAY, hourly_price=Decimal("4500")))
    assert Price.objects.count() == 2


def test_metered_time_keeps_its_prices(db):
    start = datetime(2026, 11, 30, 15, tzinfo=UTC)
    PoolFactory(allocated=True, reserved_at=start, released_at=None)
    meter(now=start + timedelta(hours=2, minutes=5))  # metered up to start + 2 h
    with pytest.raises(InvalidInput, match="metered"):
        add_price(**price_args(valid_from=start + timedelta(hours=1)))
    add_price(**price_args(valid_from=start + timedelta(hours=2)))


def test_finance_edits_prices_in_the_admin_with_the_same_checks(db, staff_user, client):
    client.force_login(staff_user("finance"))
    price_list = PriceListFactory(name="list")
    form = {
        "price_list": price_list.pk,
        "gpu_model": "H100-80GB",
        "profile": "full",
        "hourly_price": "-3",
        "valid_from_0": "2027-01-01",
        "valid_from_1": "00:00:00",
    }
    response = client.post(reverse("admin:billing_price_add"), form)
    assert response.status_code == 200 and "cannot be negative" in response.content.decode()
    assert (
        client.post(reverse("admin:billing_price_add"), {**form, "hourly_price": "4200"}).status_code == 302
    )
    again = client.post(reverse("admin:billing_price_add"), {**form, "hourly_price": "4300"})
    assert again.status_code == 200 and "already has a price" in again.content.decode()
    assert Price.objects.count() == 1


def test_the_price_in_force_reaches_specs_estimates_and_pools(db, tenancy, api_for):
    sync_inventory(cluster=ClusterFactory(name="sim", fleet=SMALL_FLEET))
    client = api_for(tenancy.acme_member)
    specs = {s["id"]: s for s in client.get("/api/v1/specs/").json()["results"]}
    assert all(s["hourly_price"] is None for s in specs.values())
    PriceFactory(gpu_model="H100-80GB", profile="full", hourly_price=Decimal("4200"))
    PriceFactory(gpu_model="H100-80GB", profile="1g.10gb", hourly_price=Decimal("600"))
    specs = {s["id"]: s for s in client.get("/api/v1/specs/").json()["results"]}
    assert Decimal(specs["h100-80gb.full"]["hourly_price"]) == Decimal("4200")
    assert Decimal(specs["h100-80gb.mig-1g.10gb"]["hourly_price"]) == Decimal("600")
    assert specs["h100-80gb.mig-2g.20gb"]["hourly_price"] is None
    pool = PoolFactory(allocated=True, project=tenancy.vision, request__items=[("h100-80gb.mig-1g.10gb", 3)])
    shown = client.get(f"/api/v1/pools/{pool.pk}/").json()
    assert Decimal(shown["hourly_cost"]) == Decimal("1800")
