"""The fleet's figures and the pages that show them: allocated against used, hottest and idlest, each
tenant's efficiency from roll-ups, a GPU's and a pool's charts for operators, and the tenant's own pool
usage — from hand-made samples, with the numbers worked out here."""

import re
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

import pytest
from django.contrib.auth.models import Group, Permission
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.urls import reverse

from monitoring import samples, selectors
from monitoring.agents import issue_agent_token
from monitoring.collectors import GpuReading, InstanceReading, Reading
from monitoring.ingest import ingest
from monitoring.models import CollectorStatus, GpuEvent
from pools.models import Allocation
from tests.factories import (
    AllocationFactory,
    ClusterFactory,
    GpuCapacityFactory,
    NodeCapacityFactory,
    PoolFactory,
    UserFactory,
)

pytestmark = pytest.mark.django_db

NOW = datetime.now(UTC).replace(microsecond=0)
GIB = 2**30


@dataclass
class Fleet:
    cluster: object
    other: object
    full: object  # GPU 0: MIG off, held whole by acme
    cut: object  # GPU 1: two 3g.40gb instances; the one at 0 held by globex, the one at 4 free
    spare: object  # the other cluster's GPU: nobody holds it, it never reported
    acme_pool: object
    globex_pool: object


def reading(fleet, *, at=NOW, full_sm=50.0, held_sm=20.0, free_sm=90.0, **figures):
    """One reading of the node: the full GPU at `full_sm`, the held instance at `held_sm`."""
    held, free = sorted(fleet.cut.layout, key=lambda entry: entry["start"])
    instances = tuple(
        InstanceReading(
            uuid=entry["uuid"],
            gpu_instance_id=n + 1,
            profile=entry["profile"],
            placement=(entry["start"], 4),
            memory_used_bytes=(n + 1) * GIB,
            memory_total_bytes=40 * GIB,
            sm_active_pct=sm,
        )
        for n, (entry, sm) in enumerate([(held, held_sm), (free, free_sm)])
    )
    whole = {"power_w": 300.0, "temperature_c": 70.0, "utilisation_pct": 60.0, "sm_active_pct": full_sm}
    return Reading(
        host="gpu-node-1",
        at=at,
        gpus=(
            GpuReading(
                0,
                fleet.full.uuid,
                memory_used_bytes=10 * GIB,
                memory_total_bytes=80 * GIB,
                ecc_corrected=3,
                ecc_uncorrected=0,
                **{**whole, **figures},
            ),
            GpuReading(
                1,
                fleet.cut.uuid,
                mig_enabled=True,
                power_w=200.0,
                temperature_c=80.0,
                memory_total_bytes=80 * GIB,
                instances=instances,
            ),
        ),
    )


@pytest.fixture
def fleet(tenancy):
    cluster = ClusterFactory(name="sim")
    node = NodeCapacityFactory(cluster=cluster, name="gpu-node-1", gpu_model="H100-80GB", gpu_count=2)
    full = GpuCapacityFactory(node=node, index=0)
    cut = GpuCapacityFactory(node=node, index=1, mig={"3g.40gb": 2})
    other = ClusterFactory(name="other")
    spare = GpuCapacityFactory(node=NodeCapacityFactory(cluster=other, name="n2"), index=0)
    acme_pool = PoolFactory(project=tenancy.vision, cluster=cluster)
    globex_pool = PoolFactory(project=tenancy.recsys, cluster=cluster)
    AllocationFactory(pool=acme_pool, gpu=full)
    AllocationFactory(pool=globex_pool, gpu=cut, profile="3g.40gb")
    return Fleet(cluster, other, full, cut, spare, acme_pool, globex_pool)


@pytest.fixture
def reported(fleet):
    ingest(cluster=fleet.cluster, readings=[reading(fleet)], source="agent")
    return fleet


@pytest.fixture
def operator(db):
    user = UserFactory(username="oscar", is_staff=True)
    user.user_permissions.add(
        Permission.objects.get(codename="view_latest", content_type__app_label="monitoring")
    )
    return user


# --- the figures ----------------------------------------------------------------------------------


def test_allocated_against_used_per_cluster(reported):
    other, sim = selectors.cluster_usage()

    assert (sim.name, sim.gpus, sim.reporting, sim.compute_total) == ("sim", 2, 2, 14)
    # acme holds a full GPU (7 slices) at 50 %, globex a 3g instance (3 slices) at 20 %; the free
    # instance's 90 % counts for nobody.
    assert (sim.allocated, sim.measured) == (10, 10)
    assert sim.used == pytest.approx(7 * 0.5 + 3 * 0.2)
    assert sim.efficiency == pytest.approx(0.41)
    assert sim.allocated_share == pytest.approx(10 / 14)
    assert sim.power_w == 500.0
    assert (sim.memory_used_bytes, sim.memory_total_bytes) == (10 * GIB, 160 * GIB)
    assert (other.name, other.gpus, other.reporting, other.allocated, other.efficiency) == (
        "other",
        1,
        0,
        0,
        None,
    )
    totals = selectors.fleet_totals([sim, other])
    assert (totals.gpus, totals.compute_total, totals.allocated) == (3, 21, 10)
    assert totals.efficiency == pytest.approx(0.41)


