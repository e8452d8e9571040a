"""The placement engine: each rule and preference by example (every rule as a property of any fleet is in
test_placement_properties.py), and the helpers that build fleets and check answers, which other tests
share."""

from collections import Counter
from dataclasses import replace

import pytest

from pools.kinds import kind_of
from pools.mig import (
    FULL_GPU,
    Instance,
    gpu_model,
    place_profiles,
    stranded_compute_slices,
    used_compute_slices,
    validate_layout,
)
from pools.placement import (
    Assignment,
    Fleet,
    Gpu,
    Item,
    Placement,
    Reconfigure,
    Request,
    Slot,
    apply,
    fleet_index,
    place,
    place_all,
    validate_request,
)
from pools.placement.index import FleetIndex
from pools.placement.plan import share_slots

H100, A100, H200 = "H100-80GB", "A100-40GB", "H200-141GB"


def gpu(
    name: str, layout: str = "", *, off: bool = False, busy: bool = False, model: str = H100, **fields
) -> Gpu:
    """`layout` lists instances as "profile@start", "*" marking allocated ones and "+" allocated ones that
    may be reclaimed (borrowed): "3g.40gb@0* 1g.10gb@4"."""
    slots = tuple(
        Slot(profile, int(start.rstrip("*+")), start[-1] in "*+", start.endswith("+"))
        for profile, start in (token.split("@") for token in layout.split())
    )
    fields.setdefault("node", name.split("/")[0])
    return Gpu(name, model=model, mig=not off, allocated=busy, instances=slots, **fields)


def fleet(*gpus: Gpu) -> Fleet:
    return Fleet(tuple(gpus))


def ask(*items: tuple, id: str = "r", group: str | None = None) -> Request:
    """Items as (count, profile) or (count, profile, model)."""
    return Request(id, tuple(Item(i[2] if len(i) > 2 else H100, i[1], i[0]) for i in items), group)


def layout_of(placement: Placement, gpu_id: str) -> list[Instance]:
    (change,) = [c for c in placement.reconfigure if c.gpu == gpu_id]
    return [Instance(start, profile) for profile, start in change.instances]


def has_allocation(g: Gpu) -> bool:
    return g.allocated or any(s.allocated for s in g.instances)


def check_placement(before: Fleet, request: Request, placement: Placement) -> Fleet:
    """Every rule an answer must keep; returns the fleet after it."""
    after = apply(before, placement)
    if not placement.placed:
        assert placement.reason and not placement.reconfigure and not placement.assignments
        assert after is before
        return after
    gpus = {g.id: g for g in before.gpus}
    asked = Counter()
    for item in request.items:
        asked[item.model, item.profile] += item.count
    assert Counter((gpus[a.gpu].model, a.profile) for a in placement.assignments) == asked
    touched = {a.gpu for a in placement.assignments} | {c.gpu for c in placement.reconfigure}
    assert len({gpus[t].cluster for t in touched}) == 1, "one request, one cluster"
    node_changes = {c.gpu for c in placement.reconfigure if not c.mig and not gpus[c.gpu].mig}
    for t in touched:
        # A node's share mode changes for all its MIG-off GPUs, drained ones too; nothing else touches those.
        assert gpus[t].schedulable or t in node_changes, f"{t} is drained"
        assert request.group is None or gpus[t].group == request.group
    for change in placement.reconfigure:
        assert not has_allocation(gpus[change.gpu]), "layouts and share modes change only on wholly free GPUs"
        assert [start for _, start in change.instances] == sorted(start for _, start in change.instances)
        if change.mig:
            validate_layout(gpu_model(gpus[change.gpu].model), [Instance(s, p) for p, s in change.instances])
        else:
            assert change.instances == share_slots(change.sharing)
    assert len(set(placement.assignments)) == len(placement.assignments)
    after_gpus = {g.id: g for g in after.gpus}
    for a in placement.assignments:
        g = after_gpus[a.gpu]
        assert kind_of(a.profile).offer_of(a.profile) in g.offers, "only what the GPU's group offers"
        if a.profile == FULL_GPU:
            assert a.start is None and not g.mig and not g.sharing and g.allocated
        else:
            assert any(s.profile == a.profile and s.start == a.start and s.allocated for s in g.instances)
    nodes = {g.node for g in before.gpus}
    for node in nodes:
        on_node = [g for g in after.gpus if g.node == node]
        assert len({g.sharing for g in on_node}) == 1, "a node is in one share mode"
        was = [g for g in before.gpus if g.node == node]
        if on_node[0].sharing != was[0].sharing:
            assert not any(has_allocation(g) for g in was if not g.mig), "a node changes mode only when free"
    for g in before.gpus:
        if g.id not in touched:
            assert replace(after_gpus[g.id], reconfiguring=g.reconfiguring, sharing=g.sharing) == g
    return after


