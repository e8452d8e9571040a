"""The node agent against the portal served for real over HTTP (tests/monitoring/live_portal.py): a portal
restart loses no reading and stores none twice; a full buffer drops its oldest; 413 splits a batch,
readings out of the time bounds are dropped, other refusals keep the batch; back-off grows and resets;
`gpu_agent` needs no database, says in one line why it cannot run, and sends once more when stopped."""

import io
import json
import os
import signal
import subprocess
import sys
import threading
import time
from datetime import UTC, datetime, timedelta

import pytest
from django.core.management import call_command
from django.db import connection
from hypothesis import given
from hypothesis import strategies as st

from monitoring.collectors import GpuReading, InstanceReading, Reading
from monitoring.collectors.nvml import NO_NVML
from monitoring.collectors.wire import to_json
from monitoring.ingest import tokens as agents
from monitoring.ingest.agent import BACKOFF_CAP, JITTER, Agent, Portal, retry_delay
from monitoring.models import Sample
from tests.conftest import ROOT
from tests.factories import ClusterFactory, GpuCapacityFactory, NodeCapacityFactory
from tests.monitoring.live_portal import PortalServer

# --- back-off, as a pure function ------------------------------------------------------------------


def test_back_off_doubles_up_to_its_cap_and_is_nothing_after_a_success():
    schedule = [retry_delay(failures, rand=0.0) for failures in range(12)]
    assert schedule == [0, 2, 4, 8, 16, 32, 64, 128, 256, 300, 300, 300]
    assert retry_delay(0, rand=0.99) == 0  # reset: a success leaves no failure to wait for
    assert retry_delay(10_000, rand=0.0) == BACKOFF_CAP


@given(failures=st.integers(1, 200), rand=st.floats(0, 1, exclude_max=True))
def test_jitter_takes_at_most_its_share_of_the_step(failures, rand):
    step = retry_delay(failures, rand=0.0)
    delay = retry_delay(failures, rand=rand)
    assert (1 - JITTER) * step <= delay <= step <= BACKOFF_CAP
    assert retry_delay(failures + 1, rand=0.0) >= step


# --- the portal, for real --------------------------------------------------------------------------


@pytest.fixture
def portal(transactional_db, django_db_serialized_rollback, settings):
    settings.SECURE_SSL_REDIRECT = False
    server = PortalServer()
    server.start()
    yield server
    server.stop()
    with connection.cursor() as cursor:  # a partitioned table the test flush does not empty
        cursor.execute("DELETE FROM monitoring_sample")


@pytest.fixture
def node(transactional_db, django_db_serialized_rollback):
    node = NodeCapacityFactory(cluster=ClusterFactory(name="sim"), name="gpu-node-1", gpu_model="H100-80GB")
    GpuCapacityFactory(node=node, index=0)
    GpuCapacityFactory(node=node, index=1, mig={"3g.40gb": 2})
    return node


@pytest.fixture
def key(node):
    return agents.issue_agent_token(cluster=node.cluster, name=node.name).key


class ManualClock:
    """Monotonic seconds for the agent and the wall-clock time readings carry, moved by the test."""

    def __init__(self, start: datetime):
        self.start = start
        self.seconds = 0.0

    def monotonic(self) -> float:
        return self.seconds

    def now(self) -> datetime:
        return self.start + timedelta(seconds=self.seconds)

    def advance(self, seconds: float) -> None:
        self.seconds += seconds


class FakeCollector:
    """A node's reading each time it is asked (two GPUs, one cut into two MIG instances), at the clock's
    time; `taken` keeps the time of each reading as the agent sends it."""

    name = "fake"

    def __init__(self, node, clock=lambda: datetime.now(UTC)):
        full, cut = node.gpus.order_by("index")
        self.host = node.name
        self.gpus = (
            GpuReading(0, full.uuid, "NVIDIA H100 80GB HBM3", False, power_w=300.0, temperature_c=61.0),
            GpuReading(
                1,
                cut.uuid,
                "NVIDIA H100 80GB HBM3",
                True,
                power_w=200.0,
                instances=tuple(
                    InstanceReading(e["uuid"], n + 1, e["profile"], (e["start"], 4), 1 << 30, 40 << 30, 20.0)
                    for n, e in enumerate(cut.layout)
                ),
            ),
        )
        self.clock = clock
        self.taken: list[str] = []
        self.closed = False

    def readings(self):
        reading = Reading(self.host, self.clock(), self.gpus)
        self.taken.append(reading.at.isoformat())
        return (reading,)

    def close(self):
        self.closed = True


def make_agent(collector, url, key, clock, **options):
    return Agent(
        collector=collector,
        portal=Portal(url, key, timeout=5),
        interval=15,
        clock=clock.monotonic,
        rand=lambda: 0.0,
        **options,
    )


