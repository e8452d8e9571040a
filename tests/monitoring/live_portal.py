"""The Django app served over real HTTP from a thread, for tests of clients that speak to the portal (the
node agent): it stops and starts again on the same port, as a portal restart does. The agents' batches it
takes are stored before its answer leaves, as the writer beside a portal stores them a moment later."""

import io
import json
import socket
import threading
from collections import Counter

from django.core.handlers.wsgi import WSGIHandler
from django.core.servers.basehttp import WSGIRequestHandler, WSGIServer
from django.db import connections

from monitoring.ingest import accepted


class QuietHandler(WSGIRequestHandler):
    def log_message(self, *args):
        pass


class PortalServer:
    """The portal's WSGI app on a real port in a thread; it can stop and start again on the same port.
    `posts` records each request: its status and the times of the readings it carried."""

    def __init__(self):
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            self.port = probe.getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}"
        self.posts: list[tuple[int, list[str]]] = []
        self.handler = WSGIHandler()
        self.server = None

    def _app(self, environ, start_response):
        body = environ["wsgi.input"].read(int(environ.get("CONTENT_LENGTH") or 0))
        environ["wsgi.input"] = io.BytesIO(body)
        status = []

        def record(line, headers, exc_info=None):
            status.append(int(line.split()[0]))
            return start_response(line, headers, exc_info)

        result = self.handler(environ, record)
        if status[0] == 202:
            accepted.store()
        try:
            times = [reading["at"] for reading in json.loads(body)["readings"]]
        except (ValueError, KeyError, TypeError):
            times = []
        self.posts.append((status[0], times))
        return result

    def _serve(self, server):
        try:
            server.serve_forever(poll_interval=0.05)
        finally:
            connections.close_all()  # this thread's connection, so the test database can be dropped

    def start(self):
        self.server = WSGIServer(("127.0.0.1", self.port), QuietHandler, allow_reuse_address=True)
        self.server.set_app(self._app)
        self.thread = threading.Thread(target=self._serve, args=(self.server,), daemon=True)
        self.thread.start()

    def stop(self):
        if self.server is not None:
            self.server.shutdown()
            self.server.server_close()
            self.thread.join(timeout=10)
            self.server = None

    def stored_once(self) -> Counter:
        """How many requests answered 202 (taken) carried each reading time."""
        return Counter(at for status, times in self.posts if status == 202 for at in times)
