"""bench/simulate.py, the benchmark of placement over time, is not run by the suite; on small traces here: a
trace is its seed's, both placers' answers pass the replay check, first fit cuts only homogeneous layouts,
and the printed figures are those a recount from the outcomes gives."""

import math
import re
import statistics
from collections import Counter
from dataclasses import replace

import pytest
from hypothesis import given

from bench import simulate as bench
from bench import simulate_first_fit as baseline
from bench import simulate_trace as traces
from pools.mig import FULL_GPU, gpu_model, stranded_compute_slices
from pools.mig import Instance as MigInstance
from pools.placement import Fleet, Item, Placement, Request, place, validate_request
from pools.placement.replay import check
from pools.placement.simulation import SimulationTrace, TimedRequest, simulate
from tests.pools.test_placement import check_placement, gpu, has_allocation
from tests.pools.test_placement_properties import PROPERTY, gpus_, requests_

H100, H200 = "H100-80GB", "H200-141GB"
SMALL = dict(nodes=2, horizon=24 * 3600, requests=40)
# The homogeneous layouts first fit cuts: as many of the profile as fit, at the lowest starts.
HOMOGENEOUS = {
    (H100, "1g.10gb"): (0, 1, 2, 3, 4, 5, 6),
    (H100, "2g.20gb"): (0, 2, 4),
    (H100, "3g.40gb"): (0, 4),
    (H100, "4g.40gb"): (0,),
    (H100, "7g.80gb"): (0,),
    (H200, "1g.18gb"): (0, 1, 2, 3, 4, 5, 6),
    (H200, "1g.35gb"): (0, 2, 4, 6),
    (H200, "2g.35gb"): (0, 2, 4),
    (H200, "3g.71gb"): (0, 4),
}


def small(seed: int = 3, grace: int | None = traces.BACKFILL_GRACE_SECONDS) -> SimulationTrace:
    return traces.random_simulation_trace(seed, **SMALL, backfill_grace_seconds=grace)


# --- the trace ------------------------------------------------------------------------------------------


def test_the_same_seed_gives_the_same_trace_and_another_seed_another():
    assert small(3) == small(3)
    assert small(3).requests != small(4).requests


def test_a_trace_is_a_whole_free_fleet_and_requests_in_arrival_order_within_the_horizon():
    trace = small()
    models = Counter(g.model for g in trace.fleet.gpus)
    assert models == {H100: 8, H200: 8}
    assert all(not g.mig and not g.allocated and not g.instances for g in trace.fleet.gpus)
    arrivals = [r.arrive for r in trace.requests]
    assert arrivals == sorted(arrivals) and arrivals[0] >= 0 and arrivals[-1] < trace.horizon
    assert len({r.id for r in trace.requests}) == len(trace.requests)
    stretch = traces.hold_stretch(gpus=16, horizon=SMALL["horizon"], requests=SMALL["requests"], load=1.3)
    for request in trace.requests:
        assert traces.HOLD_MIN * stretch - 1 <= request.hold <= traces.HOLD_MAX * stretch + 1
        assert len({i.model for i in request.items}) == 1 and 1 <= len(request.items) <= 2
        for item in request.items:
            assert item.profile == FULL_GPU or gpu_model(item.model).profile(item.profile)
    assert trace.backfill_grace_seconds == 1800


def test_the_offered_load_is_about_the_target_and_the_requests_about_the_expected():
    many = [small(seed) for seed in range(200)]
    assert statistics.mean(traces.offered_load(t) for t in many) == pytest.approx(traces.LOAD, abs=0.06)
    assert statistics.mean(len(t.requests) for t in many) == pytest.approx(SMALL["requests"], abs=2)


# --- homogeneous first fit ------------------------------------------------------------------------------


def test_homogeneous_layouts_fill_the_gpu_with_one_profile():
    for (model, profile), starts in HOMOGENEOUS.items():
        assert baseline.homogeneous_layout(model, profile) == tuple((profile, s) for s in starts)


def test_first_fit_takes_free_instances_first_and_leaves_busy_gpus_alone():
    f = Fleet(
        (
            gpu("a/0", off=True),
            gpu("a/1", "3g.40gb@0* 1g.10gb@4 1g.10gb@5"),
            gpu("a/2", "1g.10gb@0 1g.10gb@1"),
        )
    )
    one = baseline.first_fit(f, Request("r", (Item(H100, "1g.10gb", 4),)))
    assert [(a.gpu, a.start) for a in one.assignments] == [("a/1", 4), ("a/1", 5), ("a/2", 0), ("a/2", 1)]
    assert one.reconfigure == ()
    more = baseline.first_fit(f, Request("r", (Item(H100, "1g.10gb", 5),)))
    # a/2 is wholly free but gave its own instances already; a/0 is cut into seven.
    assert [c.gpu for c in more.reconfigure] == ["a/0"]
    assert more.assignments[-1].gpu == "a/0" and more.assignments[-1].start == 0
    assert not baseline.first_fit(f, Request("r", (Item(H100, "4g.40gb", 3),))).placed


