#!/usr/bin/env python
"""Benchmark: one Prometheus scrape of /metrics at a fleet's size, served as the web process serves it.

Builds, in a throwaway test database, `--gpus` H100 GPUs (8 a node, spread over `--clusters` clusters,
every other node cut into MIG instances: alternately two 3g.40gb and seven 1g.10gb a GPU) with fresh
newest figures for every GPU and every instance; `--tenants` tenants with one project each; `--pools`
active pools (one for every 50 GPUs unless told) holding about 60 % of the fleet's GPUs and instances;
`--faults` open GPU faults (and as many cleared ones, each with its event) and `--alerts` firing alerts on
GPUs (and as many resolved ones). The rows are written with COPY: 100,000 GPUs build in about a minute.

Then it scrapes /metrics once through the Django test client in this process (its database queries, time
and CPU: this process's and its database connection's, where PostgreSQL runs on this machine), starts the
web as the README runs it (`gunicorn --config deploy/gunicorn.conf.py portal.wsgi`, one worker,
DEBUG=false, a METRICS_TOKEN) on that database and scrapes it `--repeat` times as Prometheus does, with
the token, plain and gzipped (Prometheus asks for gzip): the size of the text each way, the median time of
a whole answer each way, the machine's load meanwhile, the samples, the GPUs that have series of their own,
and the bytes per part (cluster, tenant, pool, GPU, the rest).

Run from the repository root, with the test environment (PostgreSQL per DATABASE_URL, Redis per
REDIS_URL / CACHE_URL; a throwaway test database is created and dropped):
    .venv/bin/python bench/metrics.py [--gpus 8000] [--clusters 4] [--tenants 50] [--pools GPUS/50]
                                      [--faults 20] [--alerts 30] [--repeat 3] [--save FILE]
e.g. `--gpus 100000`. Prints one figure per line.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import re
import secrets
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from datetime import timedelta
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "portal.settings")
os.environ.setdefault("DEBUG", "false")
os.environ.setdefault("ALLOWED_HOSTS", "testserver,127.0.0.1,localhost")

import django  # noqa: E402

django.setup()

from django.conf import settings  # noqa: E402
from django.db import connection, connections  # noqa: E402
from django.test import Client  # noqa: E402
from django.test.utils import CaptureQueriesContext, setup_databases, teardown_databases  # noqa: E402
from django.utils import timezone  # noqa: E402

from monitoring.models import Alert, AlertRule, GpuEvent, GpuFault  # noqa: E402
from monitoring.models.alerts import RuleKind  # noqa: E402
from monitoring.models.samples import WHOLE_GPU  # noqa: E402
from pools import kinds, mig  # noqa: E402
from pools.models import Cluster, NodeCapacity, Pool, PoolRequest, PoolState, RequestState  # noqa: E402
from portal.models import Project, Tenant  # noqa: E402
from tests.factories import UserFactory  # noqa: E402

BIN = Path(sys.executable).parent
MODEL = "H100-80GB"
GPUS_PER_NODE = 8
GIB = 2**30
MEMORY = 80 * GIB
LAYOUTS = ({"3g.40gb": 2}, {"1g.10gb": 7})  # the MIG-cut nodes', in turn
GPUS_A_POOL = 50
HELD = 0.6  # the share of the fleet's GPUs and instances that pools hold
TARGET_BYTES = 1_000_000
TARGET_SECONDS = 1.0


# --- the fleet -----------------------------------------------------------------------------------


def _copy(table: str, rows: list[dict]) -> None:
    """Rows (dicts of one shape) into a table through COPY."""
    columns = list(rows[0]) if rows else []
    with (
        connection.cursor() as cursor,
        cursor.copy(f"COPY {table} ({', '.join(columns)}) FROM STDIN") as copy,
    ):
        for row in rows:
            copy.write_row([row[column] for column in columns])


def _layouts() -> list[list[tuple[str, int, int]]]:
    """Each MIG layout's instances: (profile, start, memory slices)."""
    model = mig.gpu_model(MODEL)
    return [
        [
            (i.profile, i.start, model.profile(i.profile).memory_slices)
            for i in sorted(mig.place_profiles(model, n))
        ]
        for n in LAYOUTS
    ]


