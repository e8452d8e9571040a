"""The portal's own processes in Prometheus figures, and one log line a web request.

Families:
- gpu_portal_http_request_duration_seconds{method, route, status} (histogram): each web request from the
  first middleware to the answer; `route` is the URL pattern (`t/<slug:slug>/`), never the address itself,
  which may carry an invitation token, and `unmatched` for addresses no pattern took;
- gpu_portal_task_duration_seconds{task, state} (histogram): each Celery task run, by how it ended
  (SUCCESS, FAILURE, RETRY, ...), in the worker that ran it;
- gpu_portal_task_failures_total{task, exception} (counter): tasks that raised;
- gpu_portal_task_queue_length{queue} (gauge): tasks waiting in the broker, read at scrape time.

Where they are read: a web process's figures on `/metrics` (portal/metrics.py adds `latest()` to the
apps'; with METRICS_PORT, on that port only: `MetricsPortMiddleware`), a worker's or beat's on its own
port (`CELERY_METRICS_PORT`), started by `serve()`. With several processes behind one port (gunicorn's
workers, a prefork worker's children), PROMETHEUS_MULTIPROC_DIR names a directory they share, emptied when
the first process starts, as prometheus_client's multiprocess mode wants; without it each process reports
only itself.
"""

from __future__ import annotations

import logging
import os
import time
from pathlib import Path

import redis
from celery import current_app
from django.conf import settings
from django.http import HttpRequest, HttpResponse, HttpResponseNotFound
from django.urls import resolve
from prometheus_client import REGISTRY, CollectorRegistry, Counter, Histogram, start_http_server
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.exposition import generate_latest
from prometheus_client.multiprocess import MultiProcessCollector

log = logging.getLogger(__name__)
request_log = logging.getLogger("portal.requests")

MULTIPROC_ENV = "PROMETHEUS_MULTIPROC_DIR"
# Web pages and API answers take milliseconds to a few seconds; tasks up to minutes (a MIG change).
REQUEST_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)
TASK_BUCKETS = (0.01, 0.05, 0.1, 0.5, 1.0, 5.0, 15.0, 60.0, 300.0, 900.0)
# kombu's Redis transport keeps a queue's prioritised messages in lists of their own: `<queue>\x06\x16<n>`.
PRIORITY_SEPARATOR = "\x06\x16"
PRIORITY_STEPS = (3, 6, 9)

REQUEST_SECONDS = Histogram(
    "gpu_portal_http_request_duration_seconds",
    "Web requests, from arrival to answer, in seconds.",
    ["method", "route", "status"],
    buckets=REQUEST_BUCKETS,
)
TASK_SECONDS = Histogram(
    "gpu_portal_task_duration_seconds",
    "Celery task runs, in seconds, by how they ended.",
    ["task", "state"],
    buckets=TASK_BUCKETS,
)
TASK_FAILURES = Counter(
    "gpu_portal_task_failures_total",
    "Celery task runs that raised, by task and exception.",
    ["task", "exception"],
)


# --- web -------------------------------------------------------------------------------------------------

METHODS = frozenset({"GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"})
METRICS_PATH = "/metrics"


def on_metrics_port(request: HttpRequest) -> bool:
    """Whether the request came in on METRICS_PORT. gunicorn gives SERVER_PORT from the TCP socket the
    connection arrived on, never from the Host header, so a client cannot choose it (on a unix socket it
    would come from the Host header: METRICS_PORT is for TCP listeners, as deploy/gunicorn.conf.py binds)."""
    port = settings.METRICS_PORT
    return bool(port) and request.META.get("SERVER_PORT") == str(port)


def serves_metrics(request: HttpRequest) -> bool:
    """Whether /metrics may answer this request: always without METRICS_PORT, else on that port only."""
    return not settings.METRICS_PORT or on_metrics_port(request)


class MetricsPortMiddleware:
    """With METRICS_PORT, the connections to that port get /metrics and nothing else (404), answered here,
    before the host check and the HTTPS redirect, as the probes are: Prometheus asks each pod by its
    address over plain HTTP. The public port's /metrics answers 404 (serves_metrics). Right after the
    probes in MIDDLEWARE."""

    def __init__(self, get_response):
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        if not on_metrics_port(request):
            return self.get_response(request)
        if request.path_info != METRICS_PATH:
            return HttpResponseNotFound(
                f"Not found: this port serves {METRICS_PATH} only.\n",
                content_type="text/plain; charset=utf-8",
            )
        match = resolve(METRICS_PATH)
        return match.func(request, *match.args, **match.kwargs)


def route_of(request: HttpRequest) -> str:
    match = getattr(request, "resolver_match", None)
    return match.route if match is not None and match.route else "unmatched"


