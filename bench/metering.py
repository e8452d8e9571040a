#!/usr/bin/env python
"""Benchmark: metering one period of 100,000 active pools, next to a plain bulk insert of the same rows.

Builds 100,000 pools (one project for each of 1,000 tenants, each pool holding one to three instances of
one spec, each instance an allocation on a GPU of its own) reserved before the period, then times,
alternately, `billing.services.meter_period` (reads the allocations held in the period, counts their
seconds, copies the prices in force, writes the records and marks the period) and a plain
`bulk_create` of the same records already built in memory (the floor any metering could reach).
Each is repeated on an emptied usage table; the medians and their ratio are printed. Then the same
records, moved into November (Seoul), are closed into the 1,000 tenants' draft invoices, timed.

Run from the repository root, with the test environment (PostgreSQL per DATABASE_URL, Redis per
REDIS_URL / CACHE_URL; a throwaway test database is created and dropped):
    .venv/bin/python bench/metering.py [--pools 100000] [--repeat 3]
Prints one figure per line.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "portal.settings")
os.environ.setdefault("DEBUG", "true")

import django  # noqa: E402

django.setup()

from django.contrib.auth import get_user_model  # noqa: E402
from django.db.backends.postgresql.psycopg_any import NumericRange  # noqa: E402
from django.test.utils import setup_databases, teardown_databases  # noqa: E402

from billing import metering  # noqa: E402
from billing.conf import settings  # noqa: E402
from billing.demo import share_price  # noqa: E402
from billing.invoices import close_month  # noqa: E402
from billing.models import MeteredPeriod, Price, PriceList, UsageRecord  # noqa: E402
from billing.services import meter_period  # noqa: E402
from pools import kinds  # noqa: E402
from pools.gpu_models import model_info  # noqa: E402
from pools.models import (  # noqa: E402
    Allocation,
    Cluster,
    GpuCapacity,
    NodeCapacity,
    Pool,
    PoolRequest,
    PoolState,
    RequestItem,
    RequestState,
)
from portal.models import Project, Tenant  # noqa: E402

PERIOD_START = datetime(2026, 11, 30, 15, tzinfo=UTC)
SPECS = [
    ("H100-80GB", "1g.10gb"),
    ("H100-80GB", "full"),
    ("H200-141GB", "3g.71gb"),
    ("H200-141GB", "1g.18gb"),
]
BATCH = 5000
TENANTS = 1000  # or one for each pool, where there are fewer pools


def build(pools: int, tenant_count: int) -> float:
    started = time.perf_counter()
    user = get_user_model().objects.create(username="bench")
    cluster = Cluster.objects.create(name="bench", driver=Cluster.Driver.SIMULATED)
    tenants = Tenant.objects.bulk_create(
        [Tenant(slug=f"t{n}", name=f"Tenant {n}") for n in range(tenant_count)]
    )
    projects = Project.objects.bulk_create(
        [Project(tenant=t, slug="p", name="P", namespace=f"{t.slug}-p") for t in tenants]
    )
    price_list = PriceList.objects.create(name="bench")
    Price.objects.bulk_create(
        [
            Price(
                price_list=price_list,
                gpu_model=m,
                profile=p,
                hourly_price=share_price(m, p),
                valid_from=PERIOD_START - timedelta(days=30),
            )
            for m, p in SPECS
        ]
    )
    reserved = PERIOD_START - timedelta(hours=5)
    for first in range(0, pools, BATCH):
        numbers = range(first, min(pools, first + BATCH))
        requests = PoolRequest.objects.bulk_create(
            [
                PoolRequest(
                    project=projects[n % len(projects)], submitted_by=user, state=RequestState.FULFILLED
                )
                for n in numbers
            ]
        )
        RequestItem.objects.bulk_create(
            [
                RequestItem(request=r, gpu_model=SPECS[n % 4][0], profile=SPECS[n % 4][1], count=1 + n % 3)
                for n, r in zip(numbers, requests, strict=True)
            ]
        )
        made = Pool.objects.bulk_create(
            [
                Pool(
                    request=r,
                    project_id=r.project_id,
                    cluster=cluster,
                    state=PoolState.ACTIVE,
                    reserved_at=reserved,
                    active_at=reserved,
                )
                for r in requests
            ]
        )
        numbered = zip(numbers, made, strict=True)
        held = [(pool, *SPECS[n % 4]) for n, pool in numbered for _ in range(1 + n % 3)]
        node = NodeCapacity.objects.create(cluster=cluster, name=f"bench-{first}", gpu_count=len(held))
        gpus = GpuCapacity.objects.bulk_create(
            [GpuCapacity(node=node, index=k, model=model) for k, (_pool, model, _profile) in enumerate(held)]
        )
        Allocation.objects.bulk_create(
            [
                Allocation(
                    pool=pool,
                    gpu=gpu,
                    profile=profile,
                    slices=NumericRange(0, _size(model, profile)),
                    resource_name=kinds.resource_name(profile),
                    allocated_at=reserved,
                    request_id=pool.request_id,
                )
                for gpu, (pool, model, profile) in zip(gpus, held, strict=True)
            ],
            batch_size=BATCH,
        )
    return time.perf_counter() - started


def _size(model: str, profile: str) -> int:
    """The slots one unit of `profile` takes on a GPU of `model` (all 8 memory slices for a whole GPU)."""
    return kinds.kind_of(profile).slots(model_info(model), profile, 0)[1]


def same_rows() -> list[UsageRecord]:
    """The records metering writes for the period, built without it, as a plain insert would get them."""
    return [
        UsageRecord(
            pool_id=r.pool_id,
            gpu_model=r.gpu_model,
            profile=r.profile,
            period_start=r.period_start,
            count=r.count,
            seconds=r.seconds,
            unit_price=r.unit_price,
            currency=r.currency,
        )
        for r in UsageRecord.objects.all()
    ]


def empty() -> None:
    UsageRecord.objects.all().delete()
    MeteredPeriod.objects.all().delete()


def close_november(tenants: int, rows: list[UsageRecord]) -> float:
    """Time `close_month` over the rows, moved into the last metered period of November (Seoul)."""
    empty()
    last_of_november = PERIOD_START - timedelta(hours=1)
    for row in rows:
        row.pk, row.period_start = None, last_of_november
    UsageRecord.objects.bulk_create(rows, batch_size=BATCH)
    MeteredPeriod.objects.create(start=last_of_november, records=len(rows))
    began = time.perf_counter()
    closing = close_month("2026-11", now=PERIOD_START + timedelta(days=1))
    elapsed = time.perf_counter() - began
    assert len(closing.created) == tenants, closing.summary()
    return elapsed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pools", type=int, default=100_000)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    if args.pools < 1 or args.repeat < 1:
        parser.error("--pools and --repeat: at least 1")
    tenants = min(TENANTS, args.pools)
    databases = setup_databases(verbosity=0, interactive=False)
    try:
        built = build(args.pools, tenants)
        start = metering.whole_seconds(PERIOD_START)
        meter_period(start)
        rows = same_rows()
        assert len(rows) == args.pools, f"metering wrote {len(rows)} records for {args.pools} pools"
        metered, inserted = [], []
        for _ in range(args.repeat):
            empty()
            began = time.perf_counter()
            written = meter_period(start)
            metered.append(time.perf_counter() - began)
            assert written == args.pools
            empty()
            began = time.perf_counter()
            UsageRecord.objects.bulk_create(rows, batch_size=BATCH)
            inserted.append(time.perf_counter() - began)
            for row in rows:
                row.pk = None
        closed = close_november(tenants, rows)
    finally:
        teardown_databases(databases, verbosity=0)
    meter_s, insert_s = statistics.median(metered), statistics.median(inserted)
    print(
        f"pools: {args.pools} active, one spec each (1–3 allocations), "
        f"period {settings.METERING_PERIOD_SECONDS} s (built in {built:.0f} s)"
    )
    print(f"meter one period: median {meter_s:.2f} s ({args.pools / meter_s:,.0f} records/s)")
    print(f"plain bulk insert of the same rows: median {insert_s:.2f} s")
    print(f"metering vs plain insert: {meter_s / insert_s:.2f}×")
    print(f"close a month for {tenants} tenants ({args.pools} usage records): {closed:.2f} s")


if __name__ == "__main__":
    main()