def placed(before: Fleet, request: Request, **options) -> Placement:
    placement = place(before, request, **options)
    check_placement(before, request, placement)
    return placement


def index_summary(index: FleetIndex) -> dict:
    """An index's buckets as plain data, to compare two indexes (the order they keep left aside)."""

    def slots(table) -> dict:
        return {p: {g: n for g, (n, _seq) in gpus.items()} for p, gpus in table.gpus.items() if gpus}

    def nodes(table) -> dict:
        return {node: set(table.gpus[node]) for node in table.nodes()}

    return {
        key: (
            {t: slots(getattr(b, t)) for t in ("partial", "whole_slots")},
            {t: nodes(getattr(b, t)) for t in ("whole", "off", "shared")},
            {p: n for p, n in b.free.items() if n},
            {t: {p: n for p, n in getattr(b, t).totals.items() if n} for t in ("partial", "whole_slots")},
            b.total,
            b.drained,
        )
        for key, b in index.buckets.items()
    } | {"reconfiguring": set(index.reconfiguring), "gpus": list(index.gpus)}


# --- rules and preferences, by example -----------------------------------------------------------------


def test_free_instance_on_a_gpu_in_use_comes_first():
    f = fleet(
        gpu("n1/0", "7g.80gb@0"), gpu("n1/1", "1g.10gb@0 1g.10gb@1"), gpu("n1/2", "3g.40gb@0* 1g.10gb@4")
    )
    result = placed(f, ask((1, "1g.10gb")))
    assert result.reconfigure == () and result.assignments == (Assignment("n1/2", "1g.10gb", 4),)


def test_free_instances_go_first_to_the_gpus_holding_the_most_tenants():
    one_tenant = gpu("n1/0", "3g.40gb@0* 1g.10gb@4 1g.10gb@5 1g.10gb@6")
    three = gpu("n2/0", "1g.10gb@0* 1g.10gb@1* 1g.10gb@2* 1g.10gb@3 1g.10gb@4 1g.10gb@5 1g.10gb@6")
    result = placed(fleet(one_tenant, three), ask((3, "1g.10gb")))
    assert {a.gpu for a in result.assignments} == {"n2/0"}  # n1/0 may empty the sooner
    result = placed(fleet(one_tenant, three), ask((5, "1g.10gb")))
    assert sorted(a.gpu for a in result.assignments) == ["n1/0"] + ["n2/0"] * 4


