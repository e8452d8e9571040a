"""What-if fleet changes and routes, pure: added GPUs come in new nodes, removed and regrouped nodes change
in order, bad changes are refused saying what was expected, the peak size of a changed fleet is counted as the
changes apply, and a request goes to the first of its routes that places it."""

from dataclasses import replace

import pytest
from hypothesis import given
from hypothesis import settings as hypothesis_settings
from hypothesis import strategies as st

from pools.placement import Fleet, Gpu
from pools.placement.fleet_changes import (
    ADD,
    REGROUP,
    REMOVE,
    FleetChangeError,
    NodeSize,
    apply_changes,
    node_sizes,
    parse_changes,
    peak_size,
)
from pools.placement.replay import check
from pools.placement.simulation import SimulationTrace, TimedRequest, simulate
from pools.placement.whatif import RoutedPlacer
from tests.examples import examples
from tests.pools.test_simulate_history import H100, H200, _items

# --- fleet changes (pure) ---------------------------------------------------------------------------------


def _fleet() -> Fleet:
    def gpu(node: str, index: int, model: str, **fields) -> Gpu:
        cluster = node.partition("/")[0]
        return Gpu(f"{node}/{index}", node, model, mig=False, cluster=cluster, **fields)

    n1 = [gpu("c/n1", index, H100, group="training") for index in (0, 1)]
    return Fleet((*n1, gpu("c/n2", 0, H200), gpu("c/n2", 1, H200, schedulable=False)))


def changed(fleet: Fleet, *changes: tuple[str, str], cluster: str | None = None):
    return apply_changes(fleet, parse_changes(changes), cluster=cluster)


def test_added_gpus_come_in_new_nodes_of_eight_in_their_group():
    before = _fleet()
    after, said = changed(before, (ADD, "10 h200-141gb training"))
    added = after.gpus[len(before.gpus) :]
    assert after.gpus[: len(before.gpus)] == before.gpus
    assert [g.node for g in added] == ["c/added-1"] * 8 + ["c/added-2"] * 2
    assert len({g.id for g in after.gpus}) == len(after.gpus)
    assert {(g.model, g.mig, g.allocated, g.group, g.cluster, g.schedulable) for g in added} == {
        (H200, False, False, "training", "c", True)
    }
    assert said == ("added 10 × H200-141GB (MIG off) in group training: c/added-1, c/added-2",)


def test_added_gpus_without_a_group_and_again_take_the_next_names():
    after, said = changed(_fleet(), (ADD, "8 H100-80GB"), (ADD, " 1  A100-80GB  serving "))
    assert [g.node for g in after.gpus[4:]] == ["c/added-1"] * 8 + ["c/added-2"]
    assert {g.group for g in after.gpus[4:12]} == {None} and after.gpus[-1].group == "serving"
    assert said == (
        "added 8 × H100-80GB (MIG off) in no group: c/added-1",
        "added 1 × A100-80GB (MIG off) in group serving (a group no GPU of the cluster was in): c/added-2",
    )


def test_a_removed_node_loses_every_gpu_and_changes_apply_in_order():
    after, said = changed(_fleet(), (ADD, "2 H100-80GB"), (REMOVE, "n2"), (REMOVE, "c/added-1"))
    assert [g.node for g in after.gpus] == ["c/n1", "c/n1"]
    assert said[1:] == ("removed c/n2: 2 × H200-141GB", "removed c/added-1: 2 × H100-80GB")
    with pytest.raises(FleetChangeError, match="--regroup n2=training: the fleet has no node 'n2'"):
        changed(_fleet(), (REMOVE, "n2"), (REGROUP, "n2=training"))  # removed first: nothing to regroup


def test_a_regrouped_node_moves_to_its_group_or_to_none():
    after, said = changed(_fleet(), (REGROUP, "n2=inference"), (REGROUP, "c/n1="), (REGROUP, "n2=training"))
    assert [(g.node, g.group) for g in after.gpus] == [
        ("c/n1", None), ("c/n1", None), ("c/n2", "training"), ("c/n2", "training"),
    ]  # fmt: skip
    assert [g.schedulable for g in after.gpus] == [True, True, True, False]  # nothing else changes
    assert said == (
        "regrouped c/n2 (2 GPUs): no group → inference",
        "regrouped c/n1 (2 GPUs): training → no group",
        "regrouped c/n2 (2 GPUs): inference → training",
    )


