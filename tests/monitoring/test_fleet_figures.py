"""The fleet's figures as the pages read them: allocated against used, hottest and idlest, each tenant's
efficiency from roll-ups, the GPU table, a pool's series — from hand-made samples, with the numbers worked
out here."""

from datetime import timedelta

import pytest

from monitoring import selectors
from monitoring.ingest.readings import ingest
from monitoring.storage import samples
from pools.models import Allocation
from tests.monitoring import test_fleet_pages as pages

pytestmark = pytest.mark.django_db

NOW, GIB, reading = pages.NOW, pages.GIB, pages.reading
fleet, reported = pages.fleet, pages.reported


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
