"""Shared fixtures: two tenants with people in every role, API clients, static files."""

import os
import subprocess
import sys
import time
import uuid
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import quote

import pytest
from django.conf import settings as django_settings
from django.contrib.auth.models import Group
from django.core.cache import cache
from django.core.management import call_command
from django.utils import translation
from rest_framework.test import APIClient

from portal.models import Project, Role, Tenant
from tests.factories import MembershipFactory, ProjectFactory, TenantFactory, UserFactory

ROOT = Path(__file__).resolve().parents[1]


TASK_QUEUE = f"test-{uuid.uuid4().hex[:10]}"


@pytest.fixture(scope="session", autouse=True)
def _test_settings(tmp_path_factory, django_test_environment):
    """Fast password hashing; TOTP codes valid across a period boundary; tasks sent to a queue of
    this session only, those routed to a queue of their own too (what-if runs); static files collected
    once, as production does, so that templates resolve them through the manifest."""
    from django.conf import settings

    from portal.celery import app

    app.conf.task_default_queue = TASK_QUEUE
    app.conf.task_routes = {task: {"queue": TASK_QUEUE} for task in settings.CELERY_TASK_ROUTES}

    settings.PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]
    # A code computed by a test just before a 30-second period ends still counts after it.
    settings.MFA_TOTP_TOLERANCE = 1
    # Tests change capacity behind the services' backs; each read sees the database as it is
    # (tests/pools/test_capacity_picture.py turns the reuse on and checks what bumps it).
    settings.CAPACITY_PICTURE_SECONDS = 0
    settings.STATIC_ROOT = tmp_path_factory.mktemp("static")
    call_command("collectstatic", interactive=False, verbosity=0)


@pytest.fixture(autouse=True)
def _default_language():
    """Each test starts in the portal's default language: a page asked for in Korean leaves Korean active
    in the thread (the locale middleware activates, never deactivates), and a service's message follows it."""
    translation.activate(django_settings.LANGUAGE_CODE)


@pytest.fixture(autouse=True)
def _fresh_cache():
    """Rate limits and used TOTP codes live in the cache; each test starts without them. The sample
    partitions a test made are rolled back with it, so none is taken as known."""
    from monitoring import samples

    cache.clear()
    samples.forget_partitions()


@dataclass
class Tenancy:
    acme: Tenant
    globex: Tenant
    vision: Project
    recsys: Project
    acme_admin: object
    acme_member: object
    acme_viewer: object
    globex_member: object
    outsider: object


@pytest.fixture
def tenancy(db) -> Tenancy:
    acme = TenantFactory(slug="acme", name="Acme")
    globex = TenantFactory(slug="globex", name="Globex")
    return Tenancy(
        acme=acme,
        globex=globex,
        vision=ProjectFactory(tenant=acme, slug="vision"),
        recsys=ProjectFactory(tenant=globex, slug="recsys"),
        acme_admin=MembershipFactory(tenant=acme, role=Role.ADMIN, user__username="bob").user,
        acme_member=MembershipFactory(tenant=acme, role=Role.MEMBER, user__username="alice").user,
        acme_viewer=MembershipFactory(tenant=acme, role=Role.VIEWER, user__username="victor").user,
        globex_member=MembershipFactory(tenant=globex, role=Role.MEMBER, user__username="mallory").user,
        outsider=UserFactory(username="olivia"),
    )


@pytest.fixture
def staff_user(db):
    def make(group: str):
        user = UserFactory(username=f"staff-{group}", is_staff=True)
        user.groups.add(Group.objects.get(name=group))
        return user

    return make


@pytest.fixture
def approver(staff_user):
    return staff_user("approver")


@pytest.fixture
def operator(staff_user):
    """An operator, their group holding monitoring's permissions as the roles migration grants them (a
    test database flushed by an earlier test that committed has lost what migrations wrote)."""
    from django.contrib.auth.models import Permission

    from portal.roles import PlatformRole

    group = Group.objects.get(name=PlatformRole.OPERATOR)
    for codename in ("view_alert", "change_alert", "view_latest"):
        group.permissions.add(Permission.objects.get(content_type__app_label="monitoring", codename=codename))
    return staff_user("operator")


@pytest.fixture
def synced(db, settings):
    """`synced(fleet)`: a simulated cluster of that fleet (as `ClusterFactory(fleet=…)` takes it), synced,
    its MIG changes applied at once."""
    from pools.sync import sync_cluster
    from tests.factories import ClusterFactory

    settings.SIMULATED_MIG_APPLY_SECONDS = 0

    def make(fleet, name: str = "sim"):
        cluster = ClusterFactory(name=name, fleet=fleet)
        sync_cluster(cluster=cluster)
        return cluster

    return make


@pytest.fixture
def api_client():
    return APIClient()


@pytest.fixture
def private_networks_allowed(settings):
    """The tests' webhook and Prometheus servers listen on loopback, an address the portal refuses to send
    requests to unless allowed."""
    settings.OUTBOUND_ALLOW_PRIVATE_NETWORKS = True


@pytest.fixture
def client_for(client):
    def login(user):
        client.force_login(user)
        return client

    return login


