#!/usr/bin/env python
"""Benchmark: GPU samples of a fleet (1,000 GPUs unless told) through the agents' API, next to a plain COPY of
the same rows; one whole round of the fleet's readings through a real web server; the roll-up; then the
30-day chart of one GPU and of the whole fleet.

Builds one cluster of `--gpus` / 8 nodes × 8 H100 GPUs (every other node cut into two 3g.40gb instances per
GPU) and an agent token per node. Then, for each of `--rounds` instants 15 s apart, every node posts its
reading as a node agent does (`POST /api/v1/monitoring/samples/`, one request per node, through the whole
stack: the WSGI application as gunicorn calls it, middleware, token, checks, the batch left for the writer,
in this process), and the writer stores them (monitoring.ingest.accepted.store, in this process too); the
samples stored per second, the posts' and the writer's time together, are printed. The same rows are then
written with a plain `COPY monitoring_sample FROM STDIN` (binary, its faster format: the floor any ingest
could reach) into the emptied table, and once more as one COPY per request, each in its own transaction
(the floor of any ingest that stores each request as it comes); the rates and their ratios are printed
(and that of the last without waiting for the disk's flush at each commit, which is most of what a
transaction per request costs on a slow disk). Then each node posts its reading once more to the endpoint
with its view made to answer 202 at once, reading and leaving nothing: the time of the site's guards and
Django's handling alone, which any ingest served behind them pays before it reads a batch, is printed a
request and beside the COPY of one round's rows. Then each node posts `--buffer` readings in one request, as
an agent flushing its buffer does, and that rate and its ratio to COPY are printed too.

The round: gunicorn serves the portal as the README's run command does (`deploy/gunicorn.conf.py`, 3 workers
unless WEB_CONCURRENCY says otherwise, DEBUG=false) on this test database, beside a Celery worker on
the monitoring queue (the writer, as ./scripts/run starts it), and every node posts its newest reading at
once, `--concurrency` requests in flight, from a client in this process (on the same cores, so it takes some
of their time); `--web-rounds` rounds (8 unless told), each once the last is stored. For the first (the web's
processes hold no copy of any agent's token or host yet: monitoring.ingest.copies) and the last (each
worker holds copies of the agents it served, as after a few minutes of agents posting), the time from the
first post until the writer has stored the whole round (and until every post was answered) is printed
next to the agents' interval of 15 s, with the CPU time the web's processes, the writer, the database
server (every process of it, those that ended in the round too, but this one's own backend) and the
client spent on it; then the largest resident memory of a web worker after the rounds.

The roll-up: `--rollup-minutes` of samples of every GPU and instance, 15 s apart, are written straight into
the table, and the 5-minute roll-up of them is timed; then the hourly roll-up of an hour of 5-minute
roll-ups. Their time per minute of samples is printed (a worker keeps up while it is well under 60 s).

Last (by default only for fleets of at most 1,000 GPUs: `--charts` / `--no-charts`), 30 days of 1-hour
roll-ups and `--five-minute-days` of 5-minute ones for every GPU are generated, and
`monitoring.storage.samples.series` is timed for one GPU's and for the whole fleet's 30-day SM activity (the
queries the charts run), as the median of `--repeat` runs.

Run from the repository root, with the test environment (PostgreSQL per DATABASE_URL, Redis per
REDIS_URL / CACHE_URL; a throwaway test database is created and dropped):
    .venv/bin/python bench/ingest.py [--gpus 1000] [--rounds 8] [--buffer 4] [--concurrency 64]
        [--web-rounds 8] [--rollup-minutes 5] [--repeat 5] [--five-minute-days 7] [--charts | --no-charts]
100,000 GPUs (12,500 nodes), with fewer rounds through the test client:
    .venv/bin/python bench/ingest.py --gpus 100000 --rounds 2
Prints one figure per line.
"""

from __future__ import annotations

import argparse
import io
import json
import os
import secrets
import selectors
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from unittest import mock

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "portal.settings")
os.environ.setdefault("DEBUG", "true")

import django  # noqa: E402

django.setup()

from django.conf import settings  # noqa: E402
from django.core.handlers.wsgi import WSGIHandler  # noqa: E402
from django.db import connection, transaction  # noqa: E402
from django.http import HttpResponse  # noqa: E402
from django.test.utils import setup_databases, teardown_databases  # noqa: E402