def test_first_fit_gives_a_mig_off_gpu_whole_before_switching_a_mig_gpu_off():
    f = Fleet((gpu("a/0", "2g.20gb@0"), gpu("a/1", off=True), gpu("a/2", off=True, busy=True)))
    one = baseline.first_fit(f, Request("r", (Item(H100, FULL_GPU, 1),)))
    assert one.reconfigure == () and [a.gpu for a in one.assignments] == ["a/1"]
    two = baseline.first_fit(f, Request("r", (Item(H100, FULL_GPU, 2),)))
    assert [(c.gpu, c.mig, c.instances) for c in two.reconfigure] == [("a/0", False, ())]
    assert sorted(a.gpu for a in two.assignments) == ["a/0", "a/1"]


def room(f: Fleet, request: Request, cluster: str) -> tuple[int, int]:
    """For a request of one item, what first fit may use in the cluster: the free instances of its profile,
    and the wholly free GPUs that hold none of them (each to be cut, or given whole)."""
    (item,) = request.items
    usable = [
        g
        for g in f.gpus
        if g.cluster == cluster
        and g.model == item.model
        and g.schedulable
        and request.group in (None, g.group)
    ]
    matching = [sum(not s.allocated and s.profile == item.profile for s in g.instances) for g in usable]
    if item.profile == FULL_GPU:
        matching = [0] * len(usable)
    cuttable = sum(not has_allocation(g) and not n for g, n in zip(usable, matching, strict=True))
    return sum(matching), cuttable


@PROPERTY
@given(gpus_(shares=False), requests_(shares=False))  # the baseline knows MIG and whole GPUs only
def test_first_fit_keeps_every_rule_and_cuts_only_homogeneous_layouts(f, request):
    placement = baseline.first_fit(f, request)
    check_placement(f, request, placement)
    gpus = {g.id: g for g in f.gpus}
    for change in placement.reconfigure:
        model = gpus[change.gpu].model
        if change.mig:
            (profile,) = {p for p, _ in change.instances}
            assert change.instances == baseline.homogeneous_layout(model, profile)
        else:
            assert any(a.gpu == change.gpu and a.profile == FULL_GPU for a in placement.assignments)
    if len(request.items) == 1 and not validate_request(request, f):
        (item,) = request.items
        clusters = dict.fromkeys(g.cluster for g in f.gpus)
        per_gpu = (
            1 if item.profile == FULL_GPU else len(baseline.homogeneous_layout(item.model, item.profile))
        )
        fits = [
            free + cuttable * per_gpu >= item.count
            for free, cuttable in (room(f, request, cluster) for cluster in clusters)
        ]
        assert placement.placed == any(fits)
        if placement.placed and item.profile != FULL_GPU and placement.reconfigure:
            cluster = gpus[placement.assignments[0].gpu].cluster
            assert room(f, request, cluster)[0] < item.count, "free instances first"


# --- both placers over time, and the figures ------------------------------------------------------------


@pytest.mark.parametrize("grace", [traces.BACKFILL_GRACE_SECONDS, None])
def test_both_placers_answers_pass_the_replay_check(grace):
    trace = small(grace=grace)
    for placer in (place, baseline.first_fit):
        result = simulate(trace, placer=placer)
        assert check(trace, result.outcomes) == []
        assert result.summary.admitted > 0
        assert any(o.placement.reconfigure for o in result.outcomes)
    cuts = [c for o in simulate(trace, placer=baseline.first_fit).outcomes for c in o.placement.reconfigure]
    assert cuts and all(len({p for p, _ in c.instances}) <= 1 for c in cuts)


def recount(trace: SimulationTrace, outcomes) -> dict[str, float]:
    """The figures, from the outcomes alone: what each admitted request held until its release or the
    horizon, the waits, and the stranded slices of the layouts as they were cut, over time."""
    served, waits, cuts = 0.0, [], []
    for position, (timed, outcome) in enumerate(zip(trace.requests, outcomes, strict=True)):
        if outcome.admitted_at is None:
            continue
        at = outcome.admitted_at
        waits.append(at - timed.arrive)
        served += traces.request_slices(timed) * (min(at + timed.hold, trace.horizon) - at) / 3600
        cuts += [(at, position, change) for change in outcome.placement.reconfigure]
    models = {g.id: g.model for g in trace.fleet.gpus}
    layouts: dict[str, tuple] = {}
    stranded_seconds, since, now = 0, 0, 0
    for at, _, change in sorted(cuts, key=lambda cut: cut[:2]):
        stranded_seconds += now * (at - since)
        layouts[change.gpu] = change.instances if change.mig else None
        since = at
        now = sum(
            stranded_compute_slices(gpu_model(models[g]), [MigInstance(s, p) for p, s in layout])
            for g, layout in layouts.items()
            if layout is not None
        )
    stranded_seconds += now * (trace.horizon - since)
    waits.sort()
    return {
        "served": served,
        "admitted": len(waits),
        "wait": statistics.mean(waits) / 3600,
        "p95": waits[math.ceil(0.95 * len(waits)) - 1] / 3600,
        "stranded": stranded_seconds / trace.horizon,
    }


