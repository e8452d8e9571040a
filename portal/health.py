"""Health of a portal process for its orchestrator: `/healthz` (the process answers) and `/readyz` (what
it depends on answers).

Words used here:
- check: one dependency looked at now, with its outcome: `ok`, `degraded` (the portal works, but something
  it reports on is behind, such as a cluster whose inventory is old) or `down` (the portal cannot work);
- ready: no check is down (the database, Redis, every migration applied). A degraded check keeps the
  process ready: taking web processes out of service because one cluster stopped answering would take the
  whole portal down with it.

Both answer before any other middleware, so that a probe reaches them by a pod's address over plain HTTP:
no host check (ALLOWED_HOSTS names the public host, not the pod's), no HTTPS redirect, no session.
Apps add their own checks through `AppPlugin.readiness` (see portal/shell.py).
"""

from __future__ import annotations

import logging
import time
from dataclasses import asdict, dataclass, field
from typing import Literal

import redis
from django.conf import settings
from django.db import connection, transaction
from django.http import HttpRequest, HttpResponse, JsonResponse

from portal import shell

log = logging.getLogger(__name__)

Outcome = Literal["ok", "degraded", "down"]
# How long a dependency may take to answer a probe before it counts as down.
PROBE_TIMEOUT_SECONDS = 2.0
PATHS = ("/healthz", "/readyz")


@dataclass(frozen=True)
class Check:
    name: str
    outcome: Outcome
    detail: str = ""
    # Figures a person reads to see why, e.g. {"last_sync_age_seconds": 912}.
    figures: dict = field(default_factory=dict)


def _database() -> Check:
    started = time.monotonic()
    try:
        with transaction.atomic(), connection.cursor() as cursor:
            cursor.execute("SET LOCAL statement_timeout = %s", [int(PROBE_TIMEOUT_SECONDS * 1000)])
            cursor.execute("SELECT 1")
    except Exception as error:  # any failure of the driver means the same to a probe: not there
        connection.close_if_unusable_or_obsolete()
        return Check("database", "down", f"{type(error).__name__}: {error}".strip())
    return Check("database", "ok", figures={"seconds": round(time.monotonic() - started, 4)})


def _redis(name: str, url: str) -> Check:
    started = time.monotonic()
    try:
        client = redis.Redis.from_url(
            url, socket_timeout=PROBE_TIMEOUT_SECONDS, socket_connect_timeout=PROBE_TIMEOUT_SECONDS
        )
        try:
            client.ping()
        finally:
            client.close()
    except (redis.RedisError, OSError, ValueError) as error:
        return Check(name, "down", f"{type(error).__name__}: {error}".strip())
    return Check(name, "ok", figures={"seconds": round(time.monotonic() - started, 4)})


_migrated = False  # once every migration is applied, it stays so for the life of the process


def _migrations() -> Check:
    """Down while a migration this code knows is not applied: a new release's web processes wait for
    the migration Job instead of serving pages that need tables not there yet."""
    global _migrated
    if not _migrated:
        from django.db.migrations.executor import MigrationExecutor

        try:
            executor = MigrationExecutor(connection)
            pending = executor.migration_plan(executor.loader.graph.leaf_nodes())
        except Exception as error:  # an unreadable migration table: as good as not migrated
            return Check("migrations", "down", f"{type(error).__name__}: {error}".strip())
        if pending:
            names = ", ".join(f"{migration.app_label}.{migration.name}" for migration, _ in pending[:5])
            more = f" and {len(pending) - 5} more" if len(pending) > 5 else ""
            return Check("migrations", "down", f"{len(pending)} not applied: {names}{more}")
        _migrated = True
    return Check("migrations", "ok")


def checks() -> list[Check]:
    """Every check, the portal's own first: the database, the task broker, the cache when it is
    another Redis, then each app's."""
    database = _database()
    found = [database, _redis("redis", settings.CELERY_BROKER_URL)]
    cache_url = settings.CACHES["default"]["LOCATION"]
    if cache_url != settings.CELERY_BROKER_URL:
        found.append(_redis("cache", cache_url))
    if database.outcome == "down":
        return found  # the checks below read the database: they would only repeat that it is down
    migrations = _migrations()
    found.append(migrations)
    if migrations.outcome == "down":
        return found
    for path, app_checks in shell.readiness_checks():
        try:
            found.extend(app_checks())
        except Exception as error:  # a check that breaks must not take the probe down with it
            log.exception("the readiness check %s failed", path)
            found.append(Check(path, "degraded", f"the check failed: {type(error).__name__}: {error}"))
    return found


def healthz(request: HttpRequest) -> HttpResponse:
    return JsonResponse({"status": "ok"})


def readyz(request: HttpRequest) -> HttpResponse:
    found = checks()
    down = [check.name for check in found if check.outcome == "down"]
    degraded = [check.name for check in found if check.outcome == "degraded"]
    body = {
        "status": "down" if down else "degraded" if degraded else "ok",
        "down": down,
        "degraded": degraded,
        "checks": [asdict(check) for check in found],
    }
    return JsonResponse(body, status=503 if down else 200)


class HealthMiddleware:
    """Answers the probes' paths itself; first in MIDDLEWARE."""

    def __init__(self, get_response):
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        if request.path_info in PATHS and request.method in ("GET", "HEAD"):
            response = healthz(request) if request.path_info == "/healthz" else readyz(request)
            response["Cache-Control"] = "no-store"
            return response
        return self.get_response(request)
