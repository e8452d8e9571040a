"""`manage.py simulate --history`: a month of the portal's own requests becomes the simulator's trace on
today's fleet, emptied; fleet changes are read and applied in order; the command reports the real and the
changed fleet side by side, and refuses bad input with a message, changing nothing."""

import io
import json
import re
from datetime import UTC, datetime
from zoneinfo import ZoneInfo

import pytest
from django.core.management import CommandError, call_command

from pools import services
from pools.models import GpuCapacity, NodeCapacity, Pool, PoolRequest, PoolState, RequestState
from pools.placement import Item
from pools.placement.fleet_changes import (
    ADD,
    REGROUP,
    REMOVE,
    apply_changes,
    parse_changes,
)
from pools.placement.replay import check
from pools.placement.simulation import SimulationTrace, TimedRequest, simulate
from pools.placement.whatif import RoutedPlacer, side_by_side
from pools.selectors.history import HistoryError, month_history, month_trace
from pools.whatif.report import run_whatif
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


BAD_INPUT = [
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
]  # fmt: skip


def test_bad_input_is_refused_clearly_changing_nothing(month):
    """Each refusal in turn on one month: each would leave the next to find what it changed."""
    before = _state()
    for args, message in BAD_INPUT:
        out = io.StringIO()
        with pytest.raises(CommandError) as refused:
            call_command("simulate", *args, stdout=out, stderr=io.StringIO())
        assert message in str(refused.value), args
        assert out.getvalue() == "", args
        assert _state() == before, args