class RequestMetricsMiddleware:
    """Times each request and writes one line of it (`portal.requests`, with the request id the log
    filters add). Right after the health probes and the metrics port in MIDDLEWARE, so that neither probes
    nor scrapes on METRICS_PORT count or log."""

    def __init__(self, get_response):
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        started = time.perf_counter()
        response = self.get_response(request)
        seconds = time.perf_counter() - started
        method = request.method if request.method in METHODS else "other"  # the label set stays bounded
        route = route_of(request)
        REQUEST_SECONDS.labels(method, route, str(response.status_code)).observe(seconds)
        request_log.info(
            "%s %s %s %.1f ms",
            method,
            route,
            response.status_code,
            seconds * 1000,
            extra={
                "method": method,
                "route": route,
                "status": response.status_code,
                "duration_ms": round(seconds * 1000, 1),
            },
        )
        return response


# --- tasks -----------------------------------------------------------------------------------------------

_started: dict[str, float] = {}


def task_started(task_id: str | None = None, **kwargs) -> None:
    if task_id:
        _started[task_id] = time.perf_counter()


def task_ended(task_id: str | None = None, task=None, state: str | None = None, **kwargs) -> None:
    started = _started.pop(task_id, None) if task_id else None
    if started is not None and task is not None:
        TASK_SECONDS.labels(task.name, state or "UNKNOWN").observe(time.perf_counter() - started)


def task_failed(sender=None, exception: BaseException | None = None, **kwargs) -> None:
    name = getattr(sender, "name", None) or "unknown"
    TASK_FAILURES.labels(name, type(exception).__name__ if exception is not None else "unknown").inc()


# --- the queue -------------------------------------------------------------------------------------------


def queue_lengths() -> dict[str, int]:
    """Messages waiting in each queue the portal's tasks go to (the default queue and those the apps' plugins
    route tasks to), prioritised ones included; raises redis.RedisError when the broker does not answer."""
    from portal import shell

    routed = {route["queue"] for route in shell.task_routes().values()}
    queues = {current_app.conf.task_default_queue, *routed}
    client = redis.Redis.from_url(settings.CELERY_BROKER_URL, socket_timeout=2, socket_connect_timeout=2)
    try:
        with client.pipeline(transaction=False) as pipe:
            names = sorted(queues)
            for name in names:
                pipe.llen(name)
                for step in PRIORITY_STEPS:
                    pipe.llen(f"{name}{PRIORITY_SEPARATOR}{step}")
            counts = pipe.execute()
    finally:
        client.close()
    per_queue = 1 + len(PRIORITY_STEPS)
    return {name: sum(counts[i * per_queue : (i + 1) * per_queue]) for i, name in enumerate(names)}


class QueueCollector:
    """The queue's length at scrape time; left out (and logged) when the broker does not answer, so that
    a missing figure is not read as an empty queue."""

    def collect(self):
        try:
            lengths = queue_lengths()
        except (redis.RedisError, OSError) as error:
            log.warning("the task queue's length could not be read: %s", error)
            return
        family = GaugeMetricFamily(
            "gpu_portal_task_queue_length", "Tasks waiting in the broker, by queue.", labels=["queue"]
        )
        for name, length in lengths.items():
            family.add_metric([name], length)
        yield family


# --- exposition ------------------------------------------------------------------------------------------


def multiproc_dir() -> Path | None:
    path = os.environ.get(MULTIPROC_ENV)
    return Path(path) if path else None


def process_registry():
    """This process's figures, or with PROMETHEUS_MULTIPROC_DIR those of every process sharing it."""
    if multiproc_dir() is None:
        return REGISTRY
    registry = CollectorRegistry()
    MultiProcessCollector(registry)
    return registry


def latest() -> bytes:
    """The text exposition of the processes' figures and the queue's, for the web's /metrics."""
    queue = CollectorRegistry()
    queue.register(QueueCollector())
    return generate_latest(process_registry()) + generate_latest(queue)


def reset_multiproc_dir() -> None:
    """Empties the shared directory of a previous run (a restarted container keeps its volume): what is
    left there would be added to this run's figures."""
    path = multiproc_dir()
    if path is None:
        return
    path.mkdir(parents=True, exist_ok=True)
    for stale in path.glob("*.db"):
        stale.unlink(missing_ok=True)


def serve(port: int) -> None:
    """Serves the process's figures on `port` in a thread of this process (a worker's main process, or
    beat); any path answers them, so that a liveness probe may ask `/healthz`."""
    reset_multiproc_dir()
    start_http_server(port, registry=process_registry())
    log.info("metrics served on port %s", port)