def figure(printed: str, name: str) -> float:
    (match,) = re.findall(rf"^{re.escape(name)}: (-?[\d.]+)", printed, re.MULTILINE)
    return float(match)


def test_the_printed_figures_are_a_recount_of_the_outcomes(capsys):
    argv = ["--seeds", "2", "--nodes", "2", "--horizon", str(SMALL["horizon"]), "--requests", "40"]
    assert bench.main([*argv, "--no-null-grace"]) == 0
    printed = capsys.readouterr().out
    assert "replay check: no problems in any answer" in printed
    served = {}
    for name, placer in (("engine", place), ("first fit", baseline.first_fit)):
        counts = [recount(small(seed), simulate(small(seed), placer=placer).outcomes) for seed in (1, 2)]
        served[name] = sum(c["served"] for c in counts)
        total = f"{name} served compute-slice-hours (total)"
        assert figure(printed, total) == pytest.approx(served[name], abs=0.05)
        assert figure(printed, f"{name} admitted (total)") == sum(c["admitted"] for c in counts)
        for key, label, decimals in (
            ("wait", "mean wait", 0.005),
            ("p95", "p95 wait", 0.005),
            ("stranded", "mean stranded compute slices", 0.005),
        ):
            expected = statistics.mean(c[key] for c in counts)
            assert figure(printed, f"{name} {label} (mean of seeds)") == pytest.approx(expected, abs=decimals)
        fleet_hours = 2 * 16 * 7 * SMALL["horizon"] / 3600
        uses = re.search(rf"^{name} compute-slice-hours by use: allocated ([\d.]+) %", printed, re.MULTILINE)
        assert float(uses[1]) == pytest.approx(100 * served[name] / fleet_hours, abs=0.05)
    ratio = figure(printed, "engine / first fit served compute-slice-hours")
    assert ratio == pytest.approx(served["engine"] / served["first fit"], abs=0.0005)
    rows = [line.split() for line in printed.splitlines() if re.match(r"^\s*1800\s+\d", line)]
    assert [int(row[1]) for row in rows] == [1, 2]
    for row, seed in zip(rows, (1, 2), strict=True):
        assert int(row[2]) == len(small(seed).requests)
        assert float(row[3]) == pytest.approx(traces.offered_load(small(seed)), abs=0.005)


def test_an_answer_that_breaks_a_rule_is_printed_and_fails_the_run(capsys, monkeypatch):
    first_fit = baseline.first_fit

    def short(fleet, request, **context):
        """First fit, one instance short of what was asked."""
        placement = first_fit(fleet, request, **context)
        if placement.placed and len(placement.assignments) > 1:
            placement = Placement(placement.request, True, placement.reconfigure, placement.assignments[:-1])
        return placement

    monkeypatch.setattr(bench, "first_fit", short)
    argv = ["--seeds", "1", "--nodes", "2", "--horizon", str(SMALL["horizon"]), "--requests", "40"]
    assert bench.main(argv) == 1
    printed = capsys.readouterr().out
    assert re.search(r"^BENCH BUG seed 1: first fit: .* asked for .* and was given", printed, re.MULTILINE)
    assert "served" not in printed


def test_capacity_use_splits_every_slice_hour_and_counts_the_served_ones_as_allocated():
    trace = small()
    for placer in (place, baseline.first_fit):
        result = simulate(trace, placer=placer)
        use = bench.capacity_use(trace, result)
        assert use.total == pytest.approx(16 * 7 * SMALL["horizon"] / 3600)
        assert use.allocated == pytest.approx(result.summary.served_slice_hours)
        assert min(use.idle_instances, use.unprovisioned, use.wholly_free) >= 0
    # A 4g.40gb alone on a GPU leaves 3 compute slices that first fit never provisions.
    f = Fleet((gpu("a/0", off=True),))
    four = SimulationTrace(f, (TimedRequest("r", 0, 3600, (Item(H100, "4g.40gb", 1),)),), 7200)
    use = bench.capacity_use(four, simulate(four, placer=baseline.first_fit))
    assert (use.allocated, use.idle_instances, use.unprovisioned, use.wholly_free) == (4, 0, 3, 7)


