"""`manage.py simulate --history`: a month of the portal's own requests becomes the simulator's trace on
today's fleet, emptied; fleet changes are read and applied in order; the command reports the real and the
changed fleet side by side, and refuses bad input with a message, changing nothing."""

import io
import json
import re
from dataclasses import replace
from datetime import UTC, datetime
from zoneinfo import ZoneInfo

import pytest
from django.core.management import CommandError, call_command
from hypothesis import given
from hypothesis import settings as hypothesis_settings
from hypothesis import strategies as st

from pools import services
from pools.models import GpuCapacity, NodeCapacity, Pool, PoolRequest, PoolState, RequestState
from pools.placement import Fleet, Gpu, Item
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
from pools.placement.whatif import RoutedPlacer, side_by_side
from pools.selectors.history import HistoryError, month_history, month_trace
from pools.services.whatif import run_whatif
from tests.factories import GpuGroupFactory, PoolFactory, PoolRequestFactory

SEOUL = ZoneInfo("Asia/Seoul")
DAY = 86400
MARCH = 31 * DAY  # 2026-03 in seconds: the horizon of a whole past month


def kst(day: int, hour: int = 0, minute: int = 0, second: int = 0, month: int = 3) -> datetime:
    return datetime(2026, month, day, hour, minute, second, tzinfo=SEOUL)


@pytest.fixture(autouse=True)
def _billing_zone(settings):
    settings.BILLING_TIME_ZONE = "Asia/Seoul"


class Month:
    """The month 2026-03 of two clusters, as the services leave it, then moved to known times."""

    def __init__(self, fleet, synced, tenancy, approver):
        self.sim, self.tenancy, self.approver = fleet, tenancy, approver
        self.other = synced([("a100", 1, "A100-80GB", [None, None])], name="other")
        training = GpuGroupFactory(cluster=fleet, name="training")
        inference = GpuGroupFactory(cluster=fleet, name="inference")
        for node, group in (("h200-1", training), ("h200-2", inference), ("h100-1", training)):
            services.set_node_group(node=NodeCapacity.objects.get(cluster=fleet, name=node), group=group)
        self.a = self.ask([("h200-141gb.mig-1g.18gb", 2)], "training")
        self.release(self.a, approved=kst(1), reserved=kst(1, second=30), released=kst(3, second=30))
        self.b = self.ask([("h200-141gb.full", 2)], "inference")  # still live
        self.times(self.b, approved=kst(5, 9), reserved=kst(5, 9, second=10))
        self.c = self.ask([("h100-80gb.full", 8)], "training")
        self.d = self.ask([("h100-80gb.full", 1)], "training")
        self.e = self.ask([("h100-80gb.full", 2)], "training")
        assert {PoolRequest.objects.get(pk=r.pk).state for r in (self.d, self.e)} == {RequestState.QUEUED}
        services.reject_request(request_id=self.d.pk, approver=approver, reason="not this month")
        services.cancel_request(request_id=self.e.pk, user=tenancy.acme_member)
        services.fail_pool(pool_id=self.c.pool.pk, reason="the MIG manager failed")
        self.times(self.c, approved=kst(10), reserved=kst(10, second=5), released=kst(10, 1, second=5))
        self.times(self.d, approved=kst(10, minute=1))
        self.times(self.e, approved=kst(10, minute=2))
        self.h = self.ask([("h200-141gb.mig-1g.18gb", 1)], "training", cluster=None)  # any cluster
        self.release(self.h, approved=kst(12, 12), reserved=kst(12, 12), released=kst(12, 18))
        self.f = self.ask([("a100-80gb.full", 1)], "", cluster=self.other)
        self.release(
            self.f, approved=kst(31, 23, 30), reserved=kst(31, 23, 30), released=kst(1, 1, 30, month=4)
        )
        self.before = self.ask([("h200-141gb.mig-1g.18gb", 1)], "training")  # the month before, in Seoul
        self.release(self.before, approved=kst(28, 23, 59, 59, month=2), reserved=kst(1), released=kst(2))
        self.after = self.ask([("h200-141gb.mig-1g.18gb", 1)], "training")  # still March in UTC
        self.release(self.after, approved=kst(1, 0, 30, month=4), reserved=kst(1, 1, month=4), released=None)
        self.w = self.ask([("h200-141gb.full", 7)], "inference")  # waits still: B holds 2 of its 8
        assert PoolRequest.objects.get(pk=self.w.pk).state == RequestState.QUEUED
        self.times(self.w, approved=kst(20, 12))
        gpu = GpuCapacity.objects.get(node__cluster=fleet, node__name="h200-1", index=7)
        services.set_gpu_drained(gpu=gpu, drained=True)

    def ask(self, items, purpose, cluster="sim"):
        cluster = self.sim if cluster == "sim" else cluster
        who = {"project": self.tenancy.vision, "user": self.tenancy.acme_member}
        request = services.submit_request(**who, items=items, cluster=cluster, purpose=purpose)
        services.approve_request(request_id=request.pk, approver=self.approver)
        services.admit_waiting()
        return PoolRequest.objects.get(pk=request.pk)

    def release(self, request, **times):
        services.release_pool(pool_id=request.pool.pk, user=self.tenancy.acme_member)
        self.times(request, **times)

    @staticmethod
    def times(request, *, approved, reserved=None, released=None):
        PoolRequest.objects.filter(pk=request.pk).update(approved_at=approved, decided_at=approved)
        if reserved is not None:
            Pool.objects.filter(request=request).update(reserved_at=reserved, released_at=released)