def test_work_that_may_not_be_reclaimed_keeps_off_gpus_whose_work_all_may():
    borrowed = gpu("n1/0", "1g.10gb@0+ 1g.10gb@1+ 1g.10gb@2+ 1g.10gb@3 1g.10gb@4 1g.10gb@5 1g.10gb@6")
    within = gpu("n2/0", "3g.40gb@0* 1g.10gb@4 1g.10gb@5 1g.10gb@6")
    both = fleet(borrowed, within)
    result = placed(both, ask((2, "1g.10gb")))
    assert {a.gpu for a in result.assignments} == {"n2/0"}  # a reclaim can still free n1/0 whole
    assert not result.reclaimable
    after = apply(both, result)
    assert [s.reclaimable for s in after.gpus[1].instances if s.allocated] == [False, False, False]
    # Work that may be reclaimed is placed as before (the GPU holding the most tenants first), and marked.
    lent = placed(both, replace(ask((2, "1g.10gb")), reclaimable=True))
    assert {a.gpu for a in lent.assignments} == {"n1/0"} and lent.reclaimable
    assert [s.reclaimable for s in apply(both, lent).gpus[0].instances if s.allocated] == [True] * 5
    # Where only such GPUs have room, they are used rather than re-partitioning a free one.
    result = placed(fleet(borrowed, gpu("n3/0")), ask((1, "1g.10gb")))
    assert {a.gpu for a in result.assignments} == {"n1/0"} and not result.reconfigure


def test_layout_changes_only_on_wholly_free_gpus():
    in_use = gpu("n1/0", "3g.40gb@4*")  # slices 0-3 are empty, but the GPU holds a tenant
    result = placed(fleet(in_use, gpu("n1/1")), ask((1, "4g.40gb")))
    assert [c.gpu for c in result.reconfigure] == ["n1/1"]
    refused = placed(fleet(in_use), ask((1, "4g.40gb")))
    assert refused.reason == "needs 1 × 4g.40gb; 0 placeable without re-partitioning in-use GPUs"


def test_free_instances_of_an_otherwise_free_gpu_may_be_re_cut():
    result = placed(fleet(gpu("n1/0", "1g.10gb@0 1g.10gb@1")), ask((1, "7g.80gb")))
    assert result.reconfigure == (Reconfigure("n1/0", True, (("7g.80gb", 0),)),)


@pytest.mark.parametrize(
    ("gpus", "expected_gpus", "switched"),
    [
        ([gpu("n1/0"), gpu("n1/1", off=True)], ["n1/1"], []),
        ([gpu("n1/0"), gpu("n1/1", off=True, busy=True)], ["n1/0"], ["n1/0"]),
        ([gpu("n1/0", "1g.10gb@0*"), gpu("n1/1", off=True, busy=True)], None, []),
    ],
)
def test_full_takes_a_free_mig_disabled_gpu_else_switches_a_wholly_free_one(gpus, expected_gpus, switched):
    result = placed(fleet(*gpus), ask((1, FULL_GPU)))
    assert result.placed == (expected_gpus is not None)
    assert [a.gpu for a in result.assignments] == (expected_gpus or [])
    assert result.reconfigure == tuple(Reconfigure(g, False, ()) for g in switched)


@pytest.mark.parametrize(
    ("free", "count", "expected_nodes"),
    [
        ({"a": 1, "b": 2, "c": 3}, 2, {"b"}),  # one node, the one it fills best
        ({"a": 2, "b": 2, "c": 1}, 3, {"a", "c"}),  # no node holds 3: two, the last one the best fit
        ({"a": 1, "b": 1, "c": 1, "d": 4}, 4, {"d"}),
    ],
)
def test_multi_gpu_full_items_stay_on_one_node_else_the_fewest(free, count, expected_nodes):
    gpus = [gpu(f"{node}/{n}", off=True) for node, size in free.items() for n in range(size)]
    result = placed(fleet(*gpus), ask((count, FULL_GPU)))
    assert {a.gpu.split("/")[0] for a in result.assignments} == expected_nodes


def test_one_nvlink_node_is_worth_switching_a_mig_gpu_off():
    f = fleet(gpu("a/0", off=True), gpu("b/0", off=True), gpu("b/1"))
    result = placed(f, ask((2, FULL_GPU)))
    assert sorted(a.gpu for a in result.assignments) == ["b/0", "b/1"]
    assert result.reconfigure == (Reconfigure("b/1", False, ()),)


def test_drained_or_unhealthy_gpus_get_nothing_new():
    drained = gpu("n1/0", "1g.10gb@0", schedulable=False)
    assert (
        placed(fleet(drained), ask((1, "1g.10gb"))).reason == "the one H100-80GB GPU is drained or unhealthy"
    )
    result = placed(fleet(drained, gpu("n2/0", schedulable=False), gpu("n3/0")), ask((1, "1g.10gb")))
    assert {a.gpu for a in result.assignments} == {"n3/0"}


