"""The tenant page's small SM-activity charts: one per live pool, the newest few, each linking to its pool,
drawn by the same series as the pool page's chart and served under the tenant's address."""

import re
from datetime import UTC, datetime, timedelta

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.urls import reverse

from monitoring.collectors import GpuReading, Reading
from monitoring.ingest.readings import ingest
from monitoring.pages import charts
from monitoring.pages.tenant import TENANT_CHARTS
from monitoring.storage import samples
from pools.models import Allocation
from tests.factories import (
    AllocationFactory,
    ClusterFactory,
    GpuCapacityFactory,
    NodeCapacityFactory,
    PoolFactory,
)

NOW = datetime.now(UTC).replace(microsecond=0)


def tenant_page(client, slug: str = "acme") -> str:
    response = client.get(reverse("tenant", kwargs={"slug": slug}))
    assert response.status_code == 200
    return response.content.decode()


def chart_url(pool) -> str:
    return reverse(
        "pool-usage-chart",
        kwargs={"tenant_slug": pool.project.tenant.slug, "pk": pool.pk, "metric": "sm_active_pct"},
    )


def usage(page: str) -> str:
    """The tenant page's usage section, or "" when it has none."""
    if "tenant-usage" not in page:
        return ""
    start = page.index('class="card usage tenant-usage"')
    return page[start : page.index("</section>", start)]


@pytest.fixture
def busy_pool(tenancy):
    """An acme pool holding one full GPU that ran at 40 % in the last half hour."""
    cluster = ClusterFactory(name="sim")
    node = NodeCapacityFactory(cluster=cluster, name="gpu-node-1", gpu_model="H100-80GB", gpu_count=1)
    gpu = GpuCapacityFactory(node=node, index=0)
    pool = PoolFactory(project=tenancy.vision, cluster=cluster)
    AllocationFactory(pool=pool, gpu=gpu)
    Allocation.objects.update(allocated_at=NOW - timedelta(hours=1))
    readings = [
        Reading(
            host="gpu-node-1",
            at=NOW - timedelta(minutes=m),
            gpus=(GpuReading(0, gpu.uuid, sm_active_pct=40.0),),
        )
        for m in (12, 17, 22, 27)
    ]
    ingest(cluster=cluster, readings=readings, source="agent")
    samples.roll_up(now=NOW)  # a day's chart draws five-minute roll-ups
    return pool


def test_the_tenant_page_draws_each_live_pool_and_links_it(busy_pool, tenancy, client_for):
    PoolFactory(project=tenancy.vision, state="provisioning")
    released = PoolFactory(project=tenancy.vision, state="released")
    theirs = PoolFactory(project=tenancy.recsys)

    part = usage(tenant_page(client_for(tenancy.acme_viewer)))
    assert part.count('<img class="chart"') == 2
    assert f"{chart_url(busy_pool)}?range=24h&amp;size=small" in part
    assert f'href="{reverse("pool", kwargs={"tenant_slug": "acme", "pk": busy_pool.pk})}"' in part
    assert chart_url(released) not in part and chart_url(theirs) not in part


def test_the_small_chart_is_the_pools_own_series_drawn_small(busy_pool, tenancy, client_for):
    client = client_for(tenancy.acme_member)
    small = client.get(f"{chart_url(busy_pool)}?range=24h&size=small")
    assert small.status_code == 200 and small["Content-Type"] == "image/svg+xml"
    svg = small.content.decode()
    assert "No figures in this range" not in svg
    width, height = charts.SIZES["small"]
    assert re.search(rf'<svg[^>]* width="{width}"[^>]* height="{height}"', svg) or (
        f'viewBox="0 0 {width} {height}"' in svg
    )
    # The full chart of the pool page is unchanged by the size's parameter.
    full = client.get(f"{chart_url(busy_pool)}?range=24h").content.decode()
    assert 'viewBox="0 0 900 300"' in full and f'viewBox="0 0 {width} {height}"' in svg


def test_a_small_chart_without_figures_says_so(tenancy, client_for):
    waiting = PoolFactory(project=tenancy.vision, state="provisioning")
    small = client_for(tenancy.acme_member).get(f"{chart_url(waiting)}?range=24h&size=small")
    assert small.status_code == 200 and "No figures in this range" in small.content.decode()


def test_a_size_the_chart_does_not_know_is_refused(busy_pool, tenancy, client_for):
    answer = client_for(tenancy.acme_member).get(f"{chart_url(busy_pool)}?size=huge")
    assert answer.status_code == 400 and "Unknown size huge" in answer.content.decode()


def test_the_charts_are_limited_and_the_rest_are_a_link_away(tenancy, client_for):
    pools = [PoolFactory(project=tenancy.vision, reserved_at=NOW - timedelta(minutes=n)) for n in range(8)]
    part = usage(tenant_page(client_for(tenancy.acme_member)))
    assert part.count('<img class="chart"') == TENANT_CHARTS
    assert chart_url(pools[0]) in part and chart_url(pools[-1]) not in part
    assert reverse("tenant-pools", kwargs={"tenant_slug": "acme"}) in part


def test_no_live_pool_no_charts(tenancy, client_for):
    PoolFactory(project=tenancy.vision, state="released")
    assert usage(tenant_page(client_for(tenancy.acme_member))) == ""


def test_the_section_does_not_query_per_pool(tenancy, client_for):
    client = client_for(tenancy.acme_member)

    def queries() -> int:
        with CaptureQueriesContext(connection) as captured:
            tenant_page(client)
        return len(captured)

    PoolFactory(project=tenancy.vision)
    few = queries()
    PoolFactory.create_batch(5, project=tenancy.vision)
    assert queries() == few