def test_nodes_of_one_name_in_two_clusters_need_the_cluster_and_added_gpus_need_one():
    fleet = Fleet((*_fleet().gpus, Gpu("d/n1/0", "d/n1", H100, mig=False, cluster="d")))
    with pytest.raises(FleetChangeError, match=r"several clusters have a node 'n1' \(c/n1, d/n1\); name"):
        changed(fleet, (REMOVE, "n1"))
    assert [g.node for g in changed(fleet, (REMOVE, "d/n1"))[0].gpus] == ["c/n1"] * 2 + ["c/n2"] * 2
    with pytest.raises(FleetChangeError, match="the fleet spans the clusters c, d; name the cluster"):
        changed(fleet, (ADD, "8 H100-80GB"))
    assert changed(fleet, (ADD, "8 H100-80GB"), cluster="d")[0].gpus[-1].node == "d/added-1"


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ((ADD, "0 H100-80GB"), "--add '0 H100-80GB': the count must be a whole number above 0, not '0'."),
        ((ADD, "-2 H100-80GB"), "the count must be a whole number above 0, not '-2'."),
        ((ADD, "1.5 H100-80GB"), "the count must be a whole number above 0, not '1.5'."),
        ((ADD, "eight H100-80GB"), "the count must be a whole number above 0, not 'eight'."),
        ((ADD, "20000 H100-80GB"), "at most 10000 GPUs can be added at once, not 20000."),
        ((ADD, "8 X100"), "--add '8 X100': unknown GPU model 'X100'; known models: A100-40GB, A100-80GB,"),
        ((ADD, "8"), '--add takes "N MODEL [GROUP]", e.g. "8 H200-141GB training", not \'8\'.'),
        ((ADD, "8 H100-80GB a b"), '--add takes "N MODEL [GROUP]"'),
        ((ADD, "8 H100-80GB Training!"), "'Training!' is not a GPU group name (lower-case letters, digits"),
        ((REMOVE, " "), "--remove takes the name of a node, e.g. --remove h100-3; got nothing."),
        ((REMOVE, "n3"), "--remove n3: the fleet has no node 'n3'; close names: c/n1, c/n2."),
        ((REMOVE, "gpu-box"), "the fleet has no node 'gpu-box'; no name is close; its nodes: c/n1, c/n2."),
        ((REGROUP, "n1"), '--regroup takes "NODE=GROUP", e.g. "h100-1=inference"'),
        ((REGROUP, "=training"), '--regroup takes "NODE=GROUP"'),
        ((REGROUP, "n1=bad_group"), "--regroup 'n1=bad_group': 'bad_group' is not a GPU group name"),
        ((REGROUP, "n9=training"), "--regroup n9=training: the fleet has no node 'n9'; close names: c/n1"),
        (("resize", "n1"), "Unknown fleet change 'resize'; the changes are add, remove and regroup."),
    ],
)
def test_a_bad_change_is_refused_saying_what_was_expected(change, message):
    fleet = _fleet()
    with pytest.raises(FleetChangeError) as refused:
        changed(fleet, change)
    assert message in str(refused.value)
    assert fleet == _fleet()


# Changes on _fleet() and on what they add: good and bad nodes, two clusters' worth of names.
SOME_CHANGES = st.lists(
    st.one_of(
        st.builds(lambda n, model: (ADD, f"{n} {model}"), st.integers(1, 20), st.sampled_from([H100, H200])),
        st.builds(lambda node: (REMOVE, node), st.sampled_from(["n1", "c/n2", "added-1", "c/added-2", "n9"])),
        st.builds(lambda node: (REGROUP, f"{node}=inference"), st.sampled_from(["n2", "c/added-1", "x"])),
    ),
    max_size=6,
)


@hypothesis_settings(max_examples=examples(200), deadline=None)
@given(changes=SOME_CHANGES, limit=st.integers(0, 60))
def test_the_peak_of_a_changed_fleet_is_counted_as_the_changes_are_applied(changes, limit):
    """peak_size, on a count per node, refuses what apply_changes refuses, in its words, and otherwise says
    the most GPUs the fleet holds at any step; past `limit` it says a size past it, and no more."""
    fleet, parsed = _fleet(), parse_changes(changes)
    try:
        sizes = [len(apply_changes(fleet, parsed[:step])[0].gpus) for step in range(len(parsed) + 1)]
    except FleetChangeError as refused:
        with pytest.raises(FleetChangeError) as counted:
            peak_size(node_sizes(fleet), parsed)
        assert str(counted.value) == str(refused)
        return
    assert peak_size(node_sizes(fleet), parsed) == max(sizes)
    bounded = peak_size(node_sizes(fleet), parsed, limit=limit)
    assert bounded == max(sizes) if max(sizes) <= limit else bounded > limit


def test_the_peak_stops_counting_once_past_its_limit():
    half_a_million = parse_changes([(ADD, "10000 H100-80GB")] * 50)
    assert peak_size(node_sizes(_fleet()), half_a_million, limit=32_000) == 4 + 40_000
    assert peak_size(node_sizes(_fleet()), half_a_million) == 4 + 500_000
    assert node_sizes(_fleet()) == (NodeSize("c/n1", "c", 2), NodeSize("c/n2", "c", 2))


# --- routes across clusters (pure) ------------------------------------------------------------------------


def test_a_request_goes_to_the_first_of_its_routes_that_places_it():
    gpus = tuple(Gpu(f"{c}/n/{i}", f"{c}/n", H100, mig=False, cluster=c) for c in "ab" for i in (0, 1))
    held = Fleet(tuple(g if g.cluster == "a" else replace(g, allocated=True) for g in gpus))
    wanted = TimedRequest("r", 0, 60, _items((H100, "full", 1)))
    trace = SimulationTrace(held, (wanted, TimedRequest("s", 0, 60, _items((H100, "full", 2)))), 100)
    routes = {"r": (("b", None),), "s": (("b", None), ("a", None))}  # r may land on b only
    result = simulate(trace, placer=RoutedPlacer(routes))
    assert result.outcomes[0].admitted_at is None
    assert "closest" not in result.outcomes[0].placement.reason
    assert {a.gpu for a in result.outcomes[1].placement.assignments} == {"a/n/0", "a/n/1"}
    assert check(trace, result.outcomes) == []
