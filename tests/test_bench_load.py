"""bench/load.py, the benchmark of the portal under load, is not run by the suite; its figures are:
percentiles, the summary per page and the verdict on the target, so that it cannot rot unseen."""

import pytest

from bench import load_figures as figures
from bench import load_users as users


def test_percentiles_interpolate_between_ranks():
    assert figures.percentile([3.0], 95) == 3.0
    assert figures.percentile([4.0, 1.0, 3.0, 2.0], 50) == 2.5
    assert figures.percentile(list(range(1, 101)), 95) == pytest.approx(95.05)
    assert figures.percentile([1.0, 9.0], 0) == 1.0 and figures.percentile([1.0, 9.0], 100) == 9.0
    with pytest.raises(ValueError):
        figures.percentile([], 50)
    with pytest.raises(ValueError):
        figures.percentile([1.0], 101)


def test_the_summary_counts_each_page_and_the_total():
    samples = [figures.Sample("pools list", n / 1000, True) for n in range(1, 21)]
    samples += [figures.Sample("submit request", 0.5, False), figures.Sample("submit request", 0.1, True)]
    rows = figures.summarise(samples, seconds=10)
    assert [r.page for r in rows] == ["pools list", "submit request", "total"]
    pools, submit, total = rows
    assert (pools.requests, pools.errors, pools.per_second) == (20, 0, 2.0)
    assert pools.p50_ms == pytest.approx(10.5) and pools.p95_ms == pytest.approx(19.05)
    assert (submit.requests, submit.errors) == (2, 1)
    assert (total.requests, total.errors) == (22, 1) and total.per_second == pytest.approx(2.2)
    printed = figures.table(rows)
    assert printed.splitlines()[0].split() == [
        "page",
        "requests",
        "errors",
        "req/s",
        "p50",
        "ms",
        "p95",
        "ms",
    ]
    assert "submit request" in printed and len(printed.splitlines()) == 4


def test_the_target_names_each_miss():
    fast = [figures.Sample("capacity", 0.05, True)] * 19 + [figures.Sample("capacity", 0.15, True)]
    assert figures.misses(figures.summarise(fast, seconds=1)) == []
    slow = [*fast, figures.Sample("approvals", 0.3, True), figures.Sample("approvals", 0.01, False)]
    assert figures.misses(figures.summarise(slow, seconds=1)) == [
        "approvals: 1 errors",
        "approvals: p95 286 ms",
    ]
    assert figures.misses([]) == ["no requests were made"]


def test_the_cast_has_staff_and_a_tenant_each():
    people = users.cast(20)
    roles = [p.role for p in people]
    assert (roles.count("approver"), roles.count("operator"), roles.count("tenant")) == (2, 2, 16)
    assert len({p.tenant for p in people if p.role == "tenant"}) == 16
    assert sorted(p.share for p in people if p.role == "approver") == [(0, 2), (1, 2)]