def stored_times() -> set[str]:
    return {at.isoformat() for at in Sample.objects.filter(slot=-1).values_list("at", flat=True).distinct()}


def test_a_portal_restart_loses_no_reading_and_stores_none_twice(portal, node, key):
    clock = ManualClock(datetime.now(UTC).replace(microsecond=0) - timedelta(minutes=10))
    collector = FakeCollector(node, clock.now)
    agent = make_agent(collector, portal.url, key, clock)
    agent.tick()
    assert agent.sent == 1 and not agent.buffer

    portal.stop()
    tries = []
    for _ in range(6):
        clock.advance(15)
        before = agent.failures
        agent.tick()
        tries.append(agent.failures - before)
    assert len(agent.buffer) == 6 and agent.sent == 1
    assert tries == [1, 1, 1, 1, 0, 1]  # waits of 2, 4, 8, 16 s: the fifth interval falls in a wait
    assert agent.next_try == clock.monotonic() + 32

    portal.start()
    clock.advance(15)
    agent.tick()
    assert len(agent.buffer) == 7  # still waiting out the back-off
    for _ in range(2):  # the 32 s wait ends within two more intervals
        clock.advance(15)
        agent.tick()

    assert agent.failures == 0 and agent.next_try == 0
    assert agent.sent == len(collector.taken) == 10  # one before, six while away, three after
    assert stored_times() == {
        datetime.fromisoformat(at).astimezone(UTC).isoformat() for at in collector.taken
    }
    assert Sample.objects.count() == 10 * 4  # two GPUs and two instances each time
    assert set(portal.stored_once().values()) == {1} and len(portal.stored_once()) == 10


def test_a_full_buffer_drops_the_oldest_and_counts_them(node, caplog):
    clock = ManualClock(datetime.now(UTC))
    collector = FakeCollector(node, clock.now)
    agent = make_agent(collector, "http://127.0.0.1:9", "no-portal-here", clock, buffer_size=3)
    for _ in range(5):
        agent.tick()
        clock.advance(15)

    assert [r.at.isoformat() for r in agent.buffer] == collector.taken[2:]
    assert agent.dropped == 2
    assert "2 dropped so far" in caplog.text


def test_a_batch_too_large_is_split_and_a_reading_too_large_dropped(portal, node, key, settings):
    clock = ManualClock(datetime.now(UTC) - timedelta(minutes=5))
    collector = FakeCollector(node, clock.now)
    agent = make_agent(collector, portal.url, key, clock, batch_size=8)
    for _ in range(8):
        agent.collect()
        clock.advance(15)
    one = len(json.dumps({"readings": [to_json(agent.buffer[0])]}))
    settings.DATA_UPLOAD_MAX_MEMORY_SIZE = 2 * one + 100  # two readings fit, four do not

    assert agent.flush()
    assert agent.sent == 8 and agent.refused == 0
    assert [status for status, _ in portal.posts] == [413, 413, 202, 202, 202, 202]
    assert set(portal.stored_once().values()) == {1} and len(stored_times()) == 8

    settings.DATA_UPLOAD_MAX_MEMORY_SIZE = one // 2
    agent.collect()
    assert agent.flush() and agent.refused == 1 and not agent.buffer


def test_readings_out_of_the_time_bounds_are_dropped_and_the_rest_sent(portal, node, key):
    clock = ManualClock(datetime.now(UTC) - timedelta(days=2))
    collector = FakeCollector(node, clock.now)
    agent = make_agent(collector, portal.url, key, clock)
    agent.collect()
    agent.collect()
    clock.start = datetime.now(UTC) - timedelta(minutes=1) - timedelta(seconds=clock.seconds)
    agent.collect()

    assert agent.flush()
    assert agent.refused == 2 and agent.sent == 1
    assert stored_times() == {datetime.fromisoformat(collector.taken[2]).isoformat()}


def test_a_refused_batch_is_kept_until_the_portal_knows_the_gpu(portal, node, key):
    clock = ManualClock(datetime.now(UTC) - timedelta(minutes=1))
    collector = FakeCollector(node, clock.now)
    collector.gpus = (*collector.gpus, GpuReading(2, "GPU-new"))
    agent = make_agent(collector, portal.url, key, clock)
    agent.tick()

    assert len(agent.buffer) == 1 and agent.failures == 1
    assert "has no GPU GPU-new" in agent.last_failure and "400" in agent.last_failure
    GpuCapacityFactory(node=node, index=2, uuid="GPU-new")  # the inventory sync finds it
    clock.advance(15)
    agent.tick()
    assert not agent.buffer and agent.sent == 2 and agent.failures == 0


