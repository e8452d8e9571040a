"""The fleet's capacity figures (pools/selectors/capacity.py: `fleet_figures`) are worked out once per
capacity version and added up as each page asks: they agree with the figures read afresh and with each GPU,
they follow every change made through the services, and the picture of the fleet shares what its GPUs have
in common."""

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from pools import capacity_version
from pools.models import Allocation, GpuCapacity, NodeCapacity
from pools.selectors import capacity, capacity_summary, compute_figures, fleet_figures, overview
from pools.selectors.fleet import fleet_snapshot
from pools.services import admit_waiting, approve_request, set_gpu_drained, set_node_group, submit_request
from tests.factories import GpuGroupFactory


@pytest.fixture
def kept(settings, fleet):
    settings.CAPACITY_PICTURE_SECONDS = 300
    return fleet


def _admit(tenancy, approver, items):
    request = submit_request(project=tenancy.vision, user=tenancy.acme_member, items=items)
    approve_request(request_id=request.pk, approver=approver)
    admit_waiting()


def _total():
    return fleet_figures(by=lambda where: ())[()]


def test_the_figures_added_up_are_those_read_afresh(fleet, tenancy, approver):
    training = GpuGroupFactory(cluster=fleet, name="training")
    set_node_group(node=NodeCapacity.objects.get(name="h200-2"), group=training)
    _admit(tenancy, approver, [("h200-141gb.mig-1g.18gb", 3), ("h100-80gb.full", 2), ("h200-141gb.full", 1)])
    set_gpu_drained(gpu=GpuCapacity.objects.get(node__name="h100-1", index=7), drained=True)
    # Nodes that name another model than their GPUs': their allocated slices count at the node's model, in
    # their group, and under their GPUs' model nowhere (as compute_figures has always counted them).
    NodeCapacity.objects.filter(name__startswith="h200").update(gpu_model="H100-80GB")

    for by, paths in [
        (lambda where: (where.cluster_id, where.group_id), ("node__cluster_id", "node__group_id")),
        (lambda where: (where.cluster, where.model), ("node__cluster__name", "model")),
        (lambda where: (), ()),
    ]:
        assert fleet_figures(by=by) == compute_figures(by=paths)
    in_groups = sum(g.figures.compute_allocated for c in overview() for g in c.groups)
    assert in_groups == _total().compute_allocated == 3 * 7
    assert [(row.cluster, row.model, row.gpus) for row in capacity_summary()] == [
        ("sim", "H100-80GB", 8),
        ("sim", "H200-141GB", 16),
    ]


def test_gpus_in_use_and_free_are_counted_as_each_gpu_says(fleet, tenancy, approver):
    _admit(tenancy, approver, [("h200-141gb.mig-3g.71gb", 2), ("h100-80gb.full", 3)])
    held = set(Allocation.objects.filter(released_at__isnull=True).values_list("gpu_id", flat=True))
    set_gpu_drained(gpu=GpuCapacity.objects.get(pk=min(held)), drained=True)  # drained, still in use
    set_gpu_drained(gpu=GpuCapacity.objects.get(node__name="h200-1", index=7), drained=True)  # drained, free
    gpus = list(GpuCapacity.objects.select_related("node"))

    total = _total()

    assert total.in_use_gpus == len(held) > 0
    assert (
        total.free_gpus == sum(g.pk not in held and g.schedulable for g in gpus) == len(gpus) - len(held) - 1
    )


def test_the_figures_are_kept_until_capacity_changes_through_the_services(kept, tenancy, approver):
    before = _total()
    with CaptureQueriesContext(connection) as reads:
        assert _total() == before
    assert len(reads) == 0
    assert sum(g.figures.gpus for c in overview() for g in c.groups) == before.gpus
    GpuCapacity.objects.filter(node__name="h100-1", index=0).update(drained=True)
    assert _total().drained_gpus == 0  # behind the services' backs: seen within the time bound only

    set_gpu_drained(gpu=GpuCapacity.objects.get(node__name="h100-1", index=1), drained=True)
    assert _total().drained_gpus == 2  # the service bumped the version: both drains show

    _admit(tenancy, approver, [("h100-80gb.full", 2)])
    after = _total()
    assert after.compute_allocated == before.compute_allocated + 14 and after.in_use_gpus == 2


def test_a_process_lets_its_old_figures_go_before_it_works_out_new_ones(kept, monkeypatch):
    kept_figures = capacity._FLEET_FIGURES
    _total()
    seen = []
    build = kept_figures.build
    monkeypatch.setattr(kept_figures, "build", lambda: seen.append(kept_figures.held) or build())
    capacity_version.changed()
    _total()
    assert seen == [None]  # nothing of the old version held while the new one is built
    assert kept_figures.held[0] == capacity_version.current()


def test_the_snapshot_makes_what_gpus_share_once(fleet, tenancy, approver):
    _admit(tenancy, approver, [("h200-141gb.mig-1g.18gb", 2)])
    gpus = fleet_snapshot([fleet], {fleet.pk: False})["sim"].gpus
    cut = [g for g in gpus if [s.profile for s in g.instances] == ["1g.18gb"] * 7]
    held = [g for g in cut if any(s.allocated for s in g.instances)]
    free = [g for g in cut if g not in held]

    assert len(held) == 1 and sum(s.allocated for s in held[0].instances) == 2 and free
    # GPUs cut alike that nobody holds share their slots; a free slot is one object wherever it is.
    thirds = [g for g in gpus if [s.profile for s in g.instances] == ["3g.71gb"] * 2]
    assert len(thirds) == 2 and thirds[0].instances is thirds[1].instances
    for n, slot in enumerate(held[0].instances):
        assert (slot is free[0].instances[n]) != slot.allocated
    assert len({id(g.node) for g in gpus if g.node == "sim/h100-1"}) == 1
