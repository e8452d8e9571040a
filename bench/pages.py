#!/usr/bin/env python
"""Benchmark: every page and API list that grows with the fleet, served by gunicorn, next to the home page.

Builds a simulated fleet of `--gpus` H200 GPUs (8 a node) in `--clusters` clusters of equal size, half of
each node's GPUs cut into MIG instances (four layouts), with their newest figures (one row per GPU and per
instance, as agents leave them, all fresh) and a GPU event for one GPU in fifty. Then live pools admitted
by the queue itself (`admit_waiting`), one for every 50 GPUs (at least 40), each holding whole GPUs and MIG
instances (about a third of the fleet is held in all), over a tenant for every 20 pools (at least 4); one
of them is provisioned through to active, the others stay provisioning. The first tenant ("acme", its
member alice) also has `--requests` more pool requests in every state, a quarter of them awaiting a
decision (the approvals queue) and a quarter queued. The database's statistics are then gathered
(ANALYZE), as autovacuum would have done long before a fleet this size is served.

It then serves the portal as the README's run command does (`gunicorn --config deploy/gunicorn.conf.py
portal.wsgi`, three workers, DEBUG=false) and opens each page as the person who uses it, over HTTP: the
median time of `--repeat` loads after warm-ups, its ratio to the home page measured in the same run, its
queries (one load in this process) and its size in bytes. The pages are the operators' capacity pages
(overview, node search, a group's nodes, a node, quotas), the approvals queue and a request to decide, the
monitoring fleet page (as it opens, sorted by temperature, filtered to free GPUs), one GPU, one pool, the
alerts and faults, the tenants' pages and lists, the request form, and the API's lists under /api/v1/
(clusters, nodes, GPUs, the capacity summary, specs, requests, pools, quotas). Billing lists no GPU or node.

The specs API, the request form and the approvals pages read a picture of the fleet kept per process
while capacity does not change; the time to build it after a change (the first load after a sync,
admission or release) is printed, and so is each web process's memory (RSS) once the picture is built.
The capacity pages' figures are kept the same way, the monitoring pages' for MONITORING_FIGURES_SECONDS:
the warm-ups work them out, and the median is that of views that read them back, as most views do.

Run from the repository root, with the test environment (PostgreSQL per DATABASE_URL, Redis per
REDIS_URL / CACHE_URL; a throwaway test database is created and dropped; static files are collected into
a temporary directory):
    .venv/bin/python bench/pages.py [--gpus 8000] [--clusters 1] [--requests 1000] [--repeat 7]
e.g. 100,000 GPUs as 10 clusters of 1,250 nodes: `--gpus 100000 --clusters 10`.
Prints one figure per line.
"""

from __future__ import annotations

import argparse
import contextlib
import http.client
import os
import random
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
STATIC_ROOT = Path(tempfile.mkdtemp(prefix="portal-bench-static-"))
os.environ["DJANGO_SETTINGS_MODULE"] = "portal.settings"
os.environ["DEBUG"] = "false"  # served as in production
os.environ["STATIC_ROOT"] = str(STATIC_ROOT)
os.environ.setdefault("ALLOWED_HOSTS", "testserver,127.0.0.1,localhost")

import django  # noqa: E402

django.setup()

from django.conf import settings  # noqa: E402
from django.contrib.auth.models import Group  # noqa: E402
from django.core.management import call_command  # noqa: E402
from django.db import connection, connections  # noqa: E402
from django.test import Client  # noqa: E402
from django.test.utils import CaptureQueriesContext, setup_databases, teardown_databases  # noqa: E402
from django.urls import reverse  # noqa: E402
from django.utils import timezone  # noqa: E402

from monitoring.models import GpuEvent, Latest  # noqa: E402
from monitoring.models.samples import WHOLE_GPU  # noqa: E402
from pools import capacity_version  # noqa: E402
from pools.models import (  # noqa: E402
    GpuCapacity,
    NodeCapacity,
    Pool,
    PoolRequest,
    PoolState,
    RequestItem,
    RequestState,
)
from pools.services import admit_waiting, sync_inventory  # noqa: E402
from pools.services.provisioning import WAITING, provision_step  # noqa: E402
from portal.models import Role  # noqa: E402
from tests.factories import ClusterFactory, MembershipFactory, ProjectFactory, TenantFactory, UserFactory  # noqa: E402