def test_a_revoked_token_keeps_the_readings_and_backs_off(portal, node):
    issued = agents.issue_agent_token(cluster=node.cluster, name="old")
    agents.revoke_agent_token(token=issued.token)
    clock = ManualClock(datetime.now(UTC))
    agent = make_agent(FakeCollector(node, clock.now), portal.url, issued.key, clock)
    agent.tick()
    clock.advance(1)
    agent.tick()  # within the 2 s wait: no second try

    assert len(agent.buffer) == 2 and agent.failures == 1
    assert "401" in agent.last_failure and not Sample.objects.exists()
    assert [status for status, _ in portal.posts] == [401]


# --- the command -----------------------------------------------------------------------------------

NO_DATABASE = {
    "DATABASE_URL": "postgres://nobody@127.0.0.1:9/nowhere",
    "REDIS_URL": "redis://127.0.0.1:9/0",
    "CACHE_URL": "redis://127.0.0.1:9/1",
}


def test_gpu_agent_without_nvml_says_so_in_one_line_and_touches_no_database():
    import pynvml

    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError_LibraryNotFound:
        pass
    else:
        pynvml.nvmlShutdown()
        pytest.skip("this machine has an NVIDIA driver")
    env = {**os.environ, **NO_DATABASE}
    done = subprocess.run(
        [
            sys.executable,
            "manage.py",
            "gpu_agent",
            "--portal",
            "http://127.0.0.1:9",
            "--token",
            "k",
            "--once",
        ],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode != 0
    assert done.stdout == ""
    assert done.stderr.strip() == NO_NVML


# A node's agent in a process of its own: settings load, but the database it names does not exist.
ONE_READING = """
import json, sys
from datetime import UTC, datetime
import django
django.setup()
from django.core.management import call_command
from monitoring.collectors import GpuReading, Reading

class OneHost:
    name = "one-host"
    def readings(self):
        gpus = tuple(GpuReading(n, uuid, power_w=100.0) for n, uuid in enumerate(json.loads(sys.argv[4])))
        return (Reading(sys.argv[3], datetime.now(UTC), gpus),)
    def close(self):
        pass

call_command("gpu_agent", portal=sys.argv[1], token=sys.argv[2], once=True, collector=OneHost())
"""


def test_gpu_agent_once_sends_from_a_process_without_a_database(portal, node, key):
    uuids = json.dumps(list(node.gpus.order_by("index").values_list("uuid", flat=True)))
    done = subprocess.run(
        [sys.executable, "-c", ONE_READING, portal.url, key, node.name, uuids],
        cwd=ROOT,
        env={**os.environ, "DJANGO_SETTINGS_MODULE": "portal.settings", **NO_DATABASE},
        capture_output=True,
        text=True,
        timeout=120,
    )

    assert done.returncode == 0, done.stderr
    assert done.stdout == f"Sent 1 reading(s) of 2 GPU(s) to {portal.url}.\n" and done.stderr == ""
    assert len(stored_times()) == 1


def test_gpu_agent_once_sends_one_reading_or_fails_with_one_line(portal, node, key):
    out, err = io.StringIO(), io.StringIO()
    collector = FakeCollector(node)
    call_command(
        "gpu_agent", portal=portal.url, token=key, once=True, collector=collector, stdout=out, stderr=err
    )

    assert out.getvalue() == f"Sent 1 reading(s) of 2 GPU(s) to {portal.url}.\n" and err.getvalue() == ""
    assert len(stored_times()) == 1 and collector.closed

    portal.stop()
    with pytest.raises(SystemExit) as failed:
        call_command(
            "gpu_agent", portal=portal.url, token=key, once=True, collector=FakeCollector(node), stderr=err
        )
    assert failed.value.code == 1
    [line] = err.getvalue().splitlines()
    assert line.startswith(f"Could not send 1 reading(s) to {portal.url}: cannot reach")
    assert line.endswith("Connection refused.")


def test_gpu_agent_on_sigterm_sends_what_it_buffered_then_exits(portal, node, key):
    portal.stop()  # the portal is away while the agent reads
    collector = FakeCollector(node)

    def restart_then_terminate():
        deadline = time.monotonic() + 30
        while signal.getsignal(signal.SIGTERM) in (signal.SIG_DFL, None) or len(collector.taken) < 3:
            assert time.monotonic() < deadline
            time.sleep(0.02)
        portal.start()
        os.kill(os.getpid(), signal.SIGTERM)

    previous = signal.getsignal(signal.SIGTERM)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    helper = threading.Thread(target=restart_then_terminate)
    helper.start()
    try:
        call_command(
            "gpu_agent",
            portal=portal.url,
            token=key,
            interval=0.05,
            collector=collector,
            stderr=io.StringIO(),
        )
    finally:
        helper.join()
        signal.signal(signal.SIGTERM, previous)

    assert len(collector.taken) >= 3 and collector.closed
    assert stored_times() == {datetime.fromisoformat(at).isoformat() for at in collector.taken}
    assert signal.getsignal(signal.SIGTERM) == previous