def test_a_request_with_a_group_uses_only_that_groups_gpus():
    f = fleet(gpu("n1/0", "1g.10gb@0", group="training"), gpu("n2/0", group="inference"))
    assert {a.gpu for a in placed(f, ask((1, "1g.10gb"), group="inference")).assignments} == {"n2/0"}
    assert {a.gpu for a in placed(f, ask((1, "1g.10gb"))).assignments} == {"n1/0"}  # no group: any GPU
    missing = placed(f, ask((1, "1g.10gb"), group="batch"))
    assert missing.reason == "no H100-80GB GPU in group batch"


def test_a_request_stays_in_one_cluster():
    split = fleet(gpu("a1/0", off=True, cluster="a"), gpu("b1/0", off=True, cluster="b"))
    refused = placed(split, ask((2, FULL_GPU)))
    assert refused.reason == (
        "no single cluster can take the whole request: cluster a: needs 2 × full H100-80GB; 1 free; "
        "cluster b: needs 2 × full H100-80GB; 1 free"
    )
    roomy = fleet(*split.gpus, gpu("b1/1", off=True, cluster="b"))
    assert {a.gpu for a in placed(roomy, ask((2, FULL_GPU))).assignments} == {"b1/0", "b1/1"}


def test_a_request_is_placed_whole_or_not_at_all():
    f = fleet(gpu("n1/0", "1g.10gb@0 3g.40gb@4*"))
    result = placed(f, ask((1, "1g.10gb"), (1, "4g.40gb")))
    assert not result.placed and apply(f, result) is f


@pytest.mark.parametrize(
    ("gpus", "request_", "reason"),
    [
        (
            [gpu("n1/0", "3g.40gb@0* 1g.10gb@4"), gpu("n1/1")],
            ask((2, "4g.40gb")),
            "needs 2 × 4g.40gb; 1 placeable without re-partitioning in-use GPUs",
        ),
        (
            [gpu("n1/0", "1g.10gb@0 1g.10gb@1 3g.40gb@4*"), gpu("n1/1", off=True, busy=True)],
            ask((3, "1g.10gb")),
            "needs 3 × 1g.10gb; 2 placeable without re-partitioning in-use GPUs",
        ),
        (
            [gpu("n1/0", off=True, model=H200), gpu("n1/1", off=True, busy=True, model=H200)],
            ask((3, FULL_GPU, H200)),
            "needs 3 × full H200-141GB; 1 free",
        ),
        ([gpu("n1/0", off=True)], ask((1, FULL_GPU, A100)), "no A100-40GB GPU"),
        (
            [gpu("n1/0", schedulable=False), gpu("n1/1", schedulable=False)],
            ask((1, "1g.10gb")),
            "all 2 H100-80GB GPUs are drained or unhealthy",
        ),
        (
            [gpu("node-1/0", off=True), gpu("node-1/1", "3g.40gb@0* 1g.10gb@4")],
            ask((2, "1g.10gb"), (1, FULL_GPU)),
            "needs 1 × full H100-80GB and 2 × 1g.10gb together; the free H100-80GB capacity takes each alone "
            "but not all at once (1 wholly free GPU, the rest in use)",
        ),
        (
            [gpu("n1/0")],
            ask((0, "1g.10gb")),
            "Item 1 of request 'r': the count must be a whole number above 0 (got 0).",
        ),
    ],
)
def test_the_reason_says_precisely_what_is_missing(gpus, request_, reason):
    assert placed(fleet(*gpus), request_).reason == reason


