"""The probes: /healthz answers whenever the process does; /readyz names what is down (503) and what is
behind (a degraded cluster keeps the portal ready)."""

import json
import os
import subprocess
import sys
import uuid
from datetime import timedelta

import psycopg
import pytest
from django.utils import timezone

from pools.models import Cluster
from pools.selectors.readiness import stale_after_seconds
from tests.conftest import ROOT, database_address
from tests.pools.conftest import SMALL_FLEET

POD_ADDRESS = "10.42.0.17:8000"  # what a kubelet's probe sends as Host: no ALLOWED_HOSTS names it


@pytest.fixture
def probe(client, settings):
    """Probes as the kubelet sends them: plain HTTP to the pod's address, with production's redirect on."""
    settings.SECURE_SSL_REDIRECT = True
    settings.ALLOWED_HOSTS = ["portal.example.com"]

    def get(path: str):
        return client.get(path, HTTP_HOST=POD_ADDRESS)

    return get


def outcomes(response) -> dict[str, str]:
    return {check["name"]: check["outcome"] for check in response.json()["checks"]}


def test_healthz_answers_a_probe_without_touching_anything(probe):
    """No database mark: a query here would raise."""
    response = probe("/healthz")
    assert response.status_code == 200
    assert response.json() == {"status": "ok"}
    assert response["Cache-Control"] == "no-store"


@pytest.mark.django_db
def test_readyz_is_ok_with_the_database_redis_migrations_and_a_fresh_cluster(probe, synced):
    synced(SMALL_FLEET, name="fresh")
    response = probe("/readyz")
    assert response.status_code == 200, response.content
    body = response.json()
    assert body["status"] == "ok"
    assert body["down"] == [] and body["degraded"] == []
    assert outcomes(response) == {
        "database": "ok",
        "redis": "ok",
        "cache": "ok",  # the tests' cache is another Redis database than the broker
        "migrations": "ok",
        "cluster:fresh": "ok",
    }


@pytest.mark.django_db
def test_a_stale_cluster_degrades_readiness_but_keeps_the_portal_ready(probe, synced):
    synced(SMALL_FLEET, name="fresh")
    stale = synced(SMALL_FLEET, name="stale")
    age = stale_after_seconds() + 60
    Cluster.objects.filter(pk=stale.pk).update(last_sync_at=timezone.now() - timedelta(seconds=age))
    response = probe("/readyz")
    assert response.status_code == 200
    body = response.json()
    assert body["status"] == "degraded"
    assert body["degraded"] == ["cluster:stale"]
    check = next(check for check in body["checks"] if check["name"] == "cluster:stale")
    assert check["figures"]["last_sync_age_seconds"] >= age
    assert "more than" in check["detail"]
    assert outcomes(response)["cluster:fresh"] == "ok"


@pytest.mark.django_db
def test_a_failing_or_never_synced_cluster_is_degraded_with_its_error(probe, synced):
    from tests.factories import ClusterFactory

    failing = synced(SMALL_FLEET, name="failing")
    Cluster.objects.filter(pk=failing.pk).update(
        status=Cluster.Status.UNREACHABLE, last_error="connection refused", failures=2
    )
    ClusterFactory(name="new", fleet=SMALL_FLEET)
    body = probe("/readyz").json()
    assert body["status"] == "degraded"
    assert sorted(body["degraded"]) == ["cluster:failing", "cluster:new"]
    details = {check["name"]: check["detail"] for check in body["checks"]}
    assert details["cluster:failing"] == "the last sync failed: connection refused"
    assert details["cluster:new"].startswith("never synced")


@pytest.mark.django_db
def test_redis_down_takes_the_process_out_of_service_and_says_so(probe, settings):
    settings.CELERY_BROKER_URL = "redis://127.0.0.1:1/0"  # nothing listens on port 1
    response = probe("/readyz")
    assert response.status_code == 503
    body = response.json()
    assert body["status"] == "down"
    assert body["down"] == ["redis"]
    assert "ConnectionError" in next(check["detail"] for check in body["checks"] if check["name"] == "redis")


def _readyz_in_a_process(database_url: str) -> tuple[int, dict]:
    """/readyz asked in a process of its own, on another database than the tests'."""
    script = (
        "import django, json, sys; django.setup();"
        "from django.test import Client;"
        "r = Client().get('/readyz', HTTP_HOST='10.42.0.17:8000');"
        "print(json.dumps([r.status_code, r.json()]))"
    )
    env = {**os.environ, "DATABASE_URL": database_url, "DJANGO_SETTINGS_MODULE": "portal.settings"}
    done = subprocess.run(
        [sys.executable, "-c", script], cwd=ROOT, env=env, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    status, body = json.loads(done.stdout.strip().splitlines()[-1])
    return status, body


def test_a_database_that_does_not_answer_is_named_in_a_503():
    status, body = _readyz_in_a_process(database_address("no_such_portal_database"))
    assert status == 503
    assert body["down"] == ["database"]
    assert "no_such_portal_database" in body["checks"][0]["detail"]
    assert [check["name"] for check in body["checks"]] == ["database", "redis", "cache"]  # nothing after


def test_a_database_with_migrations_to_apply_is_not_ready():
    """A new release's web processes stay out of service until its migration Job has run."""
    name = f"portal_unmigrated_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(database_address("postgres"), autocommit=True) as admin:
        admin.execute(f'CREATE DATABASE "{name}"')
        try:
            status, body = _readyz_in_a_process(database_address(name))
        finally:
            admin.execute(f'DROP DATABASE "{name}" WITH (FORCE)')
    assert status == 503
    assert body["down"] == ["migrations"]
    migrations = next(check for check in body["checks"] if check["name"] == "migrations")
    assert "not applied: contenttypes.0001_initial" in migrations["detail"]


@pytest.mark.django_db
def test_an_app_check_that_breaks_degrades_instead_of_failing_the_probe(probe, monkeypatch):
    from portal import shell

    def broken():
        raise RuntimeError("the check itself is wrong")

    monkeypatch.setattr(shell, "readiness_checks", lambda: [("tests.broken", broken)])
    response = probe("/readyz")
    assert response.status_code == 200
    assert response.json()["degraded"] == ["tests.broken"]