@pytest.fixture
def month(fleet, synced, tenancy, approver):
    return Month(fleet, synced, tenancy, approver)


def _items(*items: tuple[str, str, int]) -> tuple[Item, ...]:
    return tuple(Item(*item) for item in items)


H200, H100, A100 = "H200-141GB", "H100-80GB", "A100-80GB"


def expected(month: Month, *, every_cluster: bool) -> list[TimedRequest]:
    training_median = 21600  # the lower middle of A's 172800, C's 3600 and H's 21600
    b_hold = MARCH - (4 * DAY + 9 * 3600) + 1  # live: past the horizon whenever it is admitted
    h_group = None if every_cluster else "training"
    rows = [
        TimedRequest(str(month.a.pk), 0, 2 * DAY, _items((H200, "1g.18gb", 2)), "training"),
        TimedRequest(str(month.b.pk), 4 * DAY + 9 * 3600, b_hold, _items((H200, "full", 2)), "inference"),
        TimedRequest(str(month.c.pk), 9 * DAY, 3600, _items((H100, "full", 8)), "training"),
        TimedRequest(str(month.e.pk), 9 * DAY + 120, training_median, _items((H100, "full", 2)), "training"),
        # H asked for any cluster: no group where "other", which has none, is a route too.
        TimedRequest(str(month.h.pk), 11 * DAY + 12 * 3600, 6 * 3600, _items((H200, "1g.18gb", 1)), h_group),
        TimedRequest(str(month.w.pk), 19 * DAY + 12 * 3600, b_hold, _items((H200, "full", 7)), "inference"),
    ]
    if every_cluster:
        rows.append(TimedRequest(str(month.f.pk), 30 * DAY + 84600, 7200, _items((A100, "full", 1))))
    return rows


def test_the_month_becomes_the_trace_of_its_approved_requests(month):
    history = month_history(month="2026-03")
    trace = history.trace
    assert trace.horizon == MARCH
    assert list(trace.requests) == expected(month, every_cluster=True)
    assert history.start == datetime(2026, 2, 28, 15, tzinfo=UTC)
    assert set(history.estimated) == {str(month.e.pk), str(month.w.pk)}
    assert history.routes[str(month.h.pk)] == (("other", None), ("sim", "training"))
    assert history.routes[str(month.f.pk)] == (("other", None),)
    assert trace.backfill_grace_seconds == 1800
    assert month_trace(month="2026-03") == trace


def test_the_fleet_is_todays_emptied_with_its_groups_and_drains(month):
    gpus = month_trace(month="2026-03").fleet.gpus
    assert len(gpus) == 26
    assert Pool.objects.filter(released_at=None).exists()  # B holds GPUs today, not at second 0
    assert not any(g.allocated or g.reconfiguring or any(s.allocated for s in g.instances) for g in gpus)
    groups = {(g.node, g.group) for g in gpus}
    assert groups == {
        ("sim/h200-1", "training"), ("sim/h200-2", "inference"), ("sim/h100-1", "training"),
        ("other/a100-1", None),
    }  # fmt: skip
    assert [g.node for g in gpus if not g.schedulable] == ["sim/h200-1"]
    assert {g.cluster for g in gpus} == {"sim", "other"}
    first = next(g for g in gpus if g.node == "sim/h200-1")
    assert first.mig and first.model == H200 and [s.profile for s in first.instances] == ["1g.18gb"] * 7


