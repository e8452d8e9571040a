"""The fleet's figures the pages show are worked out once and kept a few seconds for every process
(monitoring/selectors/kept.py), and the GPU table reads a page at a time, counted by the fleet's figures
where they count its GPUs; from the hand-made fleet of test_fleet_pages.py."""

from datetime import timedelta

import pytest
from django.core.cache import cache
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.urls import reverse

from monitoring import selectors
from monitoring.ingest.readings import ingest
from monitoring.selectors import kept
from pools.services import set_gpu_drained
from portal.shell import CapacityScope
from tests.factories import GpuCapacityFactory, NodeCapacityFactory
from tests.monitoring import test_fleet_pages as pages

pytestmark = pytest.mark.django_db

reading = pages.reading
fleet, reported, operator = pages.fleet, pages.reported, pages.operator


@pytest.fixture
def keeping(settings):
    settings.MONITORING_FIGURES_SECONDS = 60


def test_the_fleet_page_shows_the_kept_figures_until_they_are_worked_out_again(
    keeping, reported, operator, client
):
    client.force_login(operator)
    assert "500 W" in client.get(reverse("monitoring-fleet")).content.decode()

    later = pages.NOW + timedelta(seconds=5)
    ingest(cluster=reported.cluster, readings=[reading(reported, at=later, power_w=100.0)], source="agent")
    page = client.get(reverse("monitoring-fleet")).content.decode()
    assert "500 W" in page and "figures as of" in page  # kept: as they were

    cache.clear()  # as when they expire
    assert "300 W" in client.get(reverse("monitoring-fleet")).content.decode()


def test_a_kept_figure_is_read_back_without_a_query(keeping, reported):
    first = kept.kept_cluster_usage()
    with CaptureQueriesContext(connection) as reads:
        again = kept.kept_cluster_usage()
    assert len(reads) == 0 and again == first
    assert [row.gpus for row in again.value] == [row.gpus for row in selectors.cluster_usage()]


def test_without_keeping_every_view_works_its_figures_out(settings, reported):
    settings.MONITORING_FIGURES_SECONDS = 0
    kept.kept_hottest()
    with CaptureQueriesContext(connection) as reads:
        kept.kept_hottest()
    assert len(reads) > 0


def test_each_scope_is_kept_apart(keeping, reported):
    sim, other = reported.cluster, reported.other
    whole = kept.kept_scope_usage(scope=CapacityScope()).value.totals
    in_sim = kept.kept_scope_usage(scope=CapacityScope(cluster_id=sim.pk)).value.totals
    in_other = kept.kept_scope_usage(scope=CapacityScope(cluster_id=other.pk)).value.totals
    on_node = kept.kept_scope_usage(scope=CapacityScope(cluster_id=sim.pk, node_id=reported.full.node_id))

    assert (whole.gpus, in_sim.gpus, in_other.gpus, on_node.value.totals.gpus) == (3, 2, 1, 2)
    assert (in_sim.allocated, in_other.allocated) == (10, 0)


STATES = ["", "allocated", "free", "drained", "unhealthy", "silent"]


@pytest.mark.parametrize("state", STATES)
def test_the_gpu_table_counts_what_it_lists_and_pages_it_in_order(state, reported):
    node = NodeCapacityFactory(cluster=reported.other, name="n3", gpu_model="H100-80GB")
    for index in range(5):
        GpuCapacityFactory(node=node, index=index)
    set_gpu_drained(gpu=node.gpus.get(index=2), drained=True)
    table = selectors.gpu_table(state=state)

    rows = list(table)
    assert table.count() == len(rows) == len(table)
    assert [g.pk for g in table[0:2] + table[2:]] == [g.pk for g in rows]
    assert all(g.held == (g.pk in {reported.full.pk, reported.cut.pk}) for g in rows)


def test_the_gpu_table_count_follows_a_drain(settings, reported):
    settings.CAPACITY_PICTURE_SECONDS = 300  # the fleet's figures kept per capacity version
    assert (selectors.gpu_table(state="drained").count(), selectors.gpu_table(state="free").count()) == (0, 1)
    set_gpu_drained(gpu=reported.spare, drained=True)
    assert (selectors.gpu_table(state="drained").count(), selectors.gpu_table(state="free").count()) == (1, 0)
    assert selectors.gpu_table(cluster="other", state="drained").count() == 1
    assert selectors.gpu_table(cluster="sim").count() == 2


def test_the_gpu_table_keeps_its_order_with_the_figures(keeping, reported):
    full, cut, spare = reported.full.pk, reported.cut.pk, reported.spare.pk
    assert [g.pk for g in selectors.gpu_table(sort="-temperature")[0:3]] == [cut, full, spare]
    hotter = reading(reported, at=pages.NOW + timedelta(seconds=5), temperature_c=95.0)
    ingest(cluster=reported.cluster, readings=[hotter], source="agent")

    with CaptureQueriesContext(connection) as reads:
        table = selectors.gpu_table(sort="-temperature")
        assert table.count() == 3 and [g.pk for g in table[0:3]] == [cut, full, spare]
    assert len(reads) == 1  # the page's GPUs, read with their figures: the order is the kept one
    assert table[0:3][1].temperature == 95.0

    cache.clear()  # as when the figures expire
    assert [g.pk for g in selectors.gpu_table(sort="-temperature")[0:3]] == [full, cut, spare]
