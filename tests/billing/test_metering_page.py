"""Operators and finance see how far metering has come; tenants do not learn the page exists."""

from datetime import UTC, datetime, timedelta

from django.urls import reverse

from billing.services import meter
from tests.factories import PoolFactory


def test_operators_see_the_lag_and_the_metered_periods(db, client_for, staff_user, tenancy):
    url = reverse("billing-metering")
    operator = client_for(staff_user("operator"))
    assert url in operator.get("/", follow=True).content.decode()  # linked in the top bar
    assert "up to date" in operator.get(url).content.decode() or "none" in operator.get(url).content.decode()
    PoolFactory(allocated=True, reserved_at=datetime.now(UTC) - timedelta(hours=6), released_at=None)
    page = operator.get(url).content.decode()
    assert "behind" in page and "Nothing metered yet" in page
    meter()
    page = operator.get(url).content.decode()
    assert "up to date" in page and "Nothing metered yet" not in page


def test_tenants_get_a_404(db, client_for, tenancy):
    assert client_for(tenancy.acme_admin).get(reverse("billing-metering")).status_code == 404
    assert reverse("billing-metering") not in client_for(tenancy.acme_admin).get("/").content.decode()
