"""The operators' fleet, GPU and pool pages and their charts, from a hand-made fleet (`fleet`, `reported`)
that the figures' tests (test_fleet_figures.py), the tenant's pool usage (test_tenant_pool_usage.py) and
/metrics (test_metrics.py) read too."""

import re
import sys
from dataclasses import dataclass
from datetime import UTC, datetime

import pytest
from django.contrib.auth.models import Group, Permission
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.urls import reverse

from monitoring import selectors
from monitoring.collectors import GpuReading, InstanceReading, Reading
from monitoring.ingest.readings import ingest
from monitoring.ingest.tokens import issue_agent_token
from monitoring.models import CollectorStatus, GpuEvent
from tests.factories import (
    AllocationFactory,
    ClusterFactory,
    GpuCapacityFactory,
    NodeCapacityFactory,
    PoolFactory,
    UserFactory,
)

pytestmark = pytest.mark.django_db


def _now() -> datetime:
    return datetime.now(UTC).replace(microsecond=0)


# When the readings are taken: set again as each test's fleet is made (`fleet`), here and in the modules that
# share this fleet, since figures older than ten minutes are stale and a long suite runs some tests much
# later than it collected them.
NOW = _now()
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


def reading(fleet, *, at=None, full_sm=50.0, held_sm=20.0, free_sm=90.0, **figures):
    """One reading of the node at `at` (NOW), the full GPU at `full_sm`, the held instance at `held_sm`."""
    at = NOW if at is None else at
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
def fleet(tenancy, request, monkeypatch):
    now = _now()
    for module in {sys.modules[__name__], request.module}:
        if hasattr(module, "NOW"):
            monkeypatch.setattr(module, "NOW", now)
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


def test_the_gpu_page_names_every_pool_holding_a_share_of_the_gpu(db, operator, client):
    from django.db.backends.postgresql.psycopg_any import NumericRange

    from monitoring.selectors import gpu_detail
    from tests.factories import AllocationFactory, GpuCapacityFactory, PoolFactory

    gpu = GpuCapacityFactory(node__gpu_model="L40S-48GB", model="L40S-48GB", mig=None)
    first, second = PoolFactory(cluster=gpu.node.cluster), PoolFactory(cluster=gpu.node.cluster)
    for pool, share in ((first, 0), (first, 1), (second, 2)):
        AllocationFactory(pool=pool, gpu=gpu, profile="ts-4", slices=NumericRange(share, share + 1))
    whole = next(s for s in gpu_detail(gpu_id=gpu.pk).slots if s.whole)
    assert sorted((h.pool_id, h.part) for h in whole.holders) == [
        (first.pk, "ts-4"),
        (first.pk, "ts-4"),
        (second.pk, "ts-4"),
    ]
    client.force_login(operator)
    page = client.get(f"/monitoring/gpus/{gpu.pk}/").content.decode()
    assert f"#{first.pk}" in page and f"#{second.pk}" in page