def test_a_placer_that_cannot_be_simulated_is_a_problem_not_a_crash():
    def twice(fleet, request, **context):
        placement = baseline.first_fit(fleet, request, **context)
        return Placement(placement.request, True, placement.reconfigure, placement.assignments * 2)

    run = bench.simulated(small(), twice)  # engine.apply refuses an instance given twice
    assert run.result is None and len(run.problems) == 1 and "raised" in run.problems[0]


# --- weeks with declared holds --------------------------------------------------------------------------


def test_a_declared_share_adds_declared_holds_to_the_same_requests_on_time_or_early():
    plain, declared = small(3), traces.random_simulation_trace(3, **SMALL, declared=0.8)
    assert [replace(r, declared_hold=None) for r in declared.requests] == list(plain.requests)
    holds = [(r.hold, r.declared_hold) for r in declared.requests if r.declared_hold is not None]
    assert 0.5 * len(declared.requests) < len(holds) < len(declared.requests)
    assert all(hold <= said <= hold * (1 + traces.DECLARED_SLACK) + 1 for hold, said in holds)
    assert all(r.declared_hold is None for r in plain.requests)
    everyone = traces.random_simulation_trace(3, **SMALL, declared=1.0)
    assert all(r.declared_hold is not None for r in everyone.requests)


def test_no_slack_declares_every_hold_exactly():
    exact = traces.random_simulation_trace(3, **SMALL, declared=1.0, slack=0)
    assert [r.declared_hold for r in exact.requests] == [r.hold for r in exact.requests]
    loose = traces.random_simulation_trace(3, **SMALL, declared=1.0)
    assert any(r.declared_hold > r.hold for r in loose.requests)


def test_a_negative_slack_is_refused(capsys):
    with pytest.raises(SystemExit):
        bench.main(["--slack", "-0.1"])
    assert "--slack is a share of 0 or more" in capsys.readouterr().err


def test_the_weeks_with_declared_holds_compare_the_engine_with_and_without_ends_and_first_fit(capsys):
    argv = ["--seeds", "2", "--nodes", "2", "--horizon", str(SMALL["horizon"]), "--requests", "40"]
    assert bench.main([*argv, "--no-null-grace", "--declared", "0.9"]) == 0
    printed = capsys.readouterr().out
    assert "replay check: no problems in any answer" in printed
    served = {}
    for name, placer in (
        ("engine with ends", place),
        ("engine without ends", bench.without_ends),
        ("first fit", baseline.first_fit),
    ):
        runs = [
            simulate(traces.random_simulation_trace(seed, **SMALL, declared=0.9), placer=placer)
            for seed in (1, 2)
        ]
        served[name] = sum(run.summary.served_slice_hours for run in runs)
        assert figure(printed, f"{name} served compute-slice-hours, 90 % declared (total)") == pytest.approx(
            served[name], abs=0.05
        )
    for name in ("engine with ends", "engine without ends"):
        ratio = figure(printed, f"{name} / first fit served compute-slice-hours, 90 % declared")
        assert ratio == pytest.approx(served[name] / served["first fit"], abs=0.0005)
    gain = figure(printed, "engine with ends / without ends served compute-slice-hours, 90 % declared")
    assert gain == pytest.approx(served["engine with ends"] / served["engine without ends"], abs=0.0005)
    rows = [line.split() for line in printed.splitlines() if re.match(r"^\s*0\.90\s+1800\s+\d", line)]
    assert [int(row[2]) for row in rows] == [1, 2]
    assert "target engine with ends ≥ 1.10 × first fit served compute-slice-hours, 90 % declared" in printed


def test_without_ends_the_engine_places_as_if_no_end_were_known():
    trace = traces.random_simulation_trace(3, **SMALL, declared=1.0)
    blind = simulate(trace, placer=bench.without_ends)
    assert check(trace, blind.outcomes) == []
    assert all(o.placement.ends is None for o in blind.outcomes)
    told = simulate(trace)
    assert any(o.placement.ends is not None for o in told.outcomes)
    undeclared = replace(trace, requests=tuple(replace(r, declared_hold=None) for r in trace.requests))
    assert simulate(undeclared).outcomes == blind.outcomes


def test_declared_weeks_are_skipped_with_a_share_of_0(capsys):
    argv = ["--seeds", "1", "--nodes", "2", "--horizon", str(SMALL["horizon"]), "--requests", "40"]
    assert bench.main([*argv, "--no-null-grace", "--declared", "0"]) == 0
    printed = capsys.readouterr().out
    assert "declared" not in printed and "engine / first fit served compute-slice-hours" in printed