from monitoring.collectors import GpuReading, InstanceReading, Reading  # noqa: E402
from monitoring.collectors.wire import batch_to_json  # noqa: E402
from monitoring.ingest import accepted  # noqa: E402
from monitoring.ingest.api import SamplesView  # noqa: E402
from monitoring.models import AgentToken  # noqa: E402
from monitoring.storage import samples  # noqa: E402
from pools import mig  # noqa: E402
from pools.models import Cluster, GpuCapacity, NodeCapacity  # noqa: E402
from portal.tokens import PREFIX_LENGTH, digest  # noqa: E402

GPUS_PER_NODE = 8
MODEL = "H100-80GB"
MEMORY = 80 << 30
INTERVAL = 15  # seconds between an agent's readings
URL = "/api/v1/monitoring/samples/"


def build(gpus: int) -> tuple[Cluster, list[tuple[str, list[GpuCapacity]]], list[str]]:
    """The cluster, its nodes' names with their GPUs, and an agent key per node."""
    cluster = Cluster.objects.create(name="bench", driver=Cluster.Driver.SIMULATED)
    count = max(1, gpus // GPUS_PER_NODE)
    nodes = NodeCapacity.objects.bulk_create(
        [
            NodeCapacity(cluster=cluster, name=f"node-{n:05d}", gpu_model=MODEL, gpu_count=GPUS_PER_NODE)
            for n in range(count)
        ],
        batch_size=2000,
    )
    cut = sorted(mig.place_profiles(mig.gpu_model(MODEL), {"3g.40gb": 2}))
    fleet = []
    for n, node in enumerate(nodes):
        node_gpus = []
        for index in range(GPUS_PER_NODE):
            layout = (
                [{"profile": i.profile, "start": i.start, "uuid": f"MIG-{uuid.uuid4()}"} for i in cut]
                if n % 2
                else []
            )
            node_gpus.append(
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
        fleet.append((node.name, node_gpus))
    GpuCapacity.objects.bulk_create([gpu for _name, node_gpus in fleet for gpu in node_gpus], batch_size=5000)
    keys = [secrets.token_urlsafe(32) for _ in nodes]
    AgentToken.objects.bulk_create(
        [
            AgentToken(cluster=cluster, name=node.name, prefix=key[:PREFIX_LENGTH], digest=digest(key))
            for node, key in zip(nodes, keys, strict=True)
        ],
        batch_size=2000,
    )
    with connection.cursor() as cursor:  # as autovacuum would have, long before a fleet this size reports
        cursor.execute("ANALYZE")
    return cluster, fleet, keys


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


# The round's bodies are made ahead with this instant in place of the reading's, which is written in as each
# request goes, so that every reading is as fresh as an agent's (it reads, then posts) however long the round
# takes. Its text is as long as any instant's with microseconds, so that a body's length stays.
AHEAD = datetime(2000, 1, 1, 0, 0, 0, 1, tzinfo=UTC)
_AHEAD = AHEAD.isoformat().encode()


def fresh(body: bytes) -> bytes:
    """`body` with the instant of its reading (one reading a body) made now."""
    return body.replace(_AHEAD, datetime.now(UTC).isoformat(timespec="microseconds").encode())


def post_in_process(handler: WSGIHandler, key: str, body: bytes) -> tuple[int, bytes]:
    """One POST of `body` through the portal's WSGI application in this process, as gunicorn hands it one:
    every middleware and the view, no HTTP server, no test client."""
    environ = {
        "REQUEST_METHOD": "POST",
        "PATH_INFO": URL,
        "SCRIPT_NAME": "",
        "QUERY_STRING": "",
        "SERVER_NAME": "testserver",
        "SERVER_PORT": "80",
        "SERVER_PROTOCOL": "HTTP/1.1",
        "REMOTE_ADDR": "127.0.0.1",
        "HTTP_HOST": "testserver",
        "HTTP_AUTHORIZATION": f"Bearer {key}",
        "HTTP_ACCEPT": "application/json",
        "CONTENT_TYPE": "application/json",
        "CONTENT_LENGTH": str(len(body)),
        "wsgi.input": io.BytesIO(body),
        "wsgi.errors": sys.stderr,
        "wsgi.url_scheme": "http",
        "wsgi.version": (1, 0),
        "wsgi.multithread": False,
        "wsgi.multiprocess": True,
        "wsgi.run_once": False,
    }
    status: list[str] = []
    answer = handler(environ, lambda line, _headers, _exc=None: status.append(line))
    try:
        return int(status[0].split()[0]), b"".join(answer)
    finally:
        answer.close()


def through_api(
    fleet, keys, last: dict[str, datetime], *, rounds: int, per_request: int
) -> tuple[int, int, float]:
    """Every node posts `rounds` × `per_request` readings, `per_request` in each request (1, an agent keeping
    up; more, an agent flushing the buffer of readings it took since its last post), each reading 15 s after
    the node's last one (in `last`, kept up to date: start it far enough in the past that the last reading
    is not ahead of now, as no agent's is). After each round, the writer stores what was accepted
    (monitoring.ingest.accepted.store, in this process). Returns samples stored, requests, and the seconds
    the posts and the writer took (each body is made just before its post, untimed)."""
    handler = WSGIHandler()
    stored = requests = 0
    seconds = 0.0
    for round_ in range(rounds):
        for key, (host, gpus) in zip(keys, fleet, strict=True):
            instants = [last[host] + timedelta(seconds=INTERVAL * n) for n in range(1, per_request + 1)]
            last[host] = instants[-1]
            body = json.dumps(batch_to_json([reading(host, gpus, at, round_) for at in instants])).encode()
            started = time.perf_counter()
            code, answer = post_in_process(handler, key, body)
            seconds += time.perf_counter() - started
            if code != 202:
                raise SystemExit(f"the portal answered {code}: {answer[:300]!r}")
            requests += 1
        started = time.perf_counter()
        written = accepted.store()
        seconds += time.perf_counter() - started
        if written.dropped or written.passed_over:
            raise SystemExit(f"the writer did not store everything: {written.summary()}")
        stored += written.samples
    return stored, requests, seconds


def newest_body(host: str, gpus: list[GpuCapacity]) -> bytes:
    """A node's newest reading as its agent posts it, at the instant `fresh` writes in as it goes."""
    return json.dumps(batch_to_json([reading(host, gpus, AHEAD, 1)])).encode()


def _answer_at_once(_view, _request, *_args, **_kwargs) -> HttpResponse:
    return HttpResponse(b'{"samples": 0}', status=202, content_type="application/json")


def guards_alone(fleet, keys) -> tuple[int, float]:
    """Every node posts its reading once, as through_api posts it, to the agents' endpoint with its view
    made to answer 202 at once (it reads nothing and leaves nothing): the time of the site's guards and
    Django's handling of the requests alone, which any ingest served behind them pays before it reads a
    batch. Returns the requests and their seconds."""
    handler = WSGIHandler()
    bodies = [newest_body(host, gpus) for host, gpus in fleet]
    seconds = 0.0
    with mock.patch.object(SamplesView, "dispatch", _answer_at_once):
        for key, body in zip(keys, bodies, strict=True):
            raw = fresh(body)
            started = time.perf_counter()
            code, answer = post_in_process(handler, key, raw)
            seconds += time.perf_counter() - started
            if code != 202:
                raise SystemExit(f"the guards answered {code}: {answer[:300]!r}")
    return len(bodies), seconds


def stored_rows() -> list[tuple]:
    with connection.cursor() as cursor:
        cursor.execute(f"SELECT {', '.join(samples.COLUMNS)} FROM monitoring_sample")
        return cursor.fetchall()


def copy_rows(cursor, rows: list[tuple]) -> None:
    """A plain COPY of `rows`, in the binary format, the faster of the two for these columns (the portal's
    writer uses it too)."""
    with cursor.copy(
        f"COPY monitoring_sample ({', '.join(samples.COLUMNS)}) FROM STDIN (FORMAT BINARY)"
    ) as copy:
        copy.set_types(samples.TYPES)
        for row in rows:
            copy.write_row(row)


def by_copy(rows: list[tuple]) -> float:
    """One COPY of all the rows into the emptied table."""
    with connection.cursor() as cursor:
        cursor.execute("TRUNCATE monitoring_sample")
        started = time.perf_counter()
        copy_rows(cursor, rows)
        return time.perf_counter() - started


def by_copy_per_request(rows: list[tuple], nodes: dict[int, int], *, wait_for_disk: bool = True) -> float:
    """The rows of each request (one node's reading at one instant) by a COPY of their own, in a transaction
    of their own, into the emptied table; without `wait_for_disk`, each commit returns before its WAL is on
    disk (synchronous_commit off), which shows what the disk's flush costs each request."""
    batches: dict[tuple, list[tuple]] = {}
    for row in rows:
        batches.setdefault((nodes[row[0]], row[2]), []).append(row)
    with connection.cursor() as cursor:
        cursor.execute("TRUNCATE monitoring_sample")
    started = time.perf_counter()
    for batch in batches.values():
        with transaction.atomic(), connection.cursor() as cursor:
            if not wait_for_disk:
                cursor.execute("SET LOCAL synchronous_commit TO OFF")
            copy_rows(cursor, batch)
    return time.perf_counter() - started


# --- the round through a web server ------------------------------------------------------------------


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def served_environment() -> dict[str, str]:
    """The environment of the web's and the writer's processes: this (test) database, DEBUG=false."""
    db = settings.DATABASES["default"]
    server = f"{db['HOST'] or '127.0.0.1'}:{db['PORT'] or 5432}"
    env = {
        **os.environ,
        "DATABASE_URL": f"postgres://{db['USER']}:{db['PASSWORD'] or ''}@{server}/{db['NAME']}",
        "DEBUG": "false",
        "SECURE_SSL_REDIRECT": "false",
        "ALLOWED_HOSTS": "127.0.0.1,localhost",
        "SECRET_KEY": os.environ.get("SECRET_KEY") or secrets.token_urlsafe(50),
    }
    return env


def start_writer(log) -> subprocess.Popen:
    """A Celery worker on the monitoring queue, as ./scripts/run starts it: the writer of accepted batches."""
    queue = os.environ.get("MONITORING_QUEUE", "monitoring")
    command = [sys.executable, "-m", "celery", "-A", "portal", "worker", "--concurrency", "1"]
    command += ["--queues", queue, "--loglevel", "WARNING", "--without-heartbeat", "--without-mingle"]
    return subprocess.Popen(command, cwd=ROOT, env=served_environment(), stdout=log, stderr=subprocess.STDOUT)


def wait_until_idle(timeout: float) -> None:
    """Until nothing waits and the writer has stopped (it lingers MONITORING_STORE_LINGER_SECONDS)."""
    deadline = time.monotonic() + timeout
    while not accepted.idle():
        if time.monotonic() > deadline:
            raise SystemExit(f"the writer left {accepted.waiting()} batches after {timeout:.0f} s")
        time.sleep(0.01)


def wait_until_stored(rows: int, since: datetime, timeout: float) -> None:
    """Until the newest figures of `rows` GPUs and instances are of `since` or later: once nothing waits,
    the writer's last round is being stored (the count, a pass over the newest figures, is asked only then,
    so that it takes little of the round's time)."""
    deadline = time.monotonic() + timeout
    while True:
        if time.monotonic() > deadline:
            raise SystemExit(f"the writer left {accepted.waiting()} batches after {timeout:.0f} s")
        if not accepted.waiting():
            with connection.cursor() as cursor:
                cursor.execute("SELECT count(*) FROM monitoring_latest WHERE at >= %s", [since])
                if cursor.fetchone()[0] >= rows:
                    return
        time.sleep(0.01)


def start_web(port: int, log) -> subprocess.Popen:
    """gunicorn as the README runs it, on this (test) database."""
    command = [sys.executable, "-m", "gunicorn", "--config", "deploy/gunicorn.conf.py", "portal.wsgi"]
    web = subprocess.Popen(
        command,
        cwd=ROOT,
        env={**served_environment(), "PORT": str(port)},
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if web.poll() is not None:
            raise SystemExit(f"gunicorn stopped with {web.returncode}: see {log.name}")
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=1) as probe:
                probe.sendall(b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n")
                if probe.recv(64).startswith(b"HTTP/1.1 200"):
                    return web
        except OSError:
            time.sleep(0.2)
    web.terminate()
    raise SystemExit(f"gunicorn did not answer within a minute: see {log.name}")


def request(key: str, body: bytes) -> bytes:
    head = (
        f"POST {URL} HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer {key}\r\n"
        f"Content-Type: application/json\r\nAccept: application/json\r\n"
        f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n"
    )
    return head.encode() + body


def post_all(port: int, requests: list[bytes], concurrency: int) -> list[tuple[int, bytes]]:
    """Each request on a connection of its own (gunicorn's sync workers close it after the answer), its
    reading made fresh as it goes, `concurrency` of them in flight; a plain selector loop, so that the client
    takes little of the cores."""
    selector = selectors.DefaultSelector()
    answers: list[tuple[int, bytes]] = [(0, b"")] * len(requests)
    waiting = list(enumerate(requests))[::-1]

    def start() -> None:
        number, raw = waiting.pop()
        sock = socket.socket()
        sock.setblocking(False)
        sock.connect_ex(("127.0.0.1", port))
        selector.register(sock, selectors.EVENT_WRITE, [number, memoryview(fresh(raw)), bytearray()])

    for _ in range(min(concurrency, len(waiting))):
        start()
    while selector.get_map():
        for key, _events in selector.select():
            sock, state = key.fileobj, key.data
            if state[1]:
                state[1] = state[1][sock.send(state[1]) :]
                if not state[1]:
                    selector.modify(sock, selectors.EVENT_READ, state)
                continue
            chunk = sock.recv(65536)
            if chunk:
                state[2] += chunk
                continue
            selector.unregister(sock)
            sock.close()
            head, _, body = bytes(state[2]).partition(b"\r\n\r\n")
            answers[state[0]] = (int(head.split(b" ", 2)[1]), body)
            if waiting:
                start()
    selector.close()
    return answers


@dataclass
class Round:
    samples: int
    requests: int
    seconds: float
    client_cpu: float  # this process, posting
    web_cpu: float | None  # gunicorn's processes (None where /proc cannot tell)
    writer_cpu: float | None  # the Celery worker's processes that store what the web accepted
    database_cpu: float | None  # the PostgreSQL server's, but for this process's own backend
    answered: float = 0.0  # seconds until every post was answered


def _stat(pid: int) -> list[str] | None:
    """The fields of /proc/<pid>/stat after the command's name (Linux), or None when it is gone."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return None


def tree_cpu(master: int) -> float | None:
    """User and system CPU seconds of `master` and its children, those it has reaped included: its change
    over a round counts every process of the group that served it, however short-lived (a Celery task's
    database connection, say). None where /proc cannot tell."""
    fields = _stat(master)
    if fields is None:
        return None
    ticks = sum(int(value) for value in fields[11:15])  # its own and its reaped children's
    children = Path(f"/proc/{master}/task/{master}/children")
    for child in children.read_text().split() if children.exists() else ():
        if (child_fields := _stat(int(child))) is not None:
            ticks += int(child_fields[11]) + int(child_fields[12])
    return ticks / os.sysconf("SC_CLK_TCK")


def own_backend() -> tuple[int, int | None]:
    """This process's database backend and the PostgreSQL server's process that started it (its parent)."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_backend_pid()")
        (pid,) = cursor.fetchone()
    fields = _stat(pid)
    return pid, int(fields[1]) if fields else None


def used(before: float | None, after: float | None) -> float | None:
    return None if before is None or after is None else after - before


def process_tree(master: int) -> list[int]:
    children = Path(f"/proc/{master}/task/{master}/children")
    return [master, *(int(pid) for pid in children.read_text().split())] if children.exists() else []


def rss_mib(pid: int) -> float | None:
    """The resident memory of process `pid` (Linux's /proc), in MiB."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return None
    kib = next((int(line.split()[1]) for line in status.splitlines() if line.startswith("VmRSS:")), None)
    return None if kib is None else kib / 1024


def one_round(port: int, bodies: list[bytes], concurrency: int, groups: tuple[int, int, int]) -> Round:
    """Every node posts its newest reading at once; the round ends once the writer has stored all of it.
    `groups`: the web's, the writer's and the database server's first process."""
    connection.close()  # this process's backend is opened again to see the round stored, and left out
    before = [tree_cpu(master) for master in groups]
    since = datetime.now(UTC)  # each reading is made as its request goes
    cpu, started = time.process_time(), time.perf_counter()
    answers = post_all(port, bodies, concurrency)
    answered = time.perf_counter() - started
    failed = [(code, body[:200]) for code, body in answers if code != 202]
    if failed:
        raise SystemExit(f"{len(failed)} requests failed, e.g. {failed[0]}")
    taken = sum(json.loads(body)["samples"] for _code, body in answers)
    wait_until_stored(taken, since, 600)
    seconds, cpu = time.perf_counter() - started, time.process_time() - cpu
    after = [tree_cpu(master) for master in groups]
    web_cpu, writer_cpu, database_cpu = (used(b, a) for b, a in zip(before, after, strict=True))
    if database_cpu is not None:
        database_cpu -= tree_cpu(own_backend()[0]) or 0.0  # the counting of what was stored
    return Round(
        samples=taken,
        requests=len(bodies),
        seconds=seconds,
        client_cpu=cpu,
        web_cpu=web_cpu,
        writer_cpu=writer_cpu,
        database_cpu=database_cpu,
        answered=answered,
    )


def rounds_through_web(fleet, keys, concurrency: int, rounds: int) -> tuple[list[Round], list[float]]:
    """Warms each worker and the writer up, then posts `rounds` rounds of every node's newest reading, each
    once the last is stored. Also each web worker's resident memory after the last."""
    connection.close()  # the web's workers take the database from here
    with tempfile.NamedTemporaryFile("w", prefix="bench-ingest-web-", suffix=".log", delete=False) as log:
        port = free_port()
        web = start_web(port, log)
        writer = start_writer(log)
        try:
            bodies = [
                request(key, newest_body(host, gpus)) for (host, gpus), key in zip(fleet, keys, strict=True)
            ]
            post_all(port, bodies[:12], concurrency)  # each worker's first requests, before the round
            wait_until_idle(120)  # the writer is up
            groups = web.pid, writer.pid, own_backend()[1] or 0
            done = [one_round(port, bodies, concurrency, groups) for _ in range(rounds)]
            memory = [mib for pid in process_tree(web.pid)[1:] if (mib := rss_mib(pid)) is not None]
        except SystemExit as failure:
            raise SystemExit(f"{failure}; see {log.name}") from None
        finally:
            for process in (web, writer):
                process.terminate()
                process.wait(timeout=60)
    os.unlink(log.name)
    return done, memory


def print_round(name: str, web: Round) -> None:
    print(
        f"{name} through gunicorn ({os.environ.get('WEB_CONCURRENCY', '3')} workers, DEBUG=false): "
        f"{web.requests} requests, {web.samples} samples stored in {web.seconds:.2f} s, every post answered "
        f"in {web.answered:.2f} s ({web.requests / web.seconds:,.0f} requests/s; the agents' interval is "
        f"{INTERVAL} s)"
    )
    if None not in (web.web_cpu, web.writer_cpu, web.database_cpu):
        portal = web.web_cpu + web.writer_cpu + web.database_cpu
        cores = os.cpu_count()
        print(
            f"{name} CPU: web {web.web_cpu:.2f} s, writer {web.writer_cpu:.2f} s, PostgreSQL "
            f"{web.database_cpu:.2f} s, the client {web.client_cpu:.2f} s; the portal's "
            f"{portal:.2f} s take at least {portal / cores:.2f} s on this machine's {cores} cores with "
            "nothing else on them"
        )
    else:
        print(f"{name}: the client took {web.client_cpu:.2f} s of CPU on the same cores")


# --- the roll-up ---------------------------------------------------------------------------------------


def fill_minutes(start: datetime, minutes: int) -> int:
    """Samples of every GPU and instance of the fleet, every 15 s for `minutes` from `start`."""
    samples.ensure_partitions({start.date(), (start + timedelta(minutes=minutes)).date()})
    figures = "300 + g.index, 55 + g.index, 70.0, 60.0, 40000000000, 80000000000, 0, 0"
    with connection.cursor() as cursor:
        cursor.execute(
            f"INSERT INTO monitoring_sample ({', '.join(samples.COLUMNS)}) "
            f"SELECT g.id, s.slot, %s + n * interval '{INTERVAL} seconds', {figures} "
            "FROM pools_gpucapacity g, LATERAL (SELECT -1 AS slot UNION ALL "
            "SELECT (e->>'start')::smallint FROM jsonb_array_elements(g.layout) e) s, "
            "generate_series(0, %s - 1) n",
            [start, minutes * 60 // INTERVAL],
        )
        written = cursor.rowcount
        cursor.execute("ANALYZE monitoring_sample")
    return written


def fill_hour_of_rollups(start: datetime) -> int:
    """The 5-minute roll-ups of an hour of every GPU and instance (the hourly roll-up's input)."""
    metrics = ", ".join(f"{m}_min, {m}_avg, {m}_max" for m in samples.METRICS)
    figures = ", ".join("40, 50, 60" for _m in samples.METRICS)
    with connection.cursor() as cursor:
        cursor.execute(
            f"INSERT INTO monitoring_rollup (gpu_id, slot, seconds, bucket, samples, {metrics}, "
            "memory_total_bytes) "
            f"SELECT g.id, s.slot, 300, %s + n * interval '300 seconds', 20, {figures}, {MEMORY} "
            "FROM pools_gpucapacity g, LATERAL (SELECT -1 AS slot UNION ALL "
            "SELECT (e->>'start')::smallint FROM jsonb_array_elements(g.layout) e) s, "
            "generate_series(0, 11) n",
            [start],
        )
        written = cursor.rowcount
        cursor.execute("ANALYZE monitoring_rollup")
    return written


@dataclass
class RollUps:
    rows: int  # samples rolled up
    five: float  # seconds of their 5-minute roll-up
    rollups: int  # 5-minute roll-ups of an hour
    hour: float  # seconds of their hourly roll-up
    late_store: float  # seconds to store one late sample (its repair included)
    late_run: float  # seconds of the next run after it


def roll_up_times(minutes: int) -> RollUps:
    """Times the 5-minute roll-up of `minutes` of samples, one late sample of one GPU and the run after it,
    and an hourly roll-up."""
    with connection.cursor() as cursor:
        cursor.execute("TRUNCATE monitoring_sample, monitoring_rollup, monitoring_rollupmark")
        cursor.execute("SELECT min(id) FROM pools_gpucapacity")
        (gpu,) = cursor.fetchone()
    hour = datetime.now(UTC).replace(minute=0, second=0, microsecond=0) - timedelta(hours=3)
    run_at = hour + timedelta(minutes=minutes, seconds=60)
    rows = fill_minutes(hour, minutes)
    started = time.perf_counter()
    samples.roll_up(now=run_at)
    five = time.perf_counter() - started
    started = time.perf_counter()  # an agent's buffer brings a sample its bucket was rolled up without
    samples.store([samples.Row(gpu, -1, hour + timedelta(seconds=67), power_w=1.0)])
    late_store = time.perf_counter() - started
    started = time.perf_counter()
    samples.roll_up(now=run_at)
    late_run = time.perf_counter() - started
    with connection.cursor() as cursor:
        cursor.execute("TRUNCATE monitoring_sample, monitoring_rollup, monitoring_rollupmark")
    rollups = fill_hour_of_rollups(hour)
    with connection.cursor() as cursor:  # the 5-minute ones are done: only the hour is left to roll up
        cursor.execute(
            "INSERT INTO monitoring_rollupmark (seconds, done_until) VALUES (300, %s)",
            [hour + timedelta(hours=1)],
        )
    started = time.perf_counter()
    samples.roll_up(now=hour + timedelta(hours=1, seconds=60))
    return RollUps(rows, five, rollups, time.perf_counter() - started, late_store, late_run)


# --- the charts ----------------------------------------------------------------------------------------


def history(now: datetime, five_minute_days: int) -> int:
    """Roll-ups for every GPU: 30 days of hours, and the last `five_minute_days` of 5-minute buckets."""
    metrics = ", ".join(f"{m}_min, {m}_avg, {m}_max" for m in samples.METRICS)
    figures = ", ".join(
        "v, v, v" if m != "memory_used_bytes" else "(v * 1e8)::bigint, (v * 1e8)::bigint, (v * 1e8)::bigint"
        for m in samples.METRICS
    )
    total = 0
    with connection.cursor() as cursor:
        cursor.execute("TRUNCATE monitoring_rollup")
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
    parser.add_argument("--gpus", type=int, default=1000, help="GPUs of the fleet, 8 a node (default 1000)")
    parser.add_argument("--rounds", type=int, default=8, help="readings per node, one a request (15 s apart)")
    parser.add_argument("--buffer", type=int, default=4, help="readings per request of a flushed buffer")
    parser.add_argument("--concurrency", type=int, default=64, help="requests in flight in the round")
    parser.add_argument(
        "--web-rounds", type=int, default=8, help="rounds through gunicorn, each once the last is stored"
    )
    parser.add_argument("--rollup-minutes", type=int, default=5, help="minutes of samples rolled up")
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--five-minute-days", type=int, default=7)
    parser.add_argument("--charts", action=argparse.BooleanOptionalAction, default=None)
    args = parser.parse_args()
    charts = args.charts if args.charts is not None else args.gpus <= 1000
    settings.DEBUG = False  # no query log
    settings.ALLOWED_HOSTS = ["testserver"]
    old = setup_databases(verbosity=0, interactive=False)
    try:
        _cluster, fleet, keys = build(args.gpus)
        nodes = {gpu.pk: n for n, (_host, gpus) in enumerate(fleet) for gpu in gpus}
        samples.prepare_partitions()
        # The readings' instants, 15 s apart, end now: a reading ahead of now would make the web's rounds
        # below, which post readings of now, look like resends of what is stored already.
        began = datetime.now(UTC) - timedelta(seconds=INTERVAL * (args.rounds + args.buffer))
        last = {host: began for host, _gpus in fleet}
        stored, requests, api_seconds = through_api(fleet, keys, last, rounds=args.rounds, per_request=1)
        rows = stored_rows()
        copy_seconds = min(by_copy(rows) for _ in range(3))
        per_request_seconds = by_copy_per_request(rows, nodes)
        unflushed_seconds = by_copy_per_request(rows, nodes, wait_for_disk=False)
        with connection.cursor() as cursor:
            cursor.execute("TRUNCATE monitoring_sample")
        flushed, _requests, flush_seconds = through_api(fleet, keys, last, rounds=1, per_request=args.buffer)
        gpus = sum(len(g) for _h, g in fleet)
        copy_rate = len(rows) / copy_seconds
        print(f"fleet: {gpus} GPUs on {len(fleet)} nodes, {stored // args.rounds} samples per round")
        print(f"api: {stored} samples in {requests} requests, {api_seconds:.2f} s")
        print(f"api samples/s: {stored / api_seconds:,.0f}")
        print(f"copy samples/s: {copy_rate:,.0f}")
        print(f"copy / api: {api_seconds / copy_seconds:.1f}x")
        print(f"copy per request, a transaction each: {len(rows) / per_request_seconds:,.0f} samples/s")
        print(f"copy per request / api: {api_seconds / per_request_seconds:.1f}x")
        guarded, guard_seconds = guards_alone(fleet, keys)
        round_copy = copy_seconds / args.rounds  # one request of each node, as the guards' run posts
        print(
            f"the site's guards alone, around a view that answers at once: "
            f"{guard_seconds / guarded * 1e6:,.0f} us a request"
        )
        print(f"the guards alone / copy: {guard_seconds / round_copy:.1f}x")
        unflushed_rate = len(rows) / unflushed_seconds
        print(f"copy per request, not waiting for the disk's flush: {unflushed_rate:,.0f} samples/s")
        print(f"api requests/s: {requests / api_seconds:,.0f}")
        flush_rate = flushed / flush_seconds
        print(f"api, a buffer of {args.buffer} readings per request: {flush_rate:,.0f} samples/s")
        print(f"copy / api with buffers: {copy_rate / flush_rate:.1f}x")

        done, memory = rounds_through_web(fleet, keys, args.concurrency, args.web_rounds)
        print_round("first round after the web starts", done[0])
        if len(done) > 1:
            print_round(f"round {len(done)} in a row", done[-1])
        if memory:
            print(f"web workers' memory after the rounds: {max(memory):.0f} MiB at most")

        rolled = roll_up_times(args.rollup_minutes)
        print(f"roll-up of {args.rollup_minutes} min of samples ({rolled.rows:,} rows): {rolled.five:.2f} s")
        print(f"roll-up of an hour of 5-minute roll-ups ({rolled.rollups:,} rows): {rolled.hour:.2f} s")
        print(f"roll-up per minute of samples: {rolled.five / args.rollup_minutes + rolled.hour / 60:.2f} s")
        print(
            f"a late sample of one GPU: stored in {rolled.late_store * 1000:.1f} ms, "
            f"the next roll-up {rolled.late_run:.2f} s"
        )

        if charts:
            now = datetime.now(UTC).replace(microsecond=0)
            written = history(now, args.five_minute_days)
            one = fleet[0][1][0].pk
            month = {"metric": "sm_active_pct", "start": now - timedelta(days=30), "end": now, "now": now}
            resolution, points = samples.series(**month, gpu_ids=[one])
            print(
                f"roll-up rows: {written:,}; the 30-day chart reads {resolution} s buckets, "
                f"{len(points)} points"
            )
            single = median_time(lambda: samples.series(**month, gpu_ids=[one]), args.repeat)
            fleet_wide = median_time(lambda: samples.series(**month), args.repeat)
            print(f"30-day chart, one GPU: {single * 1000:.1f} ms")
            print(f"30-day chart, whole fleet: {fleet_wide * 1000:.1f} ms")
    finally:
        connection.close()
        teardown_databases(old, verbosity=0)
    return 0


if __name__ == "__main__":
    sys.exit(main())