def test_stale_figures_are_not_now(fleet):
    ingest(cluster=fleet.cluster, readings=[reading(fleet, at=NOW - timedelta(minutes=30))], source="agent")

    sim = selectors.cluster_usage()[1]
    assert (sim.reporting, sim.allocated, sim.measured, sim.used, sim.coverage) == (0, 10, 0, 0.0, 0.0)
    assert selectors.hottest() == [] and selectors.idlest() == []


def test_hottest_and_idlest(reported):
    hottest = selectors.hottest()
    assert [(row.gpu_id, row.temperature_c) for row in hottest] == [
        (reported.cut.pk, 80.0),
        (reported.full.pk, 70.0),
    ]

    idlest = selectors.idlest()
    assert [(row.gpu_id, row.slot, row.sm_active_pct, row.tenant) for row in idlest] == [
        (reported.cut.pk, 0, 20.0, "globex"),
        (reported.full.pk, -1, 50.0, "acme"),
    ]
    assert selectors.idlest(limit=1)[0].pool_id == reported.globex_pool.pk


def _hours_of_samples(gpu_id, slot, start, hours, sm):
    rows = [
        samples.Row(gpu_id, slot, start + timedelta(minutes=minute), sm_active_pct=sm)
        for minute in range(0, int(hours * 60))
    ]
    samples.store(rows)


def test_tenant_efficiency_from_roll_ups_counts_each_allocation_only_while_held(fleet):
    t0 = (NOW - timedelta(hours=5)).replace(minute=0, second=0)
    Allocation.objects.update(allocated_at=t0)
    # globex released its instance after 90 minutes; its slot went on reporting for someone else.
    Allocation.objects.filter(pool=fleet.globex_pool).update(released_at=t0 + timedelta(minutes=90))
    _hours_of_samples(fleet.full.pk, -1, t0, 2, sm=50.0)
    _hours_of_samples(fleet.cut.pk, 0, t0, 2, sm=20.0)
    samples.roll_up(now=t0 + timedelta(hours=2, minutes=10))

    rows = {row.slug: row for row in selectors.tenant_efficiency(start=t0, end=t0 + timedelta(hours=2))}

    acme, globex = rows["acme"], rows["globex"]
    assert acme.allocated_hours == pytest.approx(14.0)  # 7 slices × 2 h
    assert acme.measured_hours == pytest.approx(14.0)
    assert acme.used_hours == pytest.approx(7.0)
    assert acme.efficiency == pytest.approx(0.5)
    assert globex.allocated_hours == pytest.approx(4.5)  # 3 slices × 1.5 h, not 2 h
    assert globex.used_hours == pytest.approx(0.9)
    assert globex.efficiency == pytest.approx(0.2) and globex.coverage == pytest.approx(1.0)
    # Half the range was not reported at all: allocated, not measured.
    later = selectors.tenant_efficiency(start=t0 + timedelta(hours=1), end=t0 + timedelta(hours=3))
    acme_later = next(row for row in later if row.slug == "acme")
    assert acme_later.allocated_hours == pytest.approx(14.0)
    assert acme_later.coverage == pytest.approx(0.5)
    assert acme_later.efficiency == pytest.approx(0.5)


def test_the_gpu_table_filters_and_sorts(reported):
    by = lambda **kw: [gpu.pk for gpu in selectors.gpu_table(**kw)]  # noqa: E731
    full, cut, spare = reported.full.pk, reported.cut.pk, reported.spare.pk

    assert by() == [spare, full, cut]  # by cluster, node and index: "other" comes before "sim"
    assert by(cluster="sim") == [full, cut]
    assert by(state="allocated") == [full, cut]
    assert by(state="silent") == [spare]
    assert by(state="free") == [spare]
    assert by(sort="-temperature") == [cut, full, spare]  # the silent GPU has none: last either way
    assert by(sort="temperature") == [full, cut, spare]
    # The MIG GPU's SM activity is its instances' average: (20 + 90) / 2.
    assert by(sort="-sm") == [cut, full, spare]
    assert next(g for g in selectors.gpu_table() if g.pk == cut).sm == pytest.approx(55.0)
    assert by(sort="no-such-order") == by()