@pytest.mark.parametrize("count", [1, 2, 3, 4])
def test_a_new_layout_strands_as_little_as_the_request_allows(count):
    result = placed(fleet(gpu("n1/0")), ask((count, "1g.20gb")))
    layout = layout_of(result, "n1/0")
    model = gpu_model(H100)
    # Each 1g.20gb takes 2 memory slices for 1 compute slice, and a GPU has only 1 memory slice to spare:
    # count - 1 compute slices are stranded at the least, where all-of-that-profile (4 × 1g.20gb, what
    # first-fit makes) strands 3.
    assert stranded_compute_slices(model, layout) == count - 1
    assert used_compute_slices(model, layout) == 8 - count
    homogeneous = place_profiles(model, {"1g.20gb": 4})
    assert stranded_compute_slices(model, homogeneous) == 3


def test_new_layouts_use_as_few_gpus_as_any_packing():
    # Two 3g.40gb fill one GPU's memory, and a GPU takes one "+me": packing the largest first needs 4 GPUs,
    # 3 suffice (3g.40gb + 1g.10gb+me on two, the last +me alone).
    f = fleet(*(gpu(f"n1/{n}") for n in range(3)))
    result = placed(f, ask((3, "1g.10gb+me"), (2, "3g.40gb")))
    assert len(result.reconfigure) == 3


def test_filler_follows_the_waiting_queue_then_recent_demand():
    queue = [ask((1, "3g.40gb"), id="r2"), ask((1, "2g.20gb"), id="r3")]
    layout = layout_of(placed(fleet(gpu("n1/0")), ask((1, "1g.10gb")), upcoming=queue), "n1/0")
    assert Counter(i.profile for i in layout) == {"1g.10gb": 2, "2g.20gb": 1, "3g.40gb": 1}
    # A queue of 1g.20gb requests is worth cutting 4 × 1g.20gb for, strands and all.
    queue = [ask((1, "1g.20gb"), id=f"q{n}") for n in range(3)]
    layout = layout_of(placed(fleet(gpu("n1/0")), ask((1, "1g.20gb")), upcoming=queue), "n1/0")
    assert Counter(i.profile for i in layout) == {"1g.20gb": 4}
    demand = {(H100, "2g.20gb"): 10.0}
    layout = layout_of(placed(fleet(gpu("n1/0")), ask((1, "1g.10gb")), demand=demand), "n1/0")
    assert Counter(i.profile for i in layout)["2g.20gb"] == 3


def test_a_good_provisioned_layout_is_used_and_a_poor_one_re_cut():
    good = gpu("n1/0", " ".join(f"1g.10gb@{s}" for s in range(7)))
    assert placed(fleet(good), ask((1, "1g.10gb"))).reconfigure == ()
    poor = gpu("n1/0", "1g.10gb@0")  # six compute slices that nobody could use once it is in use
    assert [c.gpu for c in placed(fleet(poor), ask((1, "1g.10gb"))).reconfigure] == ["n1/0"]


def test_kept_layouts_never_cost_a_request_its_place():
    # Each GPU's provisioned layout suits the recent demand for 2g.20gb, but kept, the two hold only 2 of
    # the 8 instances asked for; re-cut, they hold 7 + 1.
    provisioned = "1g.10gb@0 2g.20gb@2 2g.20gb@4 1g.20gb@6"
    f = fleet(gpu("n1/0", provisioned), gpu("n1/1", provisioned))
    demand = {(H100, "2g.20gb"): 1.0, (H100, "1g.20gb"): 1.0}
    assert placed(f, ask((1, "1g.10gb")), demand=demand).reconfigure == ()
    result = placed(f, ask((8, "1g.10gb")), demand=demand)
    assert sorted(c.gpu for c in result.reconfigure) == ["n1/0", "n1/1"]


def test_mig_work_prefers_mig_gpus_and_switches_a_disabled_one_only_when_it_must():
    result = placed(fleet(gpu("n1/0", off=True), gpu("n1/1")), ask((1, "2g.20gb")))
    assert [c.gpu for c in result.reconfigure] == ["n1/1"]
    result = placed(fleet(gpu("n1/0", off=True)), ask((1, "2g.20gb")))
    assert [(c.gpu, c.mig) for c in result.reconfigure] == [("n1/0", True)]