def _fleet(gpus: int, clusters: int, now) -> tuple[list[Cluster], list[tuple]]:
    """Clusters, nodes and GPUs; every other node's GPUs cut. Returns the clusters and, per GPU, (id, its
    cluster's id, its instances or None)."""
    nodes = -(-gpus // GPUS_PER_NODE)
    made = Cluster.objects.bulk_create(
        Cluster(name=f"bench-{c}", driver=Cluster.Driver.SIMULATED) for c in range(clusters)
    )
    node_rows = NodeCapacity.objects.bulk_create(
        (
            NodeCapacity(
                cluster=made[n * clusters // nodes], name=f"node-{n:05d}", gpu_model=MODEL,
                gpu_count=GPUS_PER_NODE, mig_strategy="mixed", mig_state="success",
            )
            for n in range(nodes)
        ),
        batch_size=5000,
    )  # fmt: skip
    layouts, rows, cut = _layouts(), [], {}
    for n, node in enumerate(node_rows):
        cut[node.pk] = layouts[(n // 2) % len(layouts)] if n % 2 else None
        for index in range(min(GPUS_PER_NODE, gpus - n * GPUS_PER_NODE)):
            layout = [
                {"profile": p, "start": s, "uuid": f"MIG-{n}-{index}-{s}"} for p, s, _m in cut[node.pk] or ()
            ]
            rows.append(
                {"node_id": node.pk, "index": index, "uuid": f"GPU-{n:05d}-{index}", "model": MODEL,
                 "memory_mib": 81559, "mig_capable": True, "mig_enabled": bool(layout),
                 "layout": json.dumps(layout), "health": "ok", "drained": False, "present": True,
                 "last_change_at": now}
            )  # fmt: skip
    _copy("pools_gpucapacity", rows)
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT g.id, n.cluster_id, g.node_id FROM pools_gpucapacity g "
            "JOIN pools_nodecapacity n ON n.id = g.node_id ORDER BY g.node_id, g.index"
        )
        return made, [(gpu, cluster, cut[node]) for gpu, cluster, node in cursor.fetchall()]


def _figures(fleet: list[tuple], now) -> int:
    """Fresh newest figures of every GPU and instance (a cut GPU gives no utilisation or SM activity of its
    own, as NVML); returns how many rows."""
    rows = []
    for gpu, _cluster, instances in fleet:
        busy = gpu * 37 % 100
        whole = None if instances else float(busy)
        rows.append(
            {"gpu_id": gpu, "slot": WHOLE_GPU, "at": now, "profile": "", "instance_uuid": "",
             "power_w": 250.0 + busy, "temperature_c": 40.0 + busy % 40, "utilisation_pct": whole,
             "sm_active_pct": whole,
             "memory_used_bytes": MEMORY * busy // 100, "memory_total_bytes": MEMORY, "ecc_corrected": 0,
             "ecc_uncorrected": 0}
        )  # fmt: skip
        for k, (profile, start, memory_slices) in enumerate(instances or ()):
            share, total = (busy + 13 * k) % 100, MEMORY * memory_slices // mig.MEMORY_SLICES
            rows.append(
                {"gpu_id": gpu, "slot": start, "at": now, "profile": profile,
                 "instance_uuid": f"MIG-{gpu}-{start}", "power_w": None, "temperature_c": None,
                 "utilisation_pct": None, "sm_active_pct": float(share),
                 "memory_used_bytes": total * share // 100, "memory_total_bytes": total,
                 "ecc_corrected": None, "ecc_uncorrected": None}
            )  # fmt: skip
    for row in rows:
        row.update(source="agent", host="", problems="[]")
    _copy("monitoring_latest", rows)
    return len(rows)


def _pools(made: list[Cluster], fleet: list[tuple], tenants: int, pools: int, now) -> int:
    """Tenants with a project each and active pools, each holding a run of one cluster's GPUs and instances
    (HELD of each cluster's in all); returns how many allocations."""
    user = UserFactory(username="bench")
    projects = Project.objects.bulk_create(
        Project(tenant=tenant, slug="work", name="Work", namespace=f"{tenant.slug}-work")
        for tenant in Tenant.objects.bulk_create(
            Tenant(slug=f"tenant-{t:03d}", name=f"Tenant {t}") for t in range(tenants)
        )
    )
    since = now - timedelta(days=1)
    requests = PoolRequest.objects.bulk_create(
        PoolRequest(
            project=projects[k % tenants], submitted_by=user, state=RequestState.FULFILLED, purpose="",
            approved_at=since, decided_at=since,
        )
        for k in range(pools)
    )  # fmt: skip
    made_pools = Pool.objects.bulk_create(
        Pool(
            request=r, project=r.project, cluster=made[k % len(made)], state=PoolState.ACTIVE,
            reserved_at=since, active_at=since,
        )
        for k, r in enumerate(requests)
    )  # fmt: skip
    rows = []
    for c, cluster in enumerate(made):
        units = [
            (gpu, profile, start, start + size)
            for gpu, cluster_id, instances in fleet
            if cluster_id == cluster.pk
            for profile, start, size in instances or [(mig.FULL_GPU, 0, mig.MEMORY_SLICES)]
        ]
        held = units[: int(len(units) * HELD)]
        mine = made_pools[c :: len(made)]
        for k, pool in enumerate(mine):
            for gpu, profile, lower, upper in held[
                k * len(held) // len(mine) : (k + 1) * len(held) // len(mine)
            ]:
                rows.append(
                    {"pool_id": pool.pk, "gpu_id": gpu, "profile": profile, "slices": f"[{lower},{upper})",
                     "resource_name": kinds.resource_name(profile), "instance_uuid": "",
                     "allocated_at": since, "request_id": pool.request_id}
                )  # fmt: skip
    _copy("pools_allocation", rows)
    return len(rows)


def _troubles(fleet: list[tuple], faults: int, alerts: int, now) -> None:
    """Open faults (each with its event) and firing alerts on GPUs spread over the fleet, and as many
    cleared or resolved, which do not count."""
    step = max(1, len(fleet) // (2 * (faults + alerts) + 1))
    spread = [gpu for gpu, _cluster, _instances in fleet[::step]]
    events = GpuEvent.objects.bulk_create(
        GpuEvent(gpu_id=gpu, at=now - timedelta(minutes=5), kind=GpuEvent.Kind.XID, code=79)
        for gpu in spread[: 2 * faults]
    )
    GpuFault.objects.bulk_create(
        GpuFault(
            gpu_id=e.gpu_id, event=e, kind=e.kind, code=e.code, at=e.at, drained_by_portal=True,
            cleared_at=None if k < faults else now,
        )
        for k, e in enumerate(events)
    )  # fmt: skip
    rule = AlertRule.objects.filter(kind=RuleKind.THRESHOLD).order_by("pk").first()
    Alert.objects.bulk_create(
        Alert(
            rule=rule, subject=f"gpu:{gpu}", gpu_id=gpu, slot=WHOLE_GPU, message="hot",
            severity=rule.severity, value=90.0, fired_at=now - timedelta(minutes=10), last_seen_at=now,
            resolved_at=None if k < alerts else now,
        )
        for k, gpu in enumerate(spread[2 * faults : 2 * (faults + alerts)])
    )  # fmt: skip


def build(*, gpus: int, clusters: int, tenants: int, pools: int, faults: int, alerts: int) -> dict:
    started, now = time.perf_counter(), timezone.now()
    made, fleet = _fleet(gpus, clusters, now)
    figures = _figures(fleet, now)
    allocations = _pools(made, fleet, tenants, pools, now)
    _troubles(fleet, faults, alerts, now)
    with connection.cursor() as cursor:
        cursor.execute("ANALYZE")
    return {
        "gpus": len(fleet),
        "nodes": -(-gpus // GPUS_PER_NODE),
        "cut": sum(1 for _gpu, _cluster, instances in fleet if instances) // GPUS_PER_NODE,
        "latest": figures,
        "allocations": allocations,
        "seconds": time.perf_counter() - started,
    }


# --- the web, as the README runs it --------------------------------------------------------------


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def served(database: str, token: str):
    """gunicorn on the benchmark's database, its own process group; its address while it runs."""
    port = _free_port()
    env = {
        **os.environ,
        "DATABASE_URL": re.sub(r"/[^/]*$", f"/{database}", os.environ.get("DATABASE_URL", "")),
        "DEBUG": "false",
        "METRICS_TOKEN": token,
        "METRICS_PORT": "0",
        "PORT": str(port),
        "WEB_CONCURRENCY": "1",
        "WEB_TIMEOUT": "600",  # a scrape of the whole fleet per GPU takes long
    }
    env.pop("PROMETHEUS_MULTIPROC_DIR", None)
    log = tempfile.TemporaryFile()  # noqa: SIM115 - read after the process, closed below
    process = subprocess.Popen(
        [str(BIN / "gunicorn"), "--config", "deploy/gunicorn.conf.py", "portal.wsgi"],
        cwd=ROOT,
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                with urllib.request.urlopen(base + "/healthz", timeout=5) as answer:
                    if answer.status == 200:
                        break
            except OSError:
                pass
            if process.poll() is not None or time.monotonic() > deadline:
                log.seek(0)
                raise SystemExit("gunicorn did not answer:\n" + log.read().decode(errors="replace")[-3000:])
            time.sleep(0.3)
        yield base
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGTERM)
        try:
            process.wait(30)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()
        log.close()


def scrape(base: str, token: str, *, gzipped: bool) -> tuple[float, bytes]:
    """(seconds to the whole answer, its body as sent)."""
    headers = {"Authorization": f"Bearer {token}", "Accept-Encoding": "gzip" if gzipped else "identity"}
    started = time.perf_counter()
    with urllib.request.urlopen(
        urllib.request.Request(base + "/metrics", headers=headers), timeout=900
    ) as answer:
        body = answer.read()
        if answer.status != 200:
            raise SystemExit(f"/metrics answered {answer.status}")
    return time.perf_counter() - started, body


PARTS = (
    ("other", "gpu_portal_pool_provisioning_"),  # pools' own figure, not one per pool
    ("per cluster", "gpu_portal_cluster_"),
    ("per tenant", "gpu_portal_tenant_"),
    ("per pool", "gpu_portal_pool_"),
    ("per GPU", "gpu_portal_gpu_"),
)


def bytes_by_part(text: str) -> dict[str, int]:
    """The text's bytes (samples, HELP and TYPE lines) per part of the fleet; the rest is "other"."""
    sizes = dict.fromkeys([*(name for name, _prefix in PARTS[1:]), "other"], 0)
    for line in io.StringIO(text):
        name = line.split(" ", 3)[2] if line.startswith("#") else line
        part = next((part for part, prefix in PARTS if name.startswith(prefix)), "other")
        sizes[part] += len(line.encode())
    return sizes


def _backend_cpu() -> float | None:
    """CPU seconds used so far by this connection's database backend, where the database runs on this
    machine; None elsewhere."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_backend_pid()")
        (pid,) = cursor.fetchone()
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def gpus_with_series(text: str) -> int:
    """GPUs that have a series of their own: distinct uuid labels."""
    return len(set(re.findall(r'uuid="([^"]*)"', text)))


# --- the run -------------------------------------------------------------------------------------


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gpus", type=int, default=8000)
    parser.add_argument("--clusters", type=int, default=4)
    parser.add_argument("--tenants", type=int, default=50)
    parser.add_argument("--pools", type=int, help="active pools (default: one for every 50 GPUs)")
    parser.add_argument("--faults", type=int, default=20)
    parser.add_argument("--alerts", type=int, default=30)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--save", help="write the last plain scrape's text there")
    args = parser.parse_args()
    pools = args.pools if args.pools is not None else max(1, args.gpus // GPUS_A_POOL)
    if (
        min(args.gpus, args.clusters, args.tenants, pools, args.repeat) < 1
        or min(args.faults, args.alerts) < 0
    ):
        parser.error("--gpus, --clusters, --tenants, --pools and --repeat must be positive")
    if args.clusters > -(-args.gpus // GPUS_PER_NODE):
        parser.error("--clusters must not outnumber the nodes")
    token = secrets.token_urlsafe(32)
    databases = setup_databases(verbosity=0, interactive=False)
    try:
        built = build(
            gpus=args.gpus,
            clusters=args.clusters,
            tenants=args.tenants,
            pools=pools,
            faults=args.faults,
            alerts=args.alerts,
        )
        settings.METRICS_TOKEN = token
        client = Client()
        client.get("/metrics", HTTP_AUTHORIZATION=f"Bearer {token}")  # warm: imports, connection
        backend = _backend_cpu()
        with CaptureQueriesContext(connection) as queries:
            started, cpu = time.perf_counter(), time.process_time()
            answer = client.get("/metrics", HTTP_AUTHORIZATION=f"Bearer {token}")
            in_process, cpu = time.perf_counter() - started, time.process_time() - cpu
        backend = _backend_cpu() - backend if backend is not None else None
        if answer.status_code != 200:
            raise SystemExit(f"/metrics answered {answer.status_code}")
        database = connection.settings_dict["NAME"]
        connections.close_all()
        with served(database, token) as base:
            scrape(base, token, gzipped=True)  # a first scrape: the worker's imports and connection
            load = os.getloadavg()[0]
            plain = [scrape(base, token, gzipped=False) for _ in range(args.repeat)]
            packed = [scrape(base, token, gzipped=True) for _ in range(args.repeat)]
            load = max(load, os.getloadavg()[0])
    finally:
        connections.close_all()
        teardown_databases(databases, verbosity=0)
    text = plain[-1][1].decode()
    samples = sum(1 for line in io.StringIO(text) if line and not line.startswith("#"))
    seconds = statistics.median(t for t, _body in plain)
    size = len(plain[-1][1])
    print(
        f"fleet: {built['gpus']} GPUs on {built['nodes']} nodes in {args.clusters} clusters, {built['cut']} "
        f"nodes MIG-cut; {built['latest']} newest-figure rows; {pools} pools of {args.tenants} tenants "
        f"holding {built['allocations']} GPUs and instances; {args.faults} open faults, {args.alerts} firing "
        f"alerts (built in {built['seconds']:.0f} s)"
    )
    print(f"/metrics size: {size} bytes")
    print(f"/metrics size gzipped: {len(packed[-1][1])} bytes")
    print(f"/metrics time (gunicorn, median of {args.repeat}): {seconds * 1000:.0f} ms")
    print(
        f"/metrics time gzipped (gunicorn, median of {args.repeat}): "
        f"{statistics.median(t for t, _body in packed) * 1000:.0f} ms"
    )
    print(f"/metrics time (Django test client, one scrape): {in_process * 1000:.0f} ms")
    print(
        f"/metrics CPU (Django test client, one scrape): this process {cpu * 1000:.0f} ms, its database "
        f"connection {'unknown' if backend is None else f'{backend * 1000:.0f} ms'} "
        "(its parallel workers not counted)"
    )
    print(f"load average while scraping: {load:.1f} on {os.cpu_count()} CPUs")
    print(f"/metrics queries: {len(queries)}")
    print(f"/metrics samples: {samples}")
    print(f"GPUs with series of their own: {gpus_with_series(text)}")
    print("bytes: " + ", ".join(f"{part} {n}" for part, n in bytes_by_part(text).items()))
    if args.save:
        Path(args.save).write_text(text)
    print(f"under {TARGET_BYTES} bytes: {size < TARGET_BYTES}")
    print(f"under {TARGET_SECONDS:g} s: {seconds < TARGET_SECONDS}")


if __name__ == "__main__":
    main()