def test_a_pool_series_holds_only_its_own_time(fleet):
    held_from = NOW - timedelta(minutes=30)
    Allocation.objects.filter(pool=fleet.globex_pool).update(allocated_at=held_from)
    before = [
        samples.Row(fleet.cut.pk, 0, held_from - timedelta(minutes=m), sm_active_pct=99.0) for m in (5, 10)
    ]
    during = [
        samples.Row(fleet.cut.pk, 0, held_from + timedelta(minutes=m), sm_active_pct=30.0) for m in (5, 10)
    ]
    samples.store(before + during)

    found = selectors.pool_series(
        pool=fleet.globex_pool, metric="sm_active_pct", start=NOW - timedelta(hours=1), end=NOW
    )

    assert found.resolution == 0 and found.instances == 1
    assert [point.value for point in found.points] == [30.0, 30.0]


def test_gpus_read_at_different_instants_add_up_in_one_point(fleet):
    minute = NOW.replace(second=0) - timedelta(minutes=10)
    samples.store(
        [
            samples.Row(fleet.full.pk, -1, minute + timedelta(seconds=3), memory_used_bytes=2 * GIB),
            samples.Row(fleet.cut.pk, -1, minute + timedelta(seconds=41), memory_used_bytes=5 * GIB),
        ]
    )

    _res, points = samples.series(metric="memory_used_bytes", start=NOW - timedelta(hours=1), end=NOW)

    assert [(p.at, p.value) for p in points] == [(minute, 7.0 * GIB)]


# --- the operators' pages -------------------------------------------------------------------------

OPERATOR_PAGES = [
    lambda f: reverse("monitoring-fleet"),
    lambda f: reverse("monitoring-gpu", kwargs={"pk": f.cut.pk}),
    lambda f: reverse("monitoring-gpu-chart", kwargs={"pk": f.cut.pk, "metric": "sm_active_pct"}),
    lambda f: reverse("monitoring-pool", kwargs={"pk": f.acme_pool.pk}),
    lambda f: reverse("monitoring-pool-chart", kwargs={"pk": f.acme_pool.pk, "metric": "memory_used_bytes"}),
]


@pytest.mark.parametrize("url", OPERATOR_PAGES)
def test_operators_see_the_pages_and_nobody_else_learns_they_exist(
    url, reported, operator, tenancy, staff_user, client
):
    address = url(reported)
    client.force_login(operator)
    assert client.get(address).status_code == 200
    for user in (tenancy.acme_admin, tenancy.globex_member, staff_user("finance")):
        client.force_login(user)
        assert client.get(address).status_code == 404
    client.logout()
    assert client.get(address).status_code == 302


def test_the_fleet_page_shows_the_figures(reported, operator, client):
    GpuEvent.objects.create(
        gpu=reported.cut, at=NOW, kind=GpuEvent.Kind.XID, code=79, detail="fell off the bus"
    )
    client.force_login(operator)

    page = client.get(reverse("monitoring-fleet")).content.decode()

    assert "10 / 21" in page and "10 (71 %)" in page  # compute slices allocated: fleet, and sim
    assert "4.1" in page and "41 %" in page  # used, and used of measured
    assert "500 W" in page
    assert "fell off the bus" in page
    assert f'href="/monitoring/pools/{reported.globex_pool.pk}/"' in page  # idlest: globex's instance
    assert "gpu-node-1/1" in page and "n2/0" in page
    assert 'href="/monitoring/"' in page  # the nav link


def test_the_gpu_page_names_each_instance_and_its_holder(reported, operator, client):
    client.force_login(operator)

    page = client.get(reverse("monitoring-gpu", kwargs={"pk": reported.cut.pk})).content.decode()

    assert "3g.40gb @0" in page and "3g.40gb @4" in page
    assert "globex/recsys" in page
    for metric in ("power_w", "temperature_c", "sm_active_pct", "utilisation_pct", "memory_used_bytes"):
        assert f"/monitoring/gpus/{reported.cut.pk}/{metric}.svg?range=24h" in page


def test_a_chart_is_an_svg_that_runs_and_loads_nothing(reported, operator, client):
    client.force_login(operator)

    answer = client.get(
        reverse("monitoring-gpu-chart", kwargs={"pk": reported.cut.pk, "metric": "sm_active_pct"})
        + "?range=1h"
    )

    assert answer.status_code == 200 and answer["Content-Type"] == "image/svg+xml"
    svg = answer.content.decode()
    assert svg.lstrip().startswith("<?xml") and "<script" not in svg
    assert set(re.findall(r"https?://[^\"'\s)]*", svg)) <= {
        "http://www.w3.org/2000/svg",
        "http://www.w3.org/1999/xlink",
    }
    assert "3g.40gb @0 · globex/recsys" in svg and "3g.40gb @4" in svg
    policy = answer["Content-Security-Policy"]
    assert "default-src 'none'" in policy and "script-src 'none'" in policy


