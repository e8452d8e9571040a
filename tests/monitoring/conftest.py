"""Fixtures of the monitoring tests: a node of two GPUs, real local HTTP servers standing in for a webhook
receiver and for a cluster's Prometheus, the system resolver answering for test names, and a superuser in the
admin."""

import json
import socket
import threading
import time
from contextlib import suppress
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from tests.factories import ClusterFactory, GpuCapacityFactory, NodeCapacityFactory, UserFactory


class Hook:
    """A webhook receiver on a real local HTTP server: answers the statuses given in turn (the last one
    from then on), with `headers`, and keeps every body it was sent."""

    def __init__(self, statuses=(200,), headers=None):
        self.statuses = list(statuses)
        self.headers = headers or {}
        self.bodies: list[dict] = []
        hook = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):
                length = int(self.headers["Content-Length"])
                hook.bodies.append(json.loads(self.rfile.read(length)))
                status = hook.statuses.pop(0) if len(hook.statuses) > 1 else hook.statuses[0]
                self.send_response(status)
                for name, value in hook.headers.items():
                    self.send_header(name, value)
                self.end_headers()
                self.wfile.write(b"ok" if status < 300 else b"broken")

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/alerts"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def close(self):
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def hook_server():
    made = []

    def make(statuses=(200,), headers=None):
        made.append(Hook(statuses, headers))
        return made[-1]

    yield make
    for hook in made:
        hook.close()


class FakePrometheus:
    """Answers every request with the given status, content type, body and other `headers`, after `delay`
    seconds."""

    def __init__(
        self, status=200, body: object = "", content_type="application/json", delay=0.0, headers=None
    ):
        self.reply = (status, content_type, body if isinstance(body, str) else json.dumps(body))
        self.delay = delay
        self.headers = headers or {}
        self.requests: list[tuple[str, dict[str, str]]] = []
        fake = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                fake.requests.append((self.path, dict(self.headers)))
                time.sleep(fake.delay)
                status, kind, text = fake.reply
                with suppress(ConnectionError):  # a client that gave up waiting has gone
                    self.send_response(status)
                    self.send_header("Content-Type", kind)
                    for name, value in fake.headers.items():
                        self.send_header(name, value)
                    self.end_headers()
                    self.wfile.write(text.encode())

            def log_message(self, format, *args) -> None:
                pass

        self.http = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.http.daemon_threads = True
        self.http.block_on_close = False
        self.url = f"http://127.0.0.1:{self.http.server_address[1]}"
        threading.Thread(target=self.http.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()

    def stop(self) -> None:
        self.http.shutdown()
        self.http.server_close()


@pytest.fixture
def fake_prometheus():
    made: list[FakePrometheus] = []

    def make(*args, **kwargs) -> FakePrometheus:
        made.append(FakePrometheus(*args, **kwargs))
        return made[-1]

    yield make
    for fake in made:
        fake.stop()


@pytest.fixture
def resolver(monkeypatch):
    """The system resolver answering for names under .example: each look-up of a name takes the next list
    of addresses given for it (the last one from then on); other names resolve as they do. Connections
    to the addresses are real."""
    real = socket.getaddrinfo
    answers: dict[str, list[list[str]]] = {}

    def getaddrinfo(host, port, *args, **kwargs):
        if not str(host).endswith(".example"):
            return real(host, port, *args, **kwargs)
        queue = answers[host]
        addresses = queue.pop(0) if len(queue) > 1 else queue[0]
        return [
            (socket.AF_INET6, socket.SOCK_STREAM, 6, "", (a, int(port), 0, 0))
            if ":" in a
            else (socket.AF_INET, socket.SOCK_STREAM, 6, "", (a, int(port)))
            for a in addresses
        ]

    monkeypatch.setattr(socket, "getaddrinfo", getaddrinfo)

    def answer(host: str, *lists: list[str]) -> None:
        answers[host] = list(lists)

    return answer


@pytest.fixture
def superuser_client(client, settings):
    settings.STAFF_REQUIRE_TOTP = False
    client.force_login(UserFactory(username="root", is_staff=True, is_superuser=True))
    return client


@pytest.fixture
def node():
    """gpu-node-1 of cluster sim: two H100 GPUs, the second cut into two 3g.40gb instances (the node whose
    readings tests/monitoring/agent_readings.py makes)."""
    node = NodeCapacityFactory(cluster=ClusterFactory(name="sim"), name="gpu-node-1", gpu_model="H100-80GB")
    GpuCapacityFactory(node=node, index=0)
    GpuCapacityFactory(node=node, index=1, mig={"3g.40gb": 2})
    return node