@pytest.fixture
def api_for(api_client):
    def login(user):
        api_client.force_authenticate(user)
        return api_client

    return login


@dataclass
class Worker:
    queue: str
    mail_dir: Path
    log: Path
    process: subprocess.Popen | None = None


def database_address(name: str | None = None) -> str:
    """The address of database `name` (default: the test database, once django_db_setup has run) on the
    tests' PostgreSQL server, as the user the tests connect as."""
    from django.conf import settings

    db = settings.DATABASES["default"]
    auth = quote(db["USER"]) + (f":{quote(db['PASSWORD'])}" if db["PASSWORD"] else "")
    return f"postgres://{auth}@{db['HOST'] or '127.0.0.1'}:{db['PORT'] or 5432}/{name or db['NAME']}"


@contextmanager
def running_worker(
    queue: str, workdir: Path, *, pool: str = "solo", hostname: str = "", env: dict[str, str] | None = None
):
    """A real Celery worker process on the test database, consuming `queue` through Redis. Several may
    consume one queue, each under its own `hostname` (node name); `env` adds to or overrides its
    environment."""
    database_url = database_address()
    worker = Worker(queue=queue, mail_dir=workdir / "mail", log=workdir / "worker.log")
    environment = {
        **os.environ,
        "DATABASE_URL": database_url,
        "CELERY_QUEUE": queue,
        "WHATIF_QUEUE": queue,  # what it sends of what-if runs comes back to it, as everything else
        "EMAIL_URL": f"filemail:///{worker.mail_dir}",  # django-environ drops one leading slash
        "SIMULATED_MIG_APPLY_SECONDS": "0.3",
        "PROVISION_POLL_SECONDS": "0.2",
        "OUTBOUND_ALLOW_PRIVATE_NETWORKS": "true",  # the tests' webhook servers listen on loopback
        **(env or {}),
    }
    with worker.log.open("w") as log:
        worker.process = subprocess.Popen(
            [sys.executable, "-m", "celery", "-A", "portal", "worker", "--pool", pool, "--concurrency", "1",
             "--loglevel", "INFO", "--queues", queue, "--hostname", hostname or f"{queue}@%h",
             "--without-heartbeat", "--without-mingle"],
            cwd=ROOT, env=environment, stdout=log, stderr=subprocess.STDOUT,
        )  # fmt: skip
    try:
        deadline = time.monotonic() + 60
        while "ready." not in worker.log.read_text():
            assert worker.process.poll() is None, f"the worker died:\n{worker.log.read_text()}"
            assert time.monotonic() < deadline, f"the worker did not start:\n{worker.log.read_text()}"
            time.sleep(0.2)
        yield worker
    finally:
        worker.process.terminate()
        try:
            worker.process.wait(timeout=20)
        except subprocess.TimeoutExpired:
            worker.process.kill()


RUNNING: list[Worker] = []  # the session's worker, once a test has started it


@pytest.fixture(scope="session")
def _session_worker(django_db_setup, tmp_path_factory):
    from portal.celery import app

    app.control.purge()  # tasks that earlier tests queued belong to databases that are gone
    with running_worker(TASK_QUEUE, tmp_path_factory.mktemp("worker")) as worker:
        RUNNING.append(worker)
        yield worker
        RUNNING.clear()


@pytest.fixture(autouse=True)
def _worker_idle_before_flush(request, django_db_blocker):
    """A transactional test commits, so the tasks it queues reach the session's worker (once started)
    even when the test does not use it: the database is emptied only once the worker is idle. The
    samples' table, partitioned by day in SQL, is no model's table, so the flush does not empty it:
    it is emptied here, so that no sample a test committed shows in a later one."""
    yield
    marker = request.node.get_closest_marker("django_db")
    committing = "transactional_db" in request.fixturenames
    if committing or (marker is not None and marker.kwargs.get("transaction")):
        if RUNNING:
            wait_until_idle(RUNNING[0])
        from django.db import connection

        with django_db_blocker.unblock(), connection.cursor() as cursor:
            cursor.execute("DELETE FROM monitoring_sample")


@pytest.fixture
def celery_worker(_session_worker):
    """The session's worker, on the queue every task of the tests goes to. After the test it is left
    idle — its queue empty, no task running — so that the database is emptied under no transaction of
    a task the test set off (emptying it mid-task deadlocks, or the task writes into the next test)."""
    yield _session_worker
    wait_until_idle(_session_worker)


def wait_until_idle(worker: Worker, timeout: float = 60) -> None:
    from portal.celery import app

    deadline = time.monotonic() + timeout
    quiet = 0
    with app.connection_for_read() as connection:
        redis = connection.default_channel.client
        while quiet < 2:  # twice in a row: a running task may queue another as it ends
            assert time.monotonic() < deadline, f"the worker is still busy:\n{worker.log.read_text()[-3000:]}"
            inspect = app.control.inspect(timeout=0.5)
            held = [*(inspect.active() or {}).items(), *(inspect.reserved() or {}).items()]
            busy = any(tasks for name, tasks in held if name.startswith(f"{worker.queue}@"))
            quiet = 0 if busy or redis.llen(worker.queue) else quiet + 1
            time.sleep(0.1)