@pytest.mark.parametrize(
    ("url", "query", "status"),
    [
        (lambda f: reverse("monitoring-gpu", kwargs={"pk": f.cut.pk}), "range=1y", 400),
        (lambda f: reverse("monitoring-pool", kwargs={"pk": f.acme_pool.pk}), "range=", 200),
        (
            lambda f: reverse("monitoring-gpu-chart", kwargs={"pk": f.cut.pk, "metric": "power_w"}),
            "range=2h",
            400,
        ),
        (
            lambda f: reverse("monitoring-gpu-chart", kwargs={"pk": f.cut.pk, "metric": "fan_rpm"}),
            "range=1h",
            404,
        ),
        (
            lambda f: reverse("monitoring-pool-chart", kwargs={"pk": f.acme_pool.pk, "metric": "power_w"}),
            "",
            404,
        ),
        (lambda f: reverse("monitoring-gpu", kwargs={"pk": 999999}), "", 404),
        (lambda f: reverse("monitoring-fleet"), "sort=-fan&state=melted&cluster=nowhere&range=1y", 400),
        (
            lambda f: reverse("monitoring-fleet"),
            "page=x&events_page=-3&tenants_page=99999999999999999999",
            200,
        ),
        (lambda f: reverse("monitoring-fleet"), "sort=-power&state=allocated&cluster=sim&range=7d", 200),
    ],
)
def test_bad_ranges_orders_and_pages_are_4xx_never_5xx(url, query, status, reported, operator, client):
    client.force_login(operator)

    answer = client.get(f"{url(reported)}?{query}")

    assert answer.status_code == status
    if query == "range=1y":
        assert "Unknown range 1y: choose one of 1h, 6h, 24h, 7d, 30d." in answer.content.decode()


def test_a_refused_filter_says_why_and_shows_no_gpu_table(reported, operator, client):
    client.force_login(operator)

    answer = client.get(reverse("monitoring-fleet") + "?state=melted")

    assert answer.status_code == 400
    assert answer.context["form"].errors["state"] and answer.context["rows"] == []
    assert "GPUs reporting" in answer.content.decode()


def test_the_fleet_page_costs_the_same_queries_for_one_gpu_or_many(fleet, operator, client, tenancy):
    client.force_login(operator)
    ingest(cluster=fleet.cluster, readings=[reading(fleet)], source="agent")
    GpuEvent.objects.create(gpu=fleet.cut, at=NOW, kind=GpuEvent.Kind.LOST)
    client.get(reverse("monitoring-fleet"))  # warm up: sessions, content types
    with CaptureQueriesContext(connection) as few:
        assert client.get(reverse("monitoring-fleet")).status_code == 200
    node = NodeCapacityFactory(cluster=fleet.other, name="n3", gpu_model="H100-80GB")
    for index in range(6):
        gpu = GpuCapacityFactory(node=node, index=index)
        AllocationFactory(pool=PoolFactory(project=tenancy.vision, cluster=fleet.other), gpu=gpu)
        GpuEvent.objects.create(gpu=gpu, at=NOW, kind=GpuEvent.Kind.LOST)
    with CaptureQueriesContext(connection) as many:
        assert client.get(reverse("monitoring-fleet")).status_code == 200
    assert len(many) == len(few)


# --- the tenant's pool page -----------------------------------------------------------------------


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


@pytest.mark.parametrize("role, status", [("operator", 200), ("approver", 200), ("finance", 404)])
def test_the_platform_groups_open_the_pages_as_their_roles_say(role, status, reported, client):
    """The roles migration grants the pages' permission to operators and approvers, not to finance."""
    user = UserFactory(username="olga", is_staff=True)
    user.groups.add(Group.objects.get(name=role))
    client.force_login(user)
    assert client.get(reverse("monitoring-fleet")).status_code == status


def test_the_fleet_page_says_how_each_clusters_figures_arrive(reported, operator, client):
    agents = ClusterFactory(name="onprem", driver="kubernetes")
    issue_agent_token(cluster=agents, name="node-7")
    CollectorStatus.objects.create(
        cluster=reported.cut.node.cluster,
        source="dcgm",
        last_run_at=NOW,
        last_error="Prometheus at x: timed out",
    )
    client.force_login(operator)

    rows = {row.cluster: row for row in selectors.collection_status()}
    page = client.get(reverse("monitoring-fleet")).content.decode()

    assert (rows["onprem"].source, rows["onprem"].agents) == ("agents", 1)
    assert rows[reported.cut.node.cluster.name].last_error == "Prometheus at x: timed out"
    assert "Prometheus at x: timed out" in page and "node agents" in page