GPUS_PER_NODE = 8
MODEL = "H200-141GB"
# Half of each node's GPUs cut into MIG instances, four ways; the other half whole.
LAYOUTS = [{"1g.18gb": 7}, {"3g.71gb": 2}, {"2g.35gb": 3}, {"4g.71gb": 1, "3g.71gb": 1}, *[None] * 4]
STATES = [RequestState.SUBMITTED, RequestState.REJECTED, RequestState.CANCELLED, RequestState.QUEUED]
GPUS_A_POOL = 50  # one live pool for every 50 GPUs of the fleet
POOLS_A_TENANT = 20  # tenants grow with the fleet: one for every 20 live pools (at least 4)
POOL_ITEMS = [("full", 12), ("1g.18gb", 10), ("3g.71gb", 4), ("2g.35gb", 3)]  # about 17 GPUs' worth
WEB_WORKERS = 3
WARM_UPS = WEB_WORKERS  # loads before timing, so that each web process has likely served the page once
BATCH = 10_000


# --- The fleet, its figures, requests and pools --------------------------------------------------------


def build_fleet(gpus: int, clusters: int) -> None:
    nodes = gpus // GPUS_PER_NODE // clusters
    for number in range(1, clusters + 1):
        name = "bench" if clusters == 1 else f"bench-{number}"
        cluster = ClusterFactory(name=name, fleet=[(f"{name}-h200", nodes, MODEL, LAYOUTS)])
        sync_inventory(cluster=cluster)


def build_figures() -> None:
    """The newest figures of every GPU and MIG instance, fresh, and a GPU event for one GPU in fifty."""
    now, rows, events = timezone.now(), [], []
    numbers = random.Random(7)
    for gpu_id, layout in GpuCapacity.objects.order_by("pk").values_list("pk", "layout").iterator(BATCH):
        slots = [(WHOLE_GPU, "")] + [(unit["start"], unit["profile"]) for unit in layout or []]
        for slot, profile in slots:
            rows.append(
                Latest(
                    gpu_id=gpu_id,
                    slot=slot,
                    profile=profile,
                    at=now,
                    source="agent",
                    power_w=numbers.uniform(80, 700),
                    temperature_c=numbers.uniform(30, 85),
                    utilisation_pct=numbers.uniform(0, 100),
                    sm_active_pct=numbers.uniform(0, 100),
                    memory_used_bytes=numbers.randrange(0, 141 << 30),
                    memory_total_bytes=141 << 30,
                )
            )
        if gpu_id % 50 == 0:
            events.append(GpuEvent(gpu_id=gpu_id, at=now, kind=GpuEvent.Kind.XID, code=79, detail="bench"))
        if len(rows) >= BATCH:
            Latest.objects.bulk_create(rows)
            rows = []
    Latest.objects.bulk_create(rows)
    GpuEvent.objects.bulk_create(events)