def test_re_partitioning_prefers_nodes_already_being_re_partitioned():
    # Left alone, one new layout goes to the node it fills best (a, with one free GPU), keeping larger
    # nodes whole for multi-GPU work; a node whose GPU Operator is paused anyway comes first.
    f = fleet(gpu("a/0"), gpu("b/0", reconfiguring=True), gpu("b/1", reconfiguring=True), gpu("b/2"))
    assert [c.gpu for c in placed(f, ask((1, "7g.80gb"))).reconfigure] == ["b/0"]
    f = fleet(gpu("a/0"), gpu("b/0"), gpu("b/1", reconfiguring=True))  # one GPU's flag speaks for its node
    assert [c.gpu for c in placed(f, ask((1, "7g.80gb"))).reconfigure] == ["b/0"]
    # A node the request itself re-partitions, for another model, before a node that ties with it.
    f = fleet(gpu("x/0", model=A100), gpu("m/0"), gpu("m/1", model=A100), gpu("h/0"), gpu("h/1"))
    result = placed(f, ask((1, "7g.80gb"), (1, "7g.40gb", A100)))
    assert [c.gpu for c in result.reconfigure] == ["m/0", "m/1"]
    # place_all marks the nodes it re-partitions, and the next request follows.
    f = fleet(gpu("a/0"), gpu("m/0", group="x"), gpu("m/1"), gpu("m/2"), gpu("m/3"))
    placements, after = place_all(f, [ask((1, "7g.80gb"), id="r1", group="x"), ask((1, "7g.80gb"), id="r2")])
    assert [c.gpu for p in placements for c in p.reconfigure] == ["m/0", "m/1"]
    assert {g.id for g in after.gpus if g.reconfiguring} == {"m/0", "m/1", "m/2", "m/3"}


def test_bad_requests_are_named_before_anything_is_placed():
    bad = Request("r", (Item("X100", "1g.10gb", 1), Item(H100, "9g.99gb", 1), Item(H100, FULL_GPU, -1)))
    errors = validate_request(bad, fleet())
    assert len(errors) == 3 and "X100" in errors[0] and "9g.99gb" in errors[1] and "-1" in errors[2]
    assert validate_request(Request("r", ()), fleet()) == ["Request 'r' asks for nothing: it has no items."]
    assert not place(fleet(gpu("n1/0")), bad).placed


@pytest.mark.parametrize(
    "placement",
    [
        Placement("r", True, reconfigure=(Reconfigure("n1/0", True, (("7g.80gb", 0),)),)),
        Placement("r", True, assignments=(Assignment("n1/1", "1g.10gb", 1),)),
        Placement("r", True, assignments=(Assignment("n1/1", "1g.10gb", 0),) * 2),
        Placement("r", True, assignments=(Assignment("n1/1", FULL_GPU, None),)),
        Placement("r", True, reconfigure=(Reconfigure("n1/1", True, (("4g.40gb", 2),)),)),
    ],
)
def test_apply_refuses_a_placement_that_breaks_a_rule(placement):
    with pytest.raises(ValueError):
        apply(fleet(gpu("n1/0", "1g.10gb@0*"), gpu("n1/1", "1g.10gb@0")), placement)


def test_an_older_fleet_keeps_answering_as_before():
    f = fleet(gpu("n1/0"), gpu("n1/1", "1g.10gb@0 3g.40gb@4*"), gpu("n1/2", off=True))
    first = place(f, ask((2, "1g.10gb")))
    later = apply(f, first)
    apply(later, place(later, ask((1, "3g.40gb"), (1, FULL_GPU))))
    assert place(f, ask((2, "1g.10gb"))) == first
    assert index_summary(fleet_index(f)) == index_summary(FleetIndex.build(f.gpus))


