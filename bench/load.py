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
Ctrl-C included.

Run from the repository root (PostgreSQL per DATABASE_URL, Redis per REDIS_URL; their server is
used, the database names are the benchmark's own):
    .venv/bin/python bench/load.py [--users 20] [--seconds 60] [--think 1.0] [--workers 5] [--nodes 100]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import random
import re
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

ROOT = Path(__file__).resolve().parents[1]
PYTHON = sys.executable
BIN = Path(PYTHON).parent
DATABASE = "portal_load"
REDIS_DATABASES = (13, 14)  # the cache and the broker of the benchmark's own portal
PASSWORD = "load-password"
TARGET_P95_MS = 200.0
HISTORY = 60  # past requests of each tenant, so that its list has more than one page
SPEC = "h200-141gb.full"  # what tenants ask for: one full GPU of the benchmark's cluster
CLUSTER = "load"


# --- Figures (pure: no Django, no network) ------------------------------------------------------


@dataclass(frozen=True)
class Sample:
    """One request a simulated user made: the page's name, how long it took, whether it went as expected."""

    page: str
    seconds: float
    ok: bool


@dataclass(frozen=True)
class Row:
    page: str
    requests: int
    errors: int
    per_second: float
    p50_ms: float
    p95_ms: float


def percentile(values: Sequence[float], q: float) -> float:
    """The q-th percentile (0..100) of `values`, interpolated linearly between the closest ranks."""
    if not values:
        raise ValueError("no values")
    if not 0 <= q <= 100:
        raise ValueError("q must be within 0..100")
    ordered = sorted(values)
    rank = (len(ordered) - 1) * q / 100
    low = int(rank)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (rank - low)


def summarise(samples: Iterable[Sample], seconds: float) -> list[Row]:
    """One row per page (in the order pages were first met), then the total over every page."""
    if seconds <= 0:
        raise ValueError("seconds must be positive")
    by_page: dict[str, list[Sample]] = {}
    for sample in samples:
        by_page.setdefault(sample.page, []).append(sample)
    everything = [s for page in by_page.values() for s in page]
    rows = [_row(page, found, seconds) for page, found in by_page.items()]
    if everything:
        rows.append(_row("total", everything, seconds))
    return rows


def _row(page: str, samples: list[Sample], seconds: float) -> Row:
    times = [s.seconds * 1000 for s in samples]
    return Row(
        page=page,
        requests=len(samples),
        errors=sum(not s.ok for s in samples),
        per_second=len(samples) / seconds,
        p50_ms=percentile(times, 50),
        p95_ms=percentile(times, 95),
    )


def misses(rows: Sequence[Row], target_ms: float = TARGET_P95_MS) -> list[str]:
    """Why the target does not hold (empty when it does): errors anywhere, a page's p95 over target."""
    if not rows:
        return ["no requests were made"]
    found = []
    for row in rows:
        if row.page == "total":
            continue
        if row.errors:
            found.append(f"{row.page}: {row.errors} errors")
        if row.p95_ms >= target_ms:
            found.append(f"{row.page}: p95 {row.p95_ms:.0f} ms")
    return found


def table(rows: Sequence[Row]) -> str:
    width = max([len("page"), *(len(r.page) for r in rows)])
    lines = [f"{'page':<{width}}  {'requests':>8}  {'errors':>6}  {'req/s':>7}  {'p50 ms':>7}  {'p95 ms':>7}"]
    for r in rows:
        lines.append(
            f"{r.page:<{width}}  {r.requests:>8}  {r.errors:>6}  {r.per_second:>7.2f}  "
            f"{r.p50_ms:>7.1f}  {r.p95_ms:>7.1f}"
        )
    return "\n".join(lines)


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


# --- The simulated users -------------------------------------------------------------------------

CSRF = re.compile(r'name="csrfmiddlewaretoken" value="([^"]+)"')


@dataclass
class User:
    """One simulated person: who signs in, as what, and what they have met."""

    username: str
    role: str  # tenant | approver | operator
    tenant: str = ""
    share: tuple[int, int] = (0, 1)  # an approver takes the requests whose id % share[1] == share[0]
    samples: list[Sample] = field(default_factory=list)
    failures: list[str] = field(default_factory=list)


class Browser:
    """A user's session over HTTP: cookies kept, each request timed under a page's name."""

    def __init__(self, session, base: str, user: User, think: float):
        self.session, self.base, self.user, self.think = session, base, user, think
        self.recording = False

    async def open(self, page: str, path: str, *, data: dict | None = None, expect: int | None = None):
        """GET (or POST `data` with the page's CSRF token) and record it; returns (status, body, location)."""
        expect = expect or (302 if data is not None else 200)
        if data is not None:
            data = {**data, "csrfmiddlewaretoken": self.csrf}
        started = time.perf_counter()
        method = self.session.post if data is not None else self.session.get
        async with method(self.base + path, data=data, allow_redirects=False) as response:
            body = await response.text()
            status, location = response.status, response.headers.get("Location", "")
        elapsed = time.perf_counter() - started
        ok = status == expect
        if self.recording:
            self.user.samples.append(Sample(page, elapsed, ok))
        if not ok and len(self.user.failures) < 5:
            self.user.failures.append(f"{page} {path}: {status} (expected {expect})")
        if found := CSRF.search(body):
            self.csrf = found.group(1)
        if self.recording and self.think:
            await asyncio.sleep(random.uniform(0, 2 * self.think))
        return status, body, location

    async def sign_in(self, password: str) -> None:
        await self.open("sign in", "/accounts/login/")
        status, _body, _location = await self.open(
            "sign in", "/accounts/login/", data={"login": self.user.username, "password": password}
        )
        if status != 302:
            raise RuntimeError(f"{self.user.username} could not sign in ({status}): {self.user.failures}")


def ids(pattern: str, body: str) -> list[int]:
    return sorted({int(n) for n in re.findall(pattern, body)})


async def tenant_round(browser: Browser) -> None:
    slug = browser.user.tenant
    await browser.open("tenant page", f"/t/{slug}/")
    await browser.open("pools list", f"/t/{slug}/pools/")
    await browser.open("requests list", f"/t/{slug}/requests/")
    form = f"/t/{slug}/p/train/request/"
    await browser.open("request form", form)
    await browser.open(
        "submit request",
        form,
        data={
            "spec_0": SPEC,
            "count_0": "1",
            "cluster": CLUSTER,
            "purpose": "",
            "justification": "Load test.",
        },
    )
    _status, body, _location = await browser.open("pools list (active)", f"/t/{slug}/pools/?state=active")
    active = ids(rf'href="/t/{re.escape(slug)}/pools/(\d+)/"', body)
    if active:
        pool = f"/t/{slug}/pools/{active[0]}/"
        await browser.open("pool page", pool)
        await browser.open("release pool", pool + "release/", data={})


async def approver_round(browser: Browser) -> None:
    _status, body, _location = await browser.open("approvals", "/approvals/")
    mine, of = browser.user.share
    waiting = [n for n in ids(r'href="/approvals/(\d+)/"', body) if n % of == mine]
    if waiting:
        await browser.open("approval page", f"/approvals/{waiting[0]}/")
        await browser.open("approve", f"/approvals/{waiting[0]}/approve/", data={"priority": ""})


async def operator_round(browser: Browser) -> None:
    _status, body, _location = await browser.open("capacity", "/capacity/")
    groups = re.findall(r'href="(/capacity/clusters/\d+/groups/[^/"]+/)"', body)
    if groups:
        await browser.open("capacity group", random.choice(groups))


ROUNDS = {"tenant": tenant_round, "approver": approver_round, "operator": operator_round}


def cast(users: int) -> list[User]:
    """Who the `users` are: a tenth approvers, a tenth operators (at least one of each), the rest tenant
    members, each of their own tenant."""
    staff = max(1, users // 10)
    approvers = [User("carol", "approver", share=(k, staff)) for k in range(staff)]
    operators = [User("erin", "operator") for _ in range(staff)]
    members = [User(f"load{n}", "tenant", tenant=f"load-{n}") for n in range(max(0, users - 2 * staff))]
    return approvers + operators + members


async def simulate(base: str, people: list[User], *, seconds: float, think: float) -> float:
    """Sign everyone in, then let them work for `seconds`; returns the seconds actually measured."""
    import aiohttp

    timeout = aiohttp.ClientTimeout(total=60)
    sessions = [
        aiohttp.ClientSession(
            cookie_jar=aiohttp.CookieJar(unsafe=True),  # cookies of 127.0.0.1 too
            timeout=timeout,
            headers={"X-Forwarded-For": f"10.0.{n // 250}.{n % 250 + 1}"},
        )
        for n in range(len(people))
    ]
    try:
        browsers = [Browser(s, base, user, think) for s, user in zip(sessions, people, strict=True)]
        passwords = {"carol": "demo-password", "erin": "demo-password"}
        await asyncio.gather(*(b.sign_in(passwords.get(b.user.username, PASSWORD)) for b in browsers))
        # One unrecorded round each first: every gunicorn worker loads its code and templates once.
        await asyncio.gather(*(ROUNDS[b.user.role](b) for b in browsers))
        for browser in browsers:
            browser.user.failures.clear()
            browser.recording = True
        deadline = time.monotonic() + seconds
        started = time.monotonic()

        async def work(browser: Browser) -> None:
            await asyncio.sleep(random.uniform(0, think))  # not all at once
            while time.monotonic() < deadline:
                await ROUNDS[browser.user.role](browser)

        tasks = [asyncio.create_task(work(b)) for b in browsers]
        await asyncio.wait(tasks, timeout=seconds + 60)
        for task in tasks:
            task.cancel()
        return time.monotonic() - started
    finally:
        await asyncio.gather(*(s.close() for s in sessions))


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
    sys.path.insert(0, str(ROOT))
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
