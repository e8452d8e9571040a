"""The tenant page's cost section: the month to date and the projection to the month's end, per project and
for the tenant, are billing's own figures (`billing.spend`), the ones metering and invoices agree with."""

from datetime import UTC, datetime, timedelta
from decimal import Decimal

import pytest
from django.urls import reverse
from django.utils import timezone

from billing import spend
from pools.models import Pool
from tests.factories import PoolFactory, PriceFactory, ProjectFactory

NOW = datetime(2026, 11, 10, 3, tzinfo=UTC)


@pytest.fixture
def frozen(monkeypatch):
    monkeypatch.setattr(timezone, "now", lambda: NOW)


def test_the_tenant_section_shows_billings_own_to_date_and_projection(tenancy, frozen, client_for):
    PriceFactory(
        gpu_model="H100-80GB",
        profile="full",
        hourly_price=Decimal("4200"),
        valid_from=NOW - timedelta(days=90),
    )
    training = ProjectFactory(tenant=tenancy.acme, name="Training")
    PoolFactory(
        allocated=True,
        project=tenancy.vision,
        request__items=[("h100-80gb.full", 2)],
        reserved_at=NOW - timedelta(hours=5),
    )
    PoolFactory(
        allocated=True,
        project=training,
        request__items=[("h100-80gb.full", 1)],
        reserved_at=NOW - timedelta(days=3),
        released_at=NOW - timedelta(days=1),
        state="released",
    )
    PoolFactory(
        allocated=True, project=tenancy.recsys, reserved_at=NOW - timedelta(days=2)
    )  # globex's: not in acme's total

    found = spend.pool_spend(pools=Pool.objects.filter(project__tenant=tenancy.acme), now=NOW)
    total = spend.figures(spend.total(found.values()))
    # Worked out by hand: 2 GPUs for 5 h and 1 GPU for 48 h at 4,200 an hour, then 2 GPUs to the month's end.
    assert total.to_date == 4200 * (2 * 5 + 48)
    assert total.projected == total.to_date + 2 * 4200 * (20 * 24 + 12)

    page = client_for(tenancy.acme_viewer).get(reverse("tenant", kwargs={"slug": "acme"})).content.decode()
    cost = page[page.index("Cost in 2026-11") :]
    cost = cost[: cost.index("</section>")]
    footer = cost[cost.index("<tfoot>") :]
    assert f"{total.to_date:,}" in footer and f"{total.projected:,}" in footer
    assert "Training" in cost and "This month to date" in cost and "Projected to the month" in cost
