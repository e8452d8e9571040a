#!/usr/bin/env python
"""Benchmark: the portal under load — many tenants and platform staff at once, against gunicorn on
PostgreSQL with a real Celery worker and beat.

Creates its own database (`portal_load`, dropped first and dropped again at the end) and two Redis
databases, migrates, loads the demo, then adds a simulated cluster of `--nodes` nodes × 8 full H200
GPUs and one tenant per simulated tenant member (a project, a member and a history of requests). It
starts gunicorn (`--workers`, DEBUG=false), a Celery worker and beat, signs each simulated user in
over HTTP as a browser does (the sign-in form, its session cookie and CSRF token), then for
`--seconds` runs `--users` users at once, each pausing a random 0..2×`--think` seconds between pages:

- tenant members (most of them) open their tenant page, its pools and requests, the request form,
  submit a request for one full GPU (the form's POST), and release one of their active pools;
- approvers open /approvals/, a request awaiting a decision, and approve it, so that pools become
  active (each approver takes its own share of the requests, so that two never race for one);
- operators open /capacity/ and a group of GPUs.

Prints, per page, requests, errors (any status but the expected one: 200 for a page, 302 after a
form), requests per second, p50 and p95 in ms; the total; and whether the target holds (no errors,
p95 under 200 ms on every page). Processes, database and Redis databases are cleaned up on exit,
Ctrl-C included. The simulated people are bench/load_users.py; the figures, bench/load_figures.py.

Run from the repository root (PostgreSQL per DATABASE_URL, Redis per REDIS_URL; their server is
used, the database names are the benchmark's own):
    .venv/bin/python bench/load.py [--users 20] [--seconds 60] [--think 1.0] [--workers 5] [--nodes 100]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.load_figures import TARGET_P95_MS, misses, summarise, table  # noqa: E402
from bench.load_users import CLUSTER, PASSWORD, ROUNDS, cast, simulate  # noqa: E402

PYTHON = sys.executable
BIN = Path(PYTHON).parent
DATABASE = "portal_load"
REDIS_DATABASES = (13, 14)  # the cache and the broker of the benchmark's own portal
HISTORY = 60  # past requests of each tenant, so that its list has more than one page


# --- The portal under test: database, data, processes -------------------------------------------


def environment() -> dict[str, str]:
    """The portal's settings for its processes: served as in production, over plain http, on the
    benchmark's own database and Redis databases."""
    database = urlsplit(os.environ.get("DATABASE_URL") or "postgres://postgres@127.0.0.1:5432/portal")
    redis = urlsplit(os.environ.get("REDIS_URL") or "redis://127.0.0.1:6379/0")
    cache, broker = (urlunsplit(redis._replace(path=f"/{n}")) for n in REDIS_DATABASES)
    return {
        **os.environ,
        "DJANGO_SETTINGS_MODULE": "portal.settings",
        "DATABASE_URL": urlunsplit(database._replace(path=f"/{DATABASE}")),
        "REDIS_URL": broker,
        "CACHE_URL": cache,
        "DEBUG": "false",
        "SECRET_KEY": secrets.token_urlsafe(50),
        "ALLOWED_HOSTS": "127.0.0.1,localhost",
        "SECURE_SSL_REDIRECT": "false",
        "SESSION_COOKIE_SECURE": "false",
        "CSRF_COOKIE_SECURE": "false",
        "SECURE_HSTS_SECONDS": "0",
        "STAFF_REQUIRE_TOTP": "false",
        "SIMULATED_MIG_APPLY_SECONDS": "1",
        # As behind the proxy of a real site: each simulated person comes from an address of their own
        # (X-Forwarded-For), so that the per-address sign-in limits see people, not one benchmark.
        "TRUSTED_PROXY_COUNT": "1",
        # Behind a proxy the portal refuses to start without a metrics token (portal/startup.py).
        "METRICS_TOKEN": secrets.token_urlsafe(32),
        "PATH": f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}",
    }


def recreate_database(env: dict[str, str], *, drop_only: bool = False) -> None:
    import psycopg
    import redis

    admin = urlunsplit(urlsplit(env["DATABASE_URL"])._replace(path="/postgres"))
    with psycopg.connect(admin, autocommit=True) as db:
        db.execute(f"DROP DATABASE IF EXISTS {DATABASE} WITH (FORCE)")
        if not drop_only:
            db.execute(f"CREATE DATABASE {DATABASE}")
    for name in ("REDIS_URL", "CACHE_URL"):
        redis.from_url(env[name]).flushdb()