def build_people_and_work(gpus: int, requests: int):
    """Tenants with a project and a member each, live pools admitted by the queue spread over them, and the
    first tenant's past and waiting requests; returns (its member, an approver, an operator, live pools)."""
    wanted = max(40, gpus // GPUS_A_POOL)
    tenants, projects, members = max(4, wanted // POOLS_A_TENANT), [], []
    for number in range(tenants):
        tenant = TenantFactory(slug="acme" if number == 0 else f"tenant{number}", name=f"Tenant {number}")
        projects.append(ProjectFactory(tenant=tenant, slug="vision"))
        name = "alice" if number == 0 else f"member{number}"
        members.append(MembershipFactory(tenant=tenant, role=Role.MEMBER, user__username=name).user)
    member = members[0]
    approver = UserFactory(username="carol", is_staff=True)
    approver.groups.add(Group.objects.get(name="approver"))
    operator = UserFactory(username="root", is_staff=True, is_superuser=True)
    now = timezone.now()
    approved = PoolRequest.objects.bulk_create(
        PoolRequest(
            project=projects[n % tenants],
            submitted_by=members[n % tenants],
            state=RequestState.APPROVED,
            decided_by=approver,
            decided_at=now,
            approved_at=now,
            purpose="",
        )
        for n in range(wanted)
    )
    RequestItem.objects.bulk_create(
        RequestItem(request=r, gpu_model=MODEL, profile=profile, count=count)
        for r in approved
        for profile, count in POOL_ITEMS
    )
    admit_waiting()
    rest = PoolRequest.objects.bulk_create(
        PoolRequest(project=projects[0], submitted_by=member, state=STATES[n % len(STATES)])
        for n in range(requests)
    )
    RequestItem.objects.bulk_create(
        RequestItem(request=r, gpu_model=MODEL, profile="3g.71gb", count=1 + n % 3)
        for n, r in enumerate(rest)
    )
    # One pool provisioned through to active (its cluster synced again), for the pool pages; the others
    # stay provisioning, live and holding their capacity.
    first = Pool.objects.filter(project=projects[0], state=PoolState.PROVISIONING).order_by("pk").first()
    for _ in range(10):
        if provision_step(pool_id=first.pk) != WAITING:
            break
    pools = Pool.objects.filter(state__in=[PoolState.PROVISIONING, PoolState.ACTIVE]).count()
    return member, approver, operator, pools


# --- gunicorn, as the README runs it ----------------------------------------------------------------


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Web:
    """gunicorn with deploy/gunicorn.conf.py on the benchmark's database, in its own process group."""

    def __init__(self, logs: Path):
        self.port = free_port()
        self.log_path = logs / "gunicorn.log"
        database = settings.DATABASES["default"]
        env = {
            **os.environ,
            "DATABASE_URL": f"postgres://{database['USER']}@{database['HOST']}:{database['PORT']}/{database['NAME']}",
            "DEBUG": "false",
            "PORT": str(self.port),
            "WEB_CONCURRENCY": str(WEB_WORKERS),
            "STATIC_ROOT": str(STATIC_ROOT),
            "STAFF_REQUIRE_TOTP": "false",
            "METRICS_PORT": "0",
            "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}",
        }
        if database.get("PASSWORD"):
            env["PGPASSWORD"] = database["PASSWORD"]
        self.log = open(self.log_path, "wb")  # noqa: SIM115 - kept open while gunicorn runs
        gunicorn = str(Path(sys.executable).parent / "gunicorn")
        self.process = subprocess.Popen(
            [gunicorn, "--config", "deploy/gunicorn.conf.py", "portal.wsgi"],
            cwd=ROOT,
            env=env,
            stdout=self.log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                break
            with contextlib.suppress(OSError):
                if self.get("/healthz", "")[0] == 200:
                    return
            time.sleep(0.3)
        self.stop()
        raise SystemExit("gunicorn did not answer:\n" + self.log_path.read_text(errors="replace")[-3000:])

    def get(self, path: str, session: str) -> tuple[int, bytes]:
        client = http.client.HTTPConnection("127.0.0.1", self.port, timeout=300)
        try:
            headers = {"Host": "127.0.0.1", "Accept": "text/html,application/json"}
            if session:
                headers["Cookie"] = f"{settings.SESSION_COOKIE_NAME}={session}"
            client.request("GET", path, headers=headers)
            response = client.getresponse()
            return response.status, response.read()
        finally:
            client.close()

    def workers(self) -> list[int]:
        """The ids of gunicorn's worker processes (its master's children)."""
        found = []
        for entry in Path("/proc").iterdir():
            if entry.name.isdigit():
                with contextlib.suppress(OSError):
                    fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
                    if int(fields[1]) == self.process.pid:
                        found.append(int(entry.name))
        return sorted(found)

    @staticmethod
    def memory(pid: int) -> tuple[int, int]:
        """(resident set now, its peak) of a process, in bytes."""
        status = dict(
            line.split(":", 1) for line in Path(f"/proc/{pid}/status").read_text().splitlines() if ":" in line
        )
        return int(status["VmRSS"].split()[0]) * 1024, int(status["VmHWM"].split()[0]) * 1024

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.process.wait(30)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.process.pid, signal.SIGKILL)
        self.process.wait()
        self.log.close()


# --- Measuring -------------------------------------------------------------------------------------


def session_of(user) -> str:
    client = Client()
    client.force_login(user)
    return client.cookies[settings.SESSION_COOKIE_NAME].value


def queries_of(user, url: str) -> int:
    """The queries of one load in this process (same code, same database)."""
    client = Client()
    client.force_login(user)
    connection.queries_log.clear()
    with CaptureQueriesContext(connection) as ctx:
        response = client.get(url)
    if response.status_code != 200:
        raise SystemExit(f"{url} answered {response.status_code} in this process")
    return len(ctx)


class Refused(Exception):
    """A page that answered something else than 200 (gunicorn answers 500 to a request past its timeout)."""


def measure(web: Web, session: str, url: str, repeat: int) -> tuple[float, int]:
    """(median seconds of `repeat` loads after the warm-ups, bytes of the page); `Refused` where a load
    answers something else than 200."""
    times = []
    for n in range(WARM_UPS + repeat):
        started = time.perf_counter()
        status, body = web.get(url, session)
        if status != 200:
            raise Refused(f"answered {status} after {time.perf_counter() - started:.0f} s")
        if n >= WARM_UPS:
            times.append(time.perf_counter() - started)
    return statistics.median(times), len(body)


def pages(member, approver, operator) -> list[tuple[str, object, str]]:
    tenant, project = "acme", "vision"
    node = NodeCapacity.objects.order_by("cluster__name", "name").first()
    gpu = GpuCapacity.objects.filter(node=node).order_by("index").first()
    undecided = PoolRequest.objects.filter(state=RequestState.SUBMITTED).order_by("pk").first()
    pool = Pool.objects.filter(project__tenant__slug=tenant, state=PoolState.ACTIVE).order_by("pk").first()
    fleet = reverse("monitoring-fleet")
    lists = ("cluster-list", "capacity-node-list", "capacity-gpu-list")
    api = {name: reverse(f"v1:{name}") for name in lists}
    return [
        ("home", member, reverse("home")),
        ("tenant", member, reverse("tenant", kwargs={"slug": tenant})),
        ("project", member, reverse("project", kwargs={"tenant_slug": tenant, "slug": project})),
        ("tenant request list", member, reverse("tenant-requests", kwargs={"tenant_slug": tenant})),
        ("tenant pool list", member, reverse("tenant-pools", kwargs={"tenant_slug": tenant})),
        ("pool page", member, reverse("pool", kwargs={"tenant_slug": tenant, "pk": pool.pk})),
        (
            "request form",
            member,
            reverse("pool-request-new", kwargs={"tenant_slug": tenant, "slug": project}),
        ),
        ("admin request list", approver, reverse("admin:pools_poolrequest_changelist")),
        ("approvals queue (25 verdicts)", approver, reverse("approvals")),
        ("approvals, approved waiting", approver, reverse("approvals") + "?tab=queue"),
        ("approval page", approver, reverse("approval", kwargs={"pk": undecided.pk})),
        ("capacity overview", operator, reverse("capacity-dashboard")),
        ("capacity overview, node search", operator, reverse("capacity-dashboard") + f"?node={node.name}"),
        (
            "capacity group page",
            operator,
            reverse("capacity-group", kwargs={"pk": node.cluster_id, "group": "none"}),
        ),
        ("capacity node page", operator, reverse("capacity-node", kwargs={"pk": node.pk})),
        ("capacity quotas", operator, reverse("capacity-quotas")),
        ("monitoring fleet", operator, fleet),
        ("monitoring fleet, hottest first", operator, fleet + "?sort=-temperature"),
        ("monitoring fleet, free GPUs", operator, fleet + "?state=free"),
        ("monitoring GPU page", operator, reverse("monitoring-gpu", kwargs={"pk": gpu.pk})),
        ("monitoring pool page", operator, reverse("monitoring-pool", kwargs={"pk": pool.pk})),
        ("alerts", operator, reverse("monitoring-alerts")),
        ("faults", operator, reverse("monitoring-faults")),
        ("API clusters", operator, api["cluster-list"]),
        ("API capacity nodes", operator, api["capacity-node-list"]),
        ("API capacity GPUs", operator, api["capacity-gpu-list"]),
        ("API capacity summary", operator, reverse("v1:capacity-summary")),
        ("API specs", member, reverse("v1:specs")),
        ("API pool requests", member, reverse("v1:pool-request-list")),
        ("API pools", member, reverse("v1:pool-list")),
        ("API quotas", operator, reverse("v1:quotas")),
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gpus", type=int, default=8000, help="GPUs of the fleet, 8 a node")
    parser.add_argument("--clusters", type=int, default=1, help="clusters the fleet is split into, equally")
    parser.add_argument("--requests", type=int, default=1000)
    parser.add_argument("--repeat", type=int, default=7)
    args = parser.parse_args()
    if args.clusters < 1 or args.gpus < GPUS_PER_NODE * args.clusters or args.requests < 4 or args.repeat < 1:
        parser.error("needs --clusters ≥ 1, --gpus ≥ 8 × --clusters, --requests ≥ 4 and --repeat ≥ 1")
    if args.gpus % (GPUS_PER_NODE * args.clusters):
        parser.error(f"--gpus must split into --clusters clusters of whole {GPUS_PER_NODE}-GPU nodes")
    settings.SIMULATED_MIG_APPLY_SECONDS = 0
    logs = Path(tempfile.mkdtemp(prefix="portal-bench-pages-"))
    call_command("collectstatic", interactive=False, verbosity=0)
    databases = setup_databases(verbosity=0, interactive=False)
    web = None
    try:
        started = time.perf_counter()
        build_fleet(args.gpus, args.clusters)
        fleet_built = time.perf_counter() - started
        build_figures()
        member, approver, operator, pools = build_people_and_work(args.gpus, args.requests)
        with connection.cursor() as cursor:  # as autovacuum would have (see above)
            cursor.execute("ANALYZE")
        built = time.perf_counter() - started
        listed = pages(member, approver, operator)
        sessions = {user.pk: session_of(user) for user in (member, approver, operator)}
        connections.close_all()
        web = Web(logs)
        before = {pid: web.memory(pid)[0] for pid in web.workers()}
        figures = []
        for name, user, url in listed:
            try:
                seconds, size = measure(web, sessions[user.pk], url, args.repeat)
            except Refused as refused:
                figures.append((name, None, None, str(refused)))
                continue
            figures.append((name, queries_of(user, url), seconds, size))
        after = {pid: web.memory(pid) for pid in web.workers()}
        capacity_version.changed()  # as after a sync, admission or release
        started = time.perf_counter()
        web.get(reverse("v1:specs"), sessions[member.pk])
        rebuilt = time.perf_counter() - started
    finally:
        if web is not None:
            web.stop()
        connections.close_all()
        teardown_databases(databases, verbosity=0)
        shutil.rmtree(STATIC_ROOT, ignore_errors=True)
    nodes = args.gpus // GPUS_PER_NODE // args.clusters
    print(
        f"fleet: {args.gpus} GPUs in {args.clusters} cluster(s) of {nodes} nodes, half MIG-cut; {pools} live "
        f"pools; {args.requests} more requests (fleet synced in {fleet_built:.0f} s, "
        f"all built in {built:.0f} s)"
    )
    print(
        f"served by gunicorn (deploy/gunicorn.conf.py), {WEB_WORKERS} workers, DEBUG=false; "
        f"{os.cpu_count()} CPUs"
    )
    home = figures[0][2]
    for name, queries, seconds, size in figures:
        if seconds is None:
            print(f"{name}: {size}")
            continue
        print(
            f"{name}: {queries} queries, median {seconds * 1000:.1f} ms ({seconds / home:.1f}× home), "
            f"{size / 1000:.1f} kB"
        )
    measured = [f for f in figures[1:] if f[2] is not None]
    worst = max(measured, key=lambda f: f[2])
    within = worst[2] / home <= 10 and len(measured) == len(figures) - 1
    print(f"slowest: {worst[0]}, {worst[2] / home:.1f}× home; every page within 10× home: {within}")
    print(
        f"specs API, first load after a capacity change: {rebuilt * 1000:.0f} ms ({rebuilt / home:.0f}× home)"
    )
    mib = 1 << 20
    for pid, (rss, peak) in after.items():
        started = before.get(pid, 0) / mib
        print(
            f"web process {pid}: RSS {started:.0f} MiB after start, {rss / mib:.0f} MiB with the capacity "
            f"picture built (peak {peak / mib:.0f} MiB)"
        )


if __name__ == "__main__":
    main()