def test_one_cluster_keeps_its_requests_and_gpus_only(month):
    history = month_history(month="2026-03", cluster="sim")
    assert list(history.trace.requests) == expected(month, every_cluster=False)
    assert {g.cluster for g in history.trace.fleet.gpus} == {"sim"} and len(history.trace.fleet.gpus) == 24
    other = month_history(month="2026-03", cluster="other").trace
    assert [r.id for r in other.requests] == [str(month.f.pk)]  # H went to sim, so it is sim's


def test_the_month_under_way_runs_up_to_now(month):
    now = kst(10, 12)
    trace = month_history(month="2026-03", now=now).trace
    horizon = 9 * DAY + 12 * 3600
    assert trace.horizon == horizon
    assert [r.id for r in trace.requests] == [str(r.pk) for r in (month.a, month.b, month.c, month.e)]
    assert trace.requests[1].hold == horizon - trace.requests[1].arrive + 1
    with pytest.raises(HistoryError, match=r"The month 2026-04 has not begun yet \(Asia/Seoul\)"):
        month_history(month="2026-04", now=now)


@pytest.mark.parametrize("text", ["2026-13", "26-03", "2026/03", "1999-12", "3000-01", "", "2026-3", "March"])
def test_a_bad_month_is_refused_with_the_form_expected(text):
    expected = f"A month is written YYYY-MM, from 2000-01 to 2999-12, e.g. 2026-11, not {text!r}."
    with pytest.raises(HistoryError) as refused:
        month_trace(month=text)  # refused before the database is read: this test has none
    assert str(refused.value) == expected


def _requests(project, cluster, count: int) -> None:
    for n in range(count):
        request = PoolRequestFactory(
            project=project, cluster=cluster, purpose="training", state=RequestState.FULFILLED,
            approved_at=kst(2, n % 24), items=[("h100-80gb.full", 1), ("h200-141gb.mig-1g.18gb", 2)],
        )  # fmt: skip
        if n % 3:
            PoolFactory(
                project=project, request=request, cluster=cluster, state=PoolState.RELEASED,
                reserved_at=kst(2, n % 24), released_at=kst(3),
            )  # fmt: skip
        else:
            PoolRequest.objects.filter(pk=request.pk).update(state=RequestState.CANCELLED)


@pytest.mark.parametrize("count", [3, 30])
def test_the_queries_do_not_grow_with_the_months_requests(fleet, tenancy, django_assert_num_queries, count):
    _requests(tenancy.vision, fleet, count)
    with django_assert_num_queries(6):
        trace = month_trace(month="2026-03", cluster="sim")
    assert len(trace.requests) == count


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


@hypothesis_settings(max_examples=200, deadline=None)
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


# --- the command ------------------------------------------------------------------------------------------


def run(*args: str) -> tuple[str, str]:
    out, err = io.StringIO(), io.StringIO()
    call_command("simulate", *args, stdout=out, stderr=err)
    return out.getvalue(), err.getvalue()


CHANGES = ("--add", "8 H100-80GB training", "--remove", "h200-2", "--add", "16 H200-141GB inference")


def test_the_command_sets_the_changed_fleet_beside_the_real_one(month):
    out, err = run("--history", "2026-03", "--cluster", "sim", *CHANGES)
    report = json.loads(out)
    assert set(report) == {
        "month", "time_zone", "cluster", "horizon_seconds", "estimated_holds", "changes", "fleets",
    }  # fmt: skip
    assert (report["month"], report["cluster"], report["horizon_seconds"]) == ("2026-03", "sim", MARCH)
    assert report["changes"] == [
        "added 8 × H100-80GB (MIG off) in group training: sim/added-1",
        "removed sim/h200-2: 8 × H200-141GB",
        # h200-2, the only inference node, is gone by then: the line says so, as it would of a typo.
        "added 16 × H200-141GB (MIG off) in group inference (a group no GPU of the cluster was in): "
        "sim/added-2, sim/added-3",
    ]
    real, changed = report["fleets"]["real"], report["fleets"]["changed"]
    # Real: E waits for C's hour on the H100s, W's 7 H200s never fit beside B's 2; changed: neither waits.
    assert (real["gpus"], real["requests"], real["admitted"]) == (24, 6, 5)
    assert (real["mean_wait_seconds"], real["p95_wait_seconds"]) == (round(3480 / 5, 1), 3480)
    assert (changed["gpus"], changed["requests"], changed["admitted"]) == (40, 6, 6)
    assert (changed["mean_wait_seconds"], changed["p95_wait_seconds"]) == (0.0, 0)
    assert changed["served_slice_hours"] > real["served_slice_hours"] > 0
    for summary in (real, changed):
        low, mean, high = summary["stranded"].values()
        assert list(summary["stranded"]) == ["min", "mean", "max"] and low <= mean <= high
    assert err.startswith("2026-03 (Asia/Seoul), cluster sim: 6 requests\n")
    assert side_by_side(report) in err
    assert re.search(r"\nadmitted +5 +6\nserved slice-hours +[0-9.]+ +[0-9.]+\n", err)


