#!/usr/bin/env python
"""Benchmark: GPU samples of a 1,000-GPU fleet through the agents' API, next to a plain COPY of the same
rows; then the 30-day chart of one GPU and of the whole fleet.

Builds one cluster of 125 nodes × 8 H100 GPUs (every other node cut into two 3g.40gb instances per GPU)
and an agent token. Then, for each of `--rounds` instants 15 s apart, every node posts its reading as a
node agent does (`POST /api/v1/monitoring/samples/`, one request per node, through the whole stack:
middleware, token, validation, ingest, storage); the samples stored per second are printed. The same
rows are then written with a plain `COPY monitoring_sample FROM STDIN` (the floor any ingest could
reach) into the emptied table; the two rates and their ratio are printed. Then each node posts all its
readings in one request, as an agent flushing its buffer does, and that rate is printed too.

Last, 30 days of 1-hour roll-ups and `--five-minute-days` of 5-minute ones for every GPU are generated,
and `monitoring.storage.samples.series` is timed for one GPU's and for the whole fleet's 30-day SM
activity (the queries the charts run), as the median of `--repeat` runs.

Run from the repository root, with the test environment (PostgreSQL per DATABASE_URL, Redis per
REDIS_URL / CACHE_URL; a throwaway test database is created and dropped):
    .venv/bin/python bench/ingest.py [--rounds 8] [--repeat 5] [--five-minute-days 7]
Prints one figure per line.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
import uuid
from datetime import UTC, datetime, timedelta
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "portal.settings")
os.environ.setdefault("DEBUG", "true")

import django  # noqa: E402

django.setup()

from django.conf import settings  # noqa: E402
from django.db import connection  # noqa: E402
from django.test import Client  # noqa: E402
from django.test.utils import setup_databases, teardown_databases  # noqa: E402

from monitoring.collectors import GpuReading, InstanceReading, Reading  # noqa: E402
from monitoring.collectors.wire import batch_to_json  # noqa: E402
from monitoring.ingest.tokens import issue_agent_token  # noqa: E402
from monitoring.storage import samples  # noqa: E402
from pools import mig  # noqa: E402
from pools.models import Cluster, GpuCapacity, NodeCapacity  # noqa: E402

NODES = 125
GPUS_PER_NODE = 8
MODEL = "H100-80GB"
MEMORY = 80 << 30


def build() -> tuple[Cluster, list[tuple[str, list[GpuCapacity]]]]:
    cluster = Cluster.objects.create(name="bench", driver=Cluster.Driver.SIMULATED)
    nodes = NodeCapacity.objects.bulk_create(
        [
            NodeCapacity(cluster=cluster, name=f"node-{n:03d}", gpu_model=MODEL, gpu_count=GPUS_PER_NODE)
            for n in range(NODES)
        ]
    )
    cut = mig.place_profiles(mig.gpu_model(MODEL), {"3g.40gb": 2})
    gpus = []
    for n, node in enumerate(nodes):
        for index in range(GPUS_PER_NODE):
            layout = (
                [{"profile": i.profile, "start": i.start, "uuid": f"MIG-{uuid.uuid4()}"} for i in sorted(cut)]
                if n % 2
                else []
            )
            gpus.append(
                GpuCapacity(
                    node=node,
                    index=index,
                    uuid=f"GPU-{uuid.uuid4()}",
                    model=MODEL,
                    memory_mib=81559,
                    mig_capable=True,
                    mig_enabled=bool(layout),
                    layout=layout,
                    health="ok",
                )
            )
    GpuCapacity.objects.bulk_create(gpus)
    by_node = [(node.name, [g for g in gpus if g.node_id == node.pk]) for node in nodes]
    return cluster, by_node


def reading(host: str, gpus: list[GpuCapacity], at: datetime, round_: int) -> Reading:
    return Reading(
        host,
        at,
        tuple(
            GpuReading(
                index=gpu.index,
                uuid=gpu.uuid,
                model="NVIDIA H100 80GB HBM3",
                mig_enabled=gpu.mig_enabled,
                power_w=300.0 + gpu.index + round_,
                temperature_c=55.0 + gpu.index,
                utilisation_pct=None if gpu.mig_enabled else 70.0,
                sm_active_pct=60.0 + round_,
                memory_used_bytes=MEMORY // 2,
                memory_total_bytes=MEMORY,
                ecc_corrected=0,
                ecc_uncorrected=0,
                instances=tuple(
                    InstanceReading(
                        uuid=entry["uuid"],
                        gpu_instance_id=n + 1,
                        profile=entry["profile"],
                        placement=(entry["start"], 4),
                        memory_used_bytes=MEMORY // 4,
                        memory_total_bytes=MEMORY // 2,
                        sm_active_pct=50.0 + n,
                    )
                    for n, entry in enumerate(gpu.layout)
                ),
            )
            for gpu in gpus
        ),
    )


def through_api(
    cluster: Cluster, fleet, rounds: int, start: datetime, *, buffered: bool
) -> tuple[int, float]:
    """Each node's readings posted one per request (an agent keeping up), or all of a node's rounds in one
    request (an agent flushing its buffer after the portal was away)."""
    key = issue_agent_token(cluster=cluster, name=f"bench-{buffered}").key
    client = Client(HTTP_AUTHORIZATION=f"Bearer {key}")
    at = [start + timedelta(seconds=15 * r) for r in range(rounds)]
    if buffered:
        bodies = [
            json.dumps(batch_to_json([reading(host, gpus, at[r], r) for r in range(rounds)]))
            for host, gpus in fleet
        ]
    else:
        bodies = [
            json.dumps(batch_to_json([reading(host, gpus, at[r], r)]))
            for r in range(rounds)
            for host, gpus in fleet
        ]
    started = time.perf_counter()
    stored = 0
    for body in bodies:
        answer = client.post("/api/v1/monitoring/samples/", body, content_type="application/json")
        if answer.status_code != 200:
            raise SystemExit(f"the portal answered {answer.status_code}: {answer.content[:300]!r}")
        stored += answer.json()["samples"]
    return stored, time.perf_counter() - started


def by_copy(rows: list[tuple]) -> float:
    with connection.cursor() as cursor:
        cursor.execute("TRUNCATE monitoring_sample")
        started = time.perf_counter()
        with cursor.copy(f"COPY monitoring_sample ({', '.join(samples.COLUMNS)}) FROM STDIN") as copy:
            for row in rows:
                copy.write_row(row)
        return time.perf_counter() - started


def stored_rows() -> list[tuple]:
    with connection.cursor() as cursor:
        cursor.execute(f"SELECT {', '.join(samples.COLUMNS)} FROM monitoring_sample")
        return cursor.fetchall()


def history(now: datetime, five_minute_days: int) -> int:
    """Roll-ups for every GPU: 30 days of hours, and the last `five_minute_days` of 5-minute buckets."""
    metrics = ", ".join(f"{m}_min, {m}_avg, {m}_max" for m in samples.METRICS)
    figures = ", ".join(
        "v, v, v" if m != "memory_used_bytes" else "(v * 1e8)::bigint, (v * 1e8)::bigint, (v * 1e8)::bigint"
        for m in samples.METRICS
    )
    total = 0
    with connection.cursor() as cursor:
        for seconds, span in ((3600, timedelta(days=30)), (300, timedelta(days=five_minute_days))):
            cursor.execute(
                f"INSERT INTO monitoring_rollup (gpu_id, slot, seconds, bucket, samples, {metrics}, "
                f"memory_total_bytes) SELECT g.id, -1, {seconds}, b, 20, {figures}, {MEMORY} "
                f"FROM pools_gpucapacity g, generate_series(%s::timestamptz, %s::timestamptz, "
                f"interval '{seconds} seconds') b, LATERAL (SELECT (g.id * 7 + extract(epoch FROM b)) "
                f"::bigint %% 100 AS v) x",
                [now - span, now - timedelta(seconds=seconds)],
            )
            total += cursor.rowcount
        cursor.execute("ANALYZE monitoring_rollup")
    return total


def median_time(call, repeat: int) -> float:
    times = []
    for _ in range(repeat):
        started = time.perf_counter()
        call()
        times.append(time.perf_counter() - started)
    return statistics.median(times)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=8, help="readings per node (15 s apart)")
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--five-minute-days", type=int, default=7)
    args = parser.parse_args()
    settings.DEBUG = False  # no query log
    settings.ALLOWED_HOSTS = ["testserver"]
    old = setup_databases(verbosity=0, interactive=False)
    try:
        cluster, fleet = build()
        now = datetime.now(UTC).replace(microsecond=0)
        start = now - timedelta(seconds=15 * args.rounds)
        samples.prepare_partitions(now=start)
        stored, api_seconds = through_api(cluster, fleet, args.rounds, start, buffered=False)
        rows = stored_rows()
        copy_seconds = min(by_copy(rows) for _ in range(3))
        with connection.cursor() as cursor:
            cursor.execute("TRUNCATE monitoring_sample")
        flushed, flush_seconds = through_api(cluster, fleet, args.rounds, start, buffered=True)
        gpus = sum(len(g) for _h, g in fleet)
        print(f"fleet: {gpus} GPUs on {NODES} nodes, {stored // args.rounds} samples per round")
        print(f"api: {stored} samples in {len(fleet) * args.rounds} requests, {api_seconds:.2f} s")
        print(f"api samples/s: {stored / api_seconds:,.0f}")
        print(f"copy samples/s: {len(rows) / copy_seconds:,.0f}")
        print(f"copy / api: {api_seconds / copy_seconds:.1f}x")
        print(f"api requests/s: {len(fleet) * args.rounds / api_seconds:,.0f}")
        print(
            f"api, a buffer of {args.rounds} readings per request: {flushed / flush_seconds:,.0f} samples/s"
        )
        print(f"copy / api with buffers: {flush_seconds / copy_seconds:.1f}x")
        written = history(now, args.five_minute_days)
        one = fleet[0][1][0].pk
        month = {"metric": "sm_active_pct", "start": now - timedelta(days=30), "end": now, "now": now}
        resolution, points = samples.series(**month, gpu_ids=[one])
        print(
            f"roll-up rows: {written:,}; the 30-day chart reads {resolution} s buckets, {len(points)} points"
        )
        single = median_time(lambda: samples.series(**month, gpu_ids=[one]), args.repeat)
        fleet_wide = median_time(lambda: samples.series(**month), args.repeat)
        print(f"30-day chart, one GPU: {single * 1000:.1f} ms")
        print(f"30-day chart, whole fleet: {fleet_wide * 1000:.1f} ms")
    finally:
        teardown_databases(old, verbosity=0)
    return 0


if __name__ == "__main__":
    sys.exit(main())