def manage(env: dict[str, str], *args: str) -> None:
    subprocess.run([PYTHON, "manage.py", *args], cwd=ROOT, env=env, check=True, stdout=subprocess.DEVNULL)


def seed(*, tenants: int, nodes: int) -> None:
    """The benchmark's fleet and tenants, on top of the demo (in this process, on the portal's database)."""
    import django

    django.setup()
    from django.contrib.auth import get_user_model
    from django.contrib.auth.hashers import make_password
    from django.db import connections, transaction

    from pools.drivers.simulated import fleet_state
    from pools.drivers.simulated import seed as seed_fleet
    from pools.models import Cluster, PoolRequest, RequestItem, RequestState
    from pools.services import sync_inventory
    from portal.models import Membership, Project, Role, Tenant

    with transaction.atomic():
        cluster = Cluster.objects.create(name=CLUSTER, driver=Cluster.Driver.SIMULATED)
        seed_fleet(cluster, fleet_state([("load-h200", nodes, "H200-141GB", [None] * 8)]))
    sync_inventory(cluster=cluster)
    password = make_password(PASSWORD)  # hashed once: every simulated member has the same password
    states = [RequestState.REJECTED, RequestState.CANCELLED]
    User = get_user_model()
    with transaction.atomic():
        for n in range(tenants):
            tenant = Tenant.objects.create(slug=f"load-{n}", name=f"Load tenant {n}")
            project = Project.objects.create(
                tenant=tenant,
                slug="train",
                name="Training",
                namespace=Project.default_namespace(tenant.slug, "train"),
            )
            user = User.objects.create(username=f"load{n}", email=f"load{n}@load.example", password=password)
            Membership.objects.create(user=user, tenant=tenant, role=Role.MEMBER)
            past = PoolRequest.objects.bulk_create(
                PoolRequest(project=project, submitted_by=user, state=states[k % len(states)], purpose="")
                for k in range(HISTORY)
            )
            RequestItem.objects.bulk_create(
                RequestItem(request=r, gpu_model="H200-141GB", profile="full", count=1 + k % 3)
                for k, r in enumerate(past)
            )
    connections.close_all()


class Processes:
    """gunicorn, the Celery worker and beat, each in its own process group, so that stopping one
    stops its children too."""

    def __init__(self, env: dict[str, str], logs: Path):
        self.env, self.logs, self.running = env, logs, []

    def start(self, name: str, *args: str) -> None:
        log = open(self.logs / f"{name}.log", "wb")  # noqa: SIM115 - kept open while the process runs
        process = subprocess.Popen(
            args, cwd=ROOT, env=self.env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
        )
        self.running.append((name, process, log))

    def exited(self) -> list[str]:
        return [name for name, process, _log in self.running if process.poll() is not None]

    def tail(self, name: str, lines: int = 20) -> str:
        return "\n".join((self.logs / f"{name}.log").read_text(errors="replace").splitlines()[-lines:])

    def tracebacks(self) -> dict[str, int]:
        return {
            name: count
            for name, *_ in self.running
            if (count := (self.logs / f"{name}.log").read_text(errors="replace").count("Traceback"))
        }

    def cpu_seconds(self) -> dict[str, float]:
        """CPU time (user + system) so far of each process group's live processes, from /proc."""
        groups = {process.pid: name for name, process, _log in self.running}
        used = dict.fromkeys(groups.values(), 0.0)
        ticks = os.sysconf("SC_CLK_TCK")
        for entry in Path("/proc").iterdir():
            if not entry.name.isdigit():
                continue
            try:
                fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            except OSError:  # gone meanwhile
                continue
            # after the name: state, ppid, pgrp, …; utime and stime are the 14th and 15th fields of the line
            if (name := groups.get(int(fields[2]))) is not None:
                used[name] += (int(fields[11]) + int(fields[12])) / ticks
        return used

    def stop(self) -> None:
        """Each main process is asked to stop its own children (gunicorn its workers, Celery its pool);
        a group still there after 15 s is killed whole."""
        for _name, process, _log in self.running:
            if process.poll() is None:
                process.terminate()
        deadline = time.monotonic() + 15
        for _name, process, log in self.running:
            with contextlib.suppress(subprocess.TimeoutExpired):
                process.wait(max(0.1, deadline - time.monotonic()))
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGKILL)  # what outlived its main process too
            process.wait()
            log.close()


