#!/usr/bin/env python
"""Benchmark: quotas over time. Strict quotas against none against guarantees with borrowing and reclaim, on
the same seeded weeks, in the what-if simulator under the portal's one admission policy.

Traces (bench/quotas_trace.py): the fleet of bench/simulate.py (8 nodes × 8 whole free GPUs, half H100 and
half H200); TENANTS tenants, each guaranteed an equal share of each model, so that the guarantees cover the
fleet; each tenant's demand comes in bursts (busy spells of hours to a day with requests arriving fast, quiet
spells between), some asking on average for less than their guarantees and some for more, together for
the whole fleet; items drawn as bench/placement.py draws them. Each trace is run four times:
- (a) strict: the guarantees are the limits, nothing is borrowed;
- (b) none: no quotas at all, the portal as it was before quotas (priority, then arrival);
- (c) borrowing: the same guarantees, no limit, borrowed pools reclaimed with RECLAIM_NOTICE seconds of
  notice for a request within its tenant's guarantee, and a reclaimed pool's request asked again for what
  its hold had left, as the portal does by default (RECLAIM_REQUEUE);
- (c') the same, the reclaimed pools' work lost instead (RECLAIM_REQUEUE off).
It prints per seed and in total the compute-slice-hours each served before the horizon, the ratios of (c)
to (a) and to (b) (and (b) to (a): what no policy that lends idle capacity could pass), and the
95th-percentile wait of the requests within their tenant's guarantee as they arrived (classified in (c), the
same requests measured in (b)), over all the weeks and on the worst one, against the notice plus one queue
interval (QUEUE_RUN_SECONDS, the portal's default). Targets are printed, not asserted. Every answer is
replayed by pools.placement.replay.check; a broken rule prints a line starting "ENGINE BUG" and exits with
status 1. The runs go to `--processes` processes.

Run from the repository root; no database, no Django:
    .venv/bin/python bench/quotas.py [--seeds 5] [--first-seed 1] [--tenants 4] [--horizon 604800]
                                     [--spread 1.5] [--quiet-hours 22.5] [--processes N]
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import sys
import time
from dataclasses import replace
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.quotas_trace import (  # noqa: E402
    BURST_SPREAD,
    QUIET_MEAN,
    RECLAIM_NOTICE,
    TENANTS,
    bursty_trace,
)
from bench.simulate_trace import WEEK  # noqa: E402
from pools.placement.admission import Quota  # noqa: E402
from pools.placement.replay import check  # noqa: E402
from pools.placement.simulation import SimulationResult, SimulationTrace, p95, simulate  # noqa: E402

SEEDS = 5
QUEUE_RUN_SECONDS = 60  # pools/conf.py's default: how often beat runs the queue
TARGET_OVER_STRICT = 1.15
TARGET_OVER_NONE = 0.97
POLICIES = ("strict", "none", "borrowing", "lost")


def with_policy(trace: SimulationTrace, policy: str) -> SimulationTrace:
    """The trace under one policy: the guarantees as limits, no quotas, or guarantees without limits with
    reclaimed pools asked again ("borrowing") or not ("lost")."""
    if policy == "none":
        return replace(trace, quotas={})
    limit = (lambda q: q.guaranteed) if policy == "strict" else (lambda q: None)
    quotas = {
        tenant: {key: Quota(quota.guaranteed, limit(quota)) for key, quota in keys.items()}
        for tenant, keys in trace.quotas.items()
    }
    return replace(trace, quotas=quotas, requeue_reclaimed=policy == "borrowing")


def within_waits(trace: SimulationTrace, result: SimulationResult, within: set[str]) -> list[int]:
    arrive = {r.id: r.arrive for r in trace.requests}
    return [
        o.admitted_at - arrive[o.request]
        for o in result.outcomes
        if o.request in within and o.admitted_at is not None
    ]


def weeks(seed: int, args: argparse.Namespace) -> SimulationTrace:
    return bursty_trace(
        seed,
        tenants=args.tenants,
        horizon=args.horizon,
        spread=args.spread,
        quiet_mean=args.quiet_hours * 3600,
    )


def run_one(job: tuple[int, argparse.Namespace, str]) -> tuple[int, str, SimulationResult, float]:
    seed, args, policy = job
    trace = with_policy(weeks(seed, args), policy)
    started = time.perf_counter()
    result = simulate(trace)
    seconds = time.perf_counter() - started
    for problem in check(trace, result.outcomes):
        print(f"ENGINE BUG seed {seed} {policy}: {problem}")
        raise SystemExit(1)
    return seed, policy, result, seconds


def summarize(seed: int, args: argparse.Namespace, runs: dict[str, SimulationResult]) -> dict:
    base = weeks(seed, args)
    within = runs["borrowing"].within
    waits = {p: within_waits(base, runs[p], within) for p in ("borrowing", "none")}
    return {
        "seed": seed,
        "served": {p: runs[p].summary.served_slice_hours for p in POLICIES},
        "within": len(within),
        "waits": waits,
        "p95_within": {p: p95(found) for p, found in waits.items()},
        "reclaimed": runs["borrowing"].summary.reclaimed,
        "requests": len(base.requests),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[1])
    parser.add_argument("--seeds", type=int, default=SEEDS)
    parser.add_argument("--first-seed", type=int, default=1)
    parser.add_argument("--tenants", type=int, default=TENANTS)
    parser.add_argument("--horizon", type=int, default=WEEK)
    parser.add_argument("--spread", type=float, default=BURST_SPREAD, help="of the tenants' burst loads")
    parser.add_argument("--quiet-hours", type=float, default=QUIET_MEAN / 3600, help="mean quiet spell")
    parser.add_argument("--processes", type=int, default=os.cpu_count() or 1)
    args = parser.parse_args(argv)
    seeds = range(args.first_seed, args.first_seed + args.seeds)
    jobs = [(seed, args, policy) for seed in seeds for policy in POLICIES]
    with multiprocessing.Pool(max(1, args.processes)) as workers:
        done = workers.map(run_one, jobs, chunksize=1)
    runs: dict[int, dict[str, SimulationResult]] = {seed: {} for seed in seeds}
    for seed, policy, result, _elapsed in done:
        runs[seed][policy] = result
    rows = [summarize(seed, args, runs[seed]) for seed in seeds]
    target_wait = RECLAIM_NOTICE + QUEUE_RUN_SECONDS
    print(f"{'seed':>4} {'requests':>8} {'strict':>9} {'none':>9} {'borrow':>9} {'lost':>9} {'c/a':>6} "
          f"{'c/b':>6} {'b/a':>6} {'within':>6} {'p95 (c)':>8} {'p95 (b)':>8} {'reclaims':>8}")  # fmt: skip
    for row in rows:
        served = row["served"]
        print(
            f"{row['seed']:>4} {row['requests']:>8} {served['strict']:>9.0f} {served['none']:>9.0f} "
            f"{served['borrowing']:>9.0f} {served['lost']:>9.0f} "
            f"{served['borrowing'] / served['strict']:>6.3f} {served['borrowing'] / served['none']:>6.3f} "
            f"{served['none'] / served['strict']:>6.3f} {row['within']:>6} "
            f"{_seconds(row['p95_within']['borrowing']):>8} {_seconds(row['p95_within']['none']):>8} "
            f"{row['reclaimed']:>8}"
        )
    total = {p: sum(row["served"][p] for row in rows) for p in POLICIES}
    print(f"served compute-slice-hours (a) strict: {total['strict']:.0f}")
    print(f"served compute-slice-hours (b) none: {total['none']:.0f}")
    print(f"served compute-slice-hours (c) borrowing: {total['borrowing']:.0f}")
    print(f"served compute-slice-hours (c') borrowing, reclaimed work lost: {total['lost']:.0f}")
    print(f"(c)/(a): {total['borrowing'] / total['strict']:.3f} (target ≥ {TARGET_OVER_STRICT})")
    print(f"(c)/(b): {total['borrowing'] / total['none']:.3f} (target ≥ {TARGET_OVER_NONE})")
    print(f"(b)/(a): {total['none'] / total['strict']:.3f} (the most lending idle capacity could give)")
    print(f"(c')/(b): {total['lost'] / total['none']:.3f}")
    pooled = {p: [wait for row in rows for wait in row["waits"][p]] for p in ("borrowing", "none")}
    print(
        f"p95 wait within the guarantee, all weeks, (c): {_seconds(p95(pooled['borrowing']))} s "
        f"(target ≤ {target_wait} s); (b), the same requests: {_seconds(p95(pooled['none']))} s"
    )
    worst = max((row["p95_within"]["borrowing"] or 0) for row in rows)
    worst_none = max((row["p95_within"]["none"] or 0) for row in rows)
    print(f"p95 wait within the guarantee, worst week, (c): {worst} s; (b): {worst_none} s")
    late = sum(wait > target_wait for wait in pooled["borrowing"])
    print(f"requests within the guarantee that waited longer than {target_wait} s, (c): {late} of "
          f"{len(pooled['borrowing'])}")  # fmt: skip
    print(f"reclaimed pools (c): {sum(row['reclaimed'] for row in rows)}")
    print(f"simulator seconds per run: {max(seconds for *_rest, seconds in done):.1f} at most")
    return 0


def _seconds(value: int | None) -> str:
    return "-" if value is None else str(value)


if __name__ == "__main__":
    raise SystemExit(main())
