"""Factories of what-if runs, with a small report as a run writes it."""

from datetime import timedelta

import factory
from django.utils import timezone

from pools.models import WhatIfState
from tests.factories.tenancy import UserFactory


def whatif_report(month: str = "2026-11", *, changed: bool = True, points: int = 4) -> dict:
    """A small report as run_whatif writes it: the real fleet and, with `changed`, a changed one with more
    GPUs, each with a summary and a series of `points` two-hour buckets."""

    def fleet(gpus: int, busy: float) -> dict:
        return {
            "gpus": gpus, "requests": 10, "admitted": 9 if busy > 0.5 else 10,
            "served_slice_hours": round(gpus * 7 * busy * 2 * points, 2),
            "mean_wait_seconds": 5400.0 if busy > 0.5 else 0.0, "p95_wait_seconds": 7200 if busy > 0.5 else 0,
            "stranded": {"min": 0, "mean": 1.5, "max": 3},
            "series": {
                "step_seconds": 7200, "compute_slices": gpus * 7,
                "at": [n * 7200 for n in range(points)],
                "utilisation": [round(busy * (n + 1) / points, 4) for n in range(points)],
                "stranded": [float(n % 3) for n in range(points)],
                "waiting": [round(busy * n, 2) for n in range(points)],
                "mean_wait_seconds": [None if n % 2 else 1800 * n for n in range(points)],
            },
        }  # fmt: skip

    fleets = {"real": fleet(16, 0.8)}
    if changed:
        fleets["changed"] = fleet(24, 0.5)
    changes = ["added 8 × H200-141GB (MIG off) in group training: sim/added-1"] if changed else []
    return {
        "month": month, "time_zone": "Asia/Seoul", "cluster": None, "horizon_seconds": points * 7200,
        "estimated_holds": 1, "changes": changes, "fleets": fleets,
    }  # fmt: skip


class WhatIfRunFactory(factory.django.DjangoModelFactory):
    """A kept what-if run of last November, queued unless `state=` says otherwise: a done one has a small
    report (`whatif_report`), a failed one an error, each started and finished now; its deadline is half an
    hour away. `WhatIfRunFactory(state=WhatIfState.DONE, requested_by=erin)`."""

    class Meta:
        model = "pools.WhatIfRun"

    month = "2026-11"
    changes = factory.LazyFunction(lambda: [["add", "8 H200-141GB training"]])
    state = WhatIfState.QUEUED
    requested_by = factory.SubFactory(UserFactory, is_staff=True)
    deadline = factory.LazyFunction(lambda: timezone.now() + timedelta(minutes=30))
    started_at = factory.LazyAttribute(lambda r: None if r.state == WhatIfState.QUEUED else timezone.now())
    finished_at = factory.LazyAttribute(
        lambda r: timezone.now() if r.state in (WhatIfState.DONE, WhatIfState.FAILED) else None
    )
    progress = factory.LazyAttribute(lambda r: 1.0 if r.state == WhatIfState.DONE else 0.0)
    report = factory.LazyAttribute(lambda r: whatif_report(r.month) if r.state == WhatIfState.DONE else None)
    error = factory.LazyAttribute(
        lambda r: "--remove h200-9: the fleet has no node 'h200-9'." if r.state == WhatIfState.FAILED else ""
    )