def test_a_4000_gpu_fleet_takes_a_whole_queue():
    """Speed is measured by bench/placement.py; here only that a large fleet is handled right."""
    gpus = []
    for n in range(500):
        for k in range(8):
            layout = "3g.40gb@0* 1g.10gb@4 1g.10gb@5 1g.20gb@6" if k % 4 == 0 else ""
            gpus.append(gpu(f"n{n}/{k}", layout, off=k == 7, busy=k == 7 and n % 2 == 0))
    profiles = ["1g.10gb", "2g.20gb", "3g.40gb", "1g.20gb"]
    requests = [ask((1 + n % 3, profiles[n % 4]), id=f"r{n}") for n in range(300)]
    placements, _after = place_all(fleet(*gpus), requests)
    assert all(p.placed for p in placements)
    taken = [(a.gpu, a.start) for p in placements for a in p.assignments]
    assert len(taken) == len(set(taken)) == sum(1 + n % 3 for n in range(300))


# --- shares -------------------------------------------------------------------------------------------


def shared(name: str, sharing: str, busy: tuple[int, ...] = (), **fields) -> Gpu:
    """A MIG-off GPU of a node in share mode `sharing`, the shares at `busy` in use."""
    slots = tuple(Slot(p, s, s in busy) for p, s in share_slots(sharing))
    fields.setdefault("node", name.split("/")[0])
    return Gpu(name, model=fields.pop("model", H100), mig=False, instances=slots, sharing=sharing, **fields)


SHARING_OFFERS = ("whole", "mig", "ts-2", "ts-4")


def test_a_request_that_turns_a_node_s_sharing_off_does_not_also_share_it():
    """A whole GPU turns the node's sharing off; the same request's shares then go elsewhere, never onto a
    MIG GPU of that node switched off into the mode the node just left."""
    f = fleet(
        shared("x/0", "ts-2", group="g", offers=SHARING_OFFERS),
        gpu("x/1", sharing="ts-2", group="g", offers=SHARING_OFFERS),  # MIG on, wholly free
        gpu("y/0", off=True, group="h", offers=("ts-2",)),
    )
    placement = placed(f, ask((1, "full"), (2, "ts-2")))
    after = apply(f, placement)
    assert {g.id: (g.mig, g.sharing) for g in after.gpus} == {
        "x/0": (False, ""),
        "x/1": (True, ""),
        "y/0": (False, "ts-2"),
    }
    assert [(a.gpu, a.profile) for a in placement.assignments] == [
        ("x/0", "full"),
        ("y/0", "ts-2"),
        ("y/0", "ts-2"),
    ]


def test_shares_fill_a_shared_gpu_in_use_then_a_free_one_in_the_mode_then_a_node_switched():
    f = fleet(
        shared("a/0", "ts-4", busy=(0,), offers=SHARING_OFFERS),
        shared("a/1", "ts-4", offers=SHARING_OFFERS),
        gpu("b/0", off=True, offers=SHARING_OFFERS),
    )
    placement = placed(f, ask((9, "ts-4")))
    taken = Counter(a.gpu for a in placement.assignments)
    assert taken == {"a/0": 3, "a/1": 4, "b/0": 2}
    assert [(c.gpu, c.sharing) for c in placement.reconfigure] == [("b/0", "ts-4")]


def test_a_node_whose_shares_are_in_use_keeps_its_mode_and_whole_gpus_wait():
    f = fleet(
        shared("a/0", "ts-2", busy=(1,), offers=SHARING_OFFERS), shared("a/1", "ts-2", offers=SHARING_OFFERS)
    )
    refused = place(f, ask((1, "full")))
    assert not refused.placed and refused.reason == "needs 1 × full H100-80GB; 0 free"
    assert not place(f, ask((1, "ts-4"))).placed  # another mode needs the whole node free
    assert place(f, ask((3, "ts-2"))).placed


def test_what_a_group_does_not_offer_is_not_placed_and_the_reason_says_so():
    f = fleet(gpu("a/0", off=True, group="g", offers=("mig",)))
    refused = place(f, ask((1, "full"), group="g"))
    assert refused.reason == "no H100-80GB GPU in group g is offered as full"