async def wait_until_served(base: str, processes: Processes, seconds: float = 60) -> None:
    import aiohttp

    deadline = time.monotonic() + seconds
    async with aiohttp.ClientSession() as session:
        while time.monotonic() < deadline:
            if processes.exited():
                break
            try:
                async with session.get(base + "/favicon.ico") as response:
                    if response.status == 200:
                        return
            except aiohttp.ClientError:
                pass
            await asyncio.sleep(0.5)
    raise RuntimeError(f"gunicorn did not answer:\n{processes.tail('gunicorn')}")


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def stop_on_sigterm() -> None:
    """SIGTERM ends the run like Ctrl-C does: through the clean-up."""

    def stop(_signum, _frame):
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, stop)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--users", type=int, default=20)
    parser.add_argument("--seconds", type=float, default=60)
    parser.add_argument("--think", type=float, default=1.0, help="mean pause between a user's pages (s)")
    parser.add_argument("--workers", type=int, default=2 * (os.cpu_count() or 1) + 1, help="gunicorn workers")
    parser.add_argument("--nodes", type=int, default=100, help="nodes (8 GPUs each) of the extra cluster")
    args = parser.parse_args()
    if args.users < 3 or args.seconds <= 0 or args.think < 0 or args.workers < 1 or args.nodes < 1:
        parser.error("needs --users ≥ 3 and positive --seconds, --workers, --nodes")
    stop_on_sigterm()
    env = environment()
    os.environ.update(env)
    logs = Path(tempfile.mkdtemp(prefix="portal-load-"))
    processes = Processes(env, logs)
    people = cast(args.users)
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    try:
        started = time.perf_counter()
        recreate_database(env)
        manage(env, "migrate", "--noinput")
        manage(env, "collectstatic", "--noinput", "--verbosity", "0")
        manage(env, "demo")
        seed(tenants=sum(p.role == "tenant" for p in people), nodes=args.nodes)
        print(f"set up in {time.perf_counter() - started:.0f} s; logs in {logs}", flush=True)
        processes.start(
            "gunicorn", str(BIN / "gunicorn"), "portal.wsgi", "--bind", f"127.0.0.1:{port}",
            "--workers", str(args.workers), "--log-level", "warning",
        )  # fmt: skip
        processes.start("worker", str(BIN / "celery"), "-A", "portal", "worker", "--loglevel", "WARNING")
        processes.start(
            "beat", str(BIN / "celery"), "-A", "portal", "beat", "--loglevel", "WARNING",
            "--schedule", str(logs / "beat-schedule"), "--pidfile=",
        )  # fmt: skip
        asyncio.run(wait_until_served(base, processes))
        cpu_before = processes.cpu_seconds()
        measured = asyncio.run(simulate(base, people, seconds=args.seconds, think=args.think))
        cpu = {name: used - cpu_before.get(name, 0.0) for name, used in processes.cpu_seconds().items()}
        gone = processes.exited()
        tracebacks = processes.tracebacks()
    finally:
        processes.stop()
        recreate_database(env, drop_only=True)
    rows = summarise((s for p in people for s in p.samples), measured)
    roles = {r: sum(p.role == r for p in people) for r in ROUNDS}
    print(
        f"{args.users} users ({roles['tenant']} tenant members, {roles['approver']} approvers, "
        f"{roles['operator']} operators) for {measured:.0f} s, think time 0..{2 * args.think:g} s; "
        f"gunicorn {args.workers} workers, {os.cpu_count()} CPUs; fleet +{args.nodes * 8} GPUs"
    )
    print(table(rows))
    print("CPU seconds used meanwhile: " + ", ".join(f"{name} {used:.1f}" for name, used in cpu.items()))
    failures = [f for p in people for f in p.failures]
    for failure in failures[:10]:
        print(f"error: {failure}")
    found = misses(rows)
    if gone:
        found.append(f"stopped during the run: {', '.join(gone)}")
    if tracebacks:
        found.extend(f"{count} tracebacks in the {name} log" for name, count in tracebacks.items())
    if not found:
        shutil.rmtree(logs, ignore_errors=True)
    verdict = "holds" if not found else "misses (" + "; ".join(found) + f"; logs in {logs})"
    print(f"target (no errors, p95 < {TARGET_P95_MS:.0f} ms on every page): {verdict}")
    return 0 if not found else 1


if __name__ == "__main__":
    try:
        sys.exit(main())
    except KeyboardInterrupt:  # Ctrl-C or SIGTERM: main() has stopped the processes and dropped the database
        print("interrupted: processes stopped, database dropped", file=sys.stderr)
        sys.exit(130)