def test_both_answers_keep_every_rule(month):
    history = month_history(month="2026-03")
    changes = parse_changes([(ADD, "8 H100-80GB training"), (REGROUP, "h100-1=inference")])
    fleet, _said = apply_changes(history.trace.fleet, changes, cluster="sim")
    for trace in (history.trace, SimulationTrace(fleet, history.trace.requests, history.trace.horizon, 1800)):
        result = simulate(trace, placer=RoutedPlacer(history.routes))
        assert check(trace, result.outcomes) == []
        admitted = {o.request: o for o in result.outcomes if o.admitted_at is not None}
        assert str(month.h.pk) in admitted and str(month.f.pk) in admitted
        sim = {g.id for g in trace.fleet.gpus if g.cluster == "sim"}
        assert {a.gpu for a in admitted[str(month.h.pk)].placement.assignments} <= sim


def test_without_changes_only_the_real_fleet_is_run_and_progress_is_told(month):
    told = []
    report = run_whatif(month="2026-03", progress=told.append)
    assert list(report["fleets"]) == ["real"] and report["changes"] == [] and report["cluster"] is None
    assert report["fleets"]["real"]["requests"] == 7 and report["estimated_holds"] == 2
    assert told[-1] == 1.0 and len(told) > 2 and told == sorted(told)  # told as the month goes
    told.clear()
    run_whatif(month="2026-03", cluster="sim", changes=[(REMOVE, "h100-1")], progress=told.append)
    first = told[: told.index(0.5) + 1]
    assert first[-1] == 0.5 and len(first) > 2 and told[-1] == 1.0 and told == sorted(told)


def _state() -> list:
    return [
        list(PoolRequest.objects.order_by("pk").values_list("pk", "state", "approved_at")),
        list(Pool.objects.order_by("pk").values_list("pk", "state", "reserved_at", "released_at")),
        list(GpuCapacity.objects.order_by("pk").values_list("pk", "drained", "layout", "planned_layout")),
        list(NodeCapacity.objects.order_by("pk").values_list("pk", "group_id")),
    ]


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("--history", "2026-3"),
         "A month is written YYYY-MM, from 2000-01 to 2999-12, e.g. 2026-11, not '2026-3'."),
        (("--history", "2999-12"), "The month 2999-12 has not begun yet (Asia/Seoul)."),
        (("--input", "-", "--add", "8 H100-80GB"), "--add needs --history YYYY-MM: a month to run."),
        (("--input", "-", "--cluster", "sim", "--regroup", "a=b"), "--cluster and --regroup need --history"),
        (("--history", "2026-03", "--cluster", "nope"), "No cluster is named 'nope'; the clusters: other,"),
        (("--history", "2026-03", "--cluster", "sim", "--remove", "h200-9"),
         "--remove h200-9: the fleet has no node 'h200-9'; close names: sim/h100-1, sim/h200-1, sim/h200-2."),
        (("--history", "2026-03", "--add", "8 H100-80GB"), "the fleet spans the clusters other, sim; name"),
        (("--history", "2026-03", "--add", "8 H300"), "--add '8 H300': unknown GPU model 'H300'"),
        (("--history", "2026-03", "--input", "-"), "argument --input: not allowed with argument --history"),
        ((), "one of the arguments --input is required, or --history YYYY-MM."),
    ],
)  # fmt: skip
def test_bad_input_is_refused_clearly_changing_nothing(month, args, message):
    before = _state()
    out = io.StringIO()
    with pytest.raises(CommandError) as refused:
        call_command("simulate", *args, stdout=out, stderr=io.StringIO())
    assert message in str(refused.value)
    assert out.getvalue() == ""
    assert _state() == before
