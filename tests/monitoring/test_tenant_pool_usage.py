"""The tenant's own pool usage: its SM activity and memory charts on the pool page, in the range it
chooses, served under the tenant's address only, from the same hand-made fleet as the operators' pages."""

from datetime import timedelta

import pytest
from django.urls import reverse

from monitoring.ingest.readings import ingest
from pools.models import Allocation
from tests.monitoring import test_fleet_pages as pages

pytestmark = pytest.mark.django_db

NOW, reading = pages.NOW, pages.reading
fleet, reported = pages.fleet, pages.reported


def _pool_page(pool):
    return reverse("pool", kwargs={"tenant_slug": pool.project.tenant.slug, "pk": pool.pk})


def _usage_chart(pool, metric="sm_active_pct", tenant_slug=None):
    slug = tenant_slug or pool.project.tenant.slug
    return reverse("pool-usage-chart", kwargs={"tenant_slug": slug, "pk": pool.pk, "metric": metric})


def test_the_pool_page_shows_its_usage_charts_in_the_chosen_range(reported, tenancy, client):
    client.force_login(tenancy.acme_viewer)

    page = client.get(_pool_page(reported.acme_pool) + "?usage_range=7d").content.decode()

    assert "Usage" in page
    assert f"{_usage_chart(reported.acme_pool)}?range=7d" in page
    assert f"{_usage_chart(reported.acme_pool, 'memory_used_bytes')}?range=7d" in page


def test_a_range_the_section_does_not_know_falls_back_and_says_so(reported, tenancy, client):
    client.force_login(tenancy.acme_member)

    answer = client.get(_pool_page(reported.acme_pool) + "?usage_range=forever")

    assert answer.status_code == 200
    page = answer.content.decode()
    assert "Unknown range forever" in page and f"{_usage_chart(reported.acme_pool)}?range=24h" in page


@pytest.mark.parametrize("metric", ["sm_active_pct", "memory_used_bytes"])
def test_the_usage_chart_is_the_tenants_own(metric, reported, tenancy, client):
    Allocation.objects.update(allocated_at=NOW - timedelta(minutes=10))
    ingest(
        cluster=reported.cluster,
        readings=[reading(reported, at=NOW - timedelta(minutes=m)) for m in (2, 3, 4)],
        source="agent",
    )
    client.force_login(tenancy.acme_member)
    own = client.get(_usage_chart(reported.acme_pool, metric) + "?range=1h")
    assert own.status_code == 200 and own["Content-Type"] == "image/svg+xml"
    assert "No figures in this range" not in own.content.decode()
    assert "default-src 'none'" in own["Content-Security-Policy"]

    client.force_login(tenancy.globex_member)
    assert client.get(_usage_chart(reported.acme_pool, metric)).status_code == 404
    # Naming their own tenant in the address does not help either.
    assert client.get(_usage_chart(reported.acme_pool, metric, tenant_slug="globex")).status_code == 404
    assert client.get(_usage_chart(reported.globex_pool, metric)).status_code == 200


@pytest.mark.parametrize(
    ("metric", "query", "status"), [("power_w", "", 404), ("sm_active_pct", "range=1y", 400)]
)
def test_a_tenant_chart_refuses_what_it_does_not_draw(metric, query, status, reported, tenancy, client):
    client.force_login(tenancy.acme_member)

    answer = client.get(f"{_usage_chart(reported.acme_pool, metric)}?{query}")

    assert answer.status_code == status
