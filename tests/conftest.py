"""Shared fixtures: two tenants with people in every role, API clients, static files, the session's worker.

Run in parallel (pytest-xdist, `./scripts/test`), each process keeps apart from the others: its own test
database (pytest-django suffixes its name), its own Redis databases for the broker and the cache (set
below before its Django settings load), its own Celery queue and worker, its own temporary folders.
"""

import os
import socket
import subprocess
import sys
import time
import uuid
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import quote, urlsplit

import pytest
from django.conf import settings as django_settings
from django.contrib.auth import get_user_model
from django.contrib.auth.hashers import make_password
from django.contrib.auth.models import Group
from django.core.cache import cache
from django.core.management import call_command
from django.test.signals import setting_changed
from django.utils import translation
from rest_framework.test import APIClient

from billing import conf as billing_conf
from monitoring import conf as monitoring_conf
from pools import conf as pools_conf
from portal.models import Membership, Project, Role, Tenant
from tests import examples
from tests.factories import ProjectFactory, UserFactory
from tests.factories.tenancy import PASSWORD
from tests.needs import MARKERS, Reach, needs, needs_of

# The test identity provider's fixtures (`identity_provider`, `idp`) for every test that signs in through it.
pytest_plugins = ["tests.oidc.plugin"]

ROOT = Path(__file__).resolve().parents[1]
TASK_QUEUE = f"test-{uuid.uuid4().hex[:10]}"
HELD_QUEUE = f"{TASK_QUEUE}-held"  # what a test sends that does not use the worker: see _sends_held_back
# Each app's settings that name a Celery queue of its own (`<app>/conf.py`). A test's worker is given its one
# queue under every one of them, so that what it sends comes back to it wherever its app routes it
# (tests/portal/test_periodic_tasks.py checks that they cover every route).
QUEUE_SETTINGS = tuple(
    name
    for conf in (pools_conf, billing_conf, monitoring_conf)
    for name in conf.settings.names()
    if name.endswith("_QUEUE")
)
# Redis databases 0 and 1 are left to a portal running beside the tests; xdist worker N takes two of the rest.
FIRST_TEST_REDIS_DATABASE = 2
REDIS_DATABASES = 16


def worker_redis(worker: str, redis_url: str) -> dict[str, str]:
    """The broker and cache URLs of xdist worker `worker` ("gw3"): databases of their own on the server of
    `redis_url`, so that one process's `cache.clear()` or queue purge never touches another's."""
    index = int(worker.removeprefix("gw"))
    broker = FIRST_TEST_REDIS_DATABASE + 2 * index
    if broker + 1 >= REDIS_DATABASES:
        most = (REDIS_DATABASES - FIRST_TEST_REDIS_DATABASE) // 2
        raise pytest.UsageError(f"Redis has databases for {most} test processes at most (-n {most})")
    server = redis_url.rpartition("/")[0] if urlsplit(redis_url).path.strip("/").isdigit() else redis_url
    return {"REDIS_URL": f"{server}/{broker}", "CACHE_URL": f"{server}/{broker + 1}"}


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_newgateway(gateway):
    """Runs in the controlling process as each worker process starts, before the worker reads its Django
    settings: the worker's environment names its own Redis databases (its Celery worker inherits them)."""
    environment = worker_redis(gateway.id, os.environ.get("REDIS_URL", "redis://127.0.0.1:6379/0"))
    gateway.remote_exec(f"import os; os.environ.update({environment!r})").waitclose()


def pytest_configure(config):
    for name, what in MARKERS.items():
        config.addinivalue_line("markers", f"{name}: {what}")
    examples.load_profile()


# Modules whose every test fuzzes, and whose cases the fuzzer builds while they are collected (seconds in
# each process): not collected at all where the tests to run leave the fuzzer out.
FUZZ_MODULES = {ROOT / "tests/api/test_schema_fuzz.py"}


def pytest_ignore_collect(collection_path, config):
    if collection_path in FUZZ_MODULES and not _selected(config, "fuzz"):
        return True
    return None


def _selected(config, marker: str) -> bool:
    """Whether `-m` runs a test whose only marker is `marker`."""
    from _pytest.mark.expression import Expression

    expression = config.getoption("markexpr")
    return not expression or Expression.compile(expression).evaluate(lambda name, **_: name == marker)


def pytest_collection_modifyitems(config, items):
    """Marks each test with what it needs beyond this process (tests/needs.py), for `-m "not ..."`."""
    reach = Reach()
    for item in items:
        if isinstance(item, pytest.Function):
            for need in sorted(needs_of(item, reach)):
                item.add_marker(need)
            if item.path in FUZZ_MODULES and item.get_closest_marker("fuzz") is None:
                raise pytest.UsageError(f"{item.nodeid} does not fuzz: it belongs outside {item.path.name}")


def session_folder(tmp_path_factory) -> Path:
    """The temporary folder every process of the test session shares (each has its own inside it)."""
    base = tmp_path_factory.getbasetemp()
    return base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base


@contextmanager
def session_lock(shared: Path):
    """One process of the session at a time, for what the first to get here makes for all."""
    import fcntl

    with (shared / "session.lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield


@pytest.fixture(scope="session", autouse=True)
def _test_settings(tmp_path_factory, django_test_environment):
    """Fast password hashing; TOTP codes valid across a period boundary; every task sent to the process's
    default queue, a queue of this session only, those that the apps route to a queue of their own too
    (provisioning, monitoring, metering, what-if runs), so that one worker takes them all (and a test's own
    workers, while `default_queue` names theirs); static files collected once, as production does, so that
    templates resolve them through the manifest, and looked up as each is asked for."""
    from django.conf import settings

    from portal.celery import app

    app.conf.update(task_default_queue=TASK_QUEUE, task_routes=())  # update, not set: the router is made anew

    settings.PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]
    # A code computed by a test just before a 30-second period ends still counts after it.
    settings.MFA_TOTP_TOLERANCE = 1
    # Tests change capacity behind the services' backs; each read sees the database as it is
    # (tests/pools/test_capacity_picture.py turns the reuse on and checks what bumps it).
    settings.CAPACITY_PICTURE_SECONDS = 0
    settings.MONITORING_FIGURES_SECONDS = 0  # the fleet figures too (tests/monitoring/test_kept_figures.py)
    # A folder of the session's, which the first process to get here fills, never the repository's
    # staticfiles/: the static files storage, set up already if collecting the tests touched it, is set up
    # again on it (as override_settings would).
    shared = session_folder(tmp_path_factory)
    settings.STATIC_ROOT = shared / "static"
    setting_changed.send(sender=type(settings), setting="STATIC_ROOT", value=settings.STATIC_ROOT, enter=True)
    with session_lock(shared):
        if not (shared / "static" / "staticfiles.json").exists():
            call_command("collectstatic", interactive=False, verbosity=0)
    # WhiteNoise lists every static file when its middleware is made: once per web process in production,
    # but once per test client here (a third of the time of the modules profiled). Looked up as each is
    # asked for instead; tests/portal/test_pages.py serves them as production does.
    settings.WHITENOISE_AUTOREFRESH = True
    # What the processes the tests start keep at run time (gunicorn's control socket) is theirs too.
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("XDG_RUNTIME_DIR", str(tmp_path_factory.mktemp("run")))
        yield


@pytest.fixture(autouse=True)
def _default_language():
    """Each test starts in the portal's default language: a page asked for in Korean leaves Korean active
    in the thread (the locale middleware activates, never deactivates), and a service's message follows it."""
    translation.activate(django_settings.LANGUAGE_CODE)


@pytest.fixture(autouse=True)
def _fresh_cache():
    """Rate limits and used TOTP codes live in the cache; each test starts without them. The sample
    partitions a test made are rolled back with it, so none is taken as known; nor is any agents' batch
    left waiting in Redis for the writer, any revocation told, or any copy of an agent's token or host."""
    from monitoring.ingest import accepted, broker, copies
    from monitoring.storage import samples

    cache.clear()
    samples.forget_partitions()
    broker.client().delete(accepted._key(), broker.revoked_tokens_key())
    copies.forget_all()


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
    """Written through the models (most tests start with it, and the factories' get-or-create costs three
    more queries a row); a tenant or person a test's other fixtures made first is taken as it is."""
    acme, globex = _tenant("acme"), _tenant("globex")
    return Tenancy(
        acme=acme,
        globex=globex,
        vision=ProjectFactory(tenant=acme, slug="vision"),
        recsys=ProjectFactory(tenant=globex, slug="recsys"),
        acme_admin=_person("bob", acme, Role.ADMIN),
        acme_member=_person("alice", acme, Role.MEMBER),
        acme_viewer=_person("victor", acme, Role.VIEWER),
        globex_member=_person("mallory", globex, Role.MEMBER),
        outsider=_person("olivia"),
    )


def _tenant(slug: str) -> Tenant:
    return Tenant.objects.filter(slug=slug).first() or Tenant.objects.create(slug=slug, name=slug.title())


def _person(username: str, tenant: Tenant | None = None, role: str = ""):
    """A person as `UserFactory` makes one, with a membership of `tenant` in `role`."""
    user = get_user_model().objects.filter(username=username).first()
    if user is None:
        user = get_user_model().objects.create(
            username=username, email=f"{username}@example.com", password=make_password(PASSWORD)
        )
        if tenant is not None:
            Membership.objects.create(user=user, tenant=tenant, role=role)
    elif tenant is not None:
        Membership.objects.update_or_create(user=user, tenant=tenant, defaults={"role": role})
    return user


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
    from pools.services.inventory import sync_inventory
    from tests.factories import ClusterFactory

    settings.SIMULATED_MIG_APPLY_SECONDS = 0

    def make(fleet, name: str = "sim"):
        cluster = ClusterFactory(name=name, fleet=fleet)
        sync_inventory(cluster=cluster)
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
    node: str  # its node name, as control commands address it
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


@needs("celery")
@contextmanager
def running_worker(
    queue: str, workdir: Path, *, pool: str = "solo", hostname: str = "", env: dict[str, str] | None = None
):
    """A real Celery worker process on the test database, consuming `queue` through Redis. Several may
    consume one queue, each under its own `hostname` (node name); `env` adds to or overrides its
    environment."""
    database_url = database_address()
    node = (hostname or f"{queue}@%h").replace("%h", socket.gethostname())
    worker = Worker(queue=queue, node=node, mail_dir=workdir / "mail", log=workdir / "worker.log")
    environment = {
        **os.environ,
        "DATABASE_URL": database_url,
        "CELERY_QUEUE": queue,
        **dict.fromkeys(QUEUE_SETTINGS, queue),  # what it sends comes back to it, whatever its route
        "EMAIL_URL": f"filemail:///{worker.mail_dir}",  # django-environ drops one leading slash
        "SIMULATED_MIG_APPLY_SECONDS": "0.3",
        "PROVISION_POLL_SECONDS": "0.2",
        "OUTBOUND_ALLOW_PRIVATE_NETWORKS": "true",  # the tests' webhook servers listen on loopback
        **(env or {}),
    }
    with worker.log.open("w") as log:
        worker.process = subprocess.Popen(
            [sys.executable, "-m", "celery", "-A", "portal", "worker", "--pool", pool, "--concurrency", "1",
             "--loglevel", "INFO", "--queues", queue, "--hostname", node,
             "--without-heartbeat", "--without-mingle"],
            cwd=ROOT, env=environment, stdout=log, stderr=subprocess.STDOUT,
        )  # fmt: skip
    try:
        deadline = time.monotonic() + 60
        while "ready." not in worker.log.read_text():
            assert worker.process.poll() is None, f"the worker died:\n{worker.log.read_text()}"
            assert time.monotonic() < deadline, f"the worker did not start:\n{worker.log.read_text()}"
            time.sleep(0.05)
        yield worker
    finally:
        worker.process.terminate()
        try:
            worker.process.wait(timeout=20)
        except subprocess.TimeoutExpired:
            worker.process.kill()


@pytest.fixture(scope="session")
def _session_worker(django_db_setup, tmp_path_factory):
    from portal.celery import app

    app.control.purge()  # tasks that earlier tests queued belong to databases that are gone
    with running_worker(TASK_QUEUE, tmp_path_factory.mktemp("worker")) as worker:
        yield worker


@pytest.fixture(autouse=True)
def _sends_held_back(request, monkeypatch):
    """Only a test that asks for the session's worker has its tasks reach it. What any other test sends
    (a sync's queue run, an approval's e-mail) waits on a queue of its own that nobody consumes, emptied
    after the test: a worker that an earlier test of the process started never acts on a test's database
    under it. A task sent to another queue (a test's own workers', named in the call or made the default)
    goes there."""
    if "celery_worker" in request.fixturenames:
        yield
        return
    from portal.celery import app

    send, sent = app.send_task, []

    def held(name, *args, **options):
        if options.get("queue") or app.amqp.router.route({}, name)["queue"].name != TASK_QUEUE:
            return send(name, *args, **options)
        sent.append(name)
        return send(name, *args, **{**options, "queue": HELD_QUEUE})

    monkeypatch.setattr(app, "send_task", held)
    yield
    if sent:
        with app.connection_for_write() as broker:
            broker.default_channel.client.delete(HELD_QUEUE)


@pytest.fixture(autouse=True)
def _samples_emptied(request, django_db_blocker):
    """The samples' table, partitioned by day in SQL, is no model's table, so pytest-django's flush after
    a transactional test does not empty it: it is emptied here, so that no sample a test committed shows
    in a later one."""
    yield
    if commits(request.node):
        from django.db import connection

        with django_db_blocker.unblock(), connection.cursor() as cursor:
            cursor.execute("DELETE FROM monitoring_sample")
        MIGRATED["emptied"] = True


def commits(item: pytest.Item) -> bool:
    """Whether a test commits (a transactional test): pytest-django empties the database after it."""
    marker = item.get_closest_marker("django_db")
    transaction = marker is not None and bool(marker.kwargs.get("transaction"))
    return transaction or "transactional_db" in getattr(item, "fixturenames", ())


@pytest.fixture(scope="session")
def django_db_setup(
    request, django_test_environment, django_db_modify_db_settings, django_db_blocker, tmp_path_factory
):
    """The test database, what the migrations wrote in it serialized as for `serialized_rollback`.

    In parallel runs each process's database is a copy of one migrated database (migrations take seconds of
    every process's time otherwise): the first process to get here migrates it, or, where the run may reuse
    it (TEST_REUSE_MIGRATED=1, as `./scripts/test --fast` sets), finds it from an earlier run of the same
    migrations. Run in one process, the database is made as pytest-django makes it."""
    from django.db import connection
    from django.test.utils import setup_databases, teardown_databases

    parallel = hasattr(request.config, "workerinput")
    with django_db_blocker.unblock():
        if parallel:
            shared = session_folder(tmp_path_factory)
            with session_lock(shared):
                built = (shared / "migrated").exists() or os.environ.get("TEST_REUSE_MIGRATED") == "1"
                _copy_migrated_database(reuse=built)
                (shared / "migrated").touch()
        else:
            databases = setup_databases(
                verbosity=0, interactive=False, aliases={"default"}, serialized_aliases=set()
            )
        connection._test_serialized_contents = connection.creation.serialize_db_to_string()
    MIGRATED["blocker"] = django_db_blocker
    yield
    with django_db_blocker.unblock():
        if parallel:
            _drop_copied_database()
        else:
            teardown_databases(databases, verbosity=0)


def _migrated_name() -> tuple[str, str]:
    """The migrated database's name, and the prefix of every name it has had: the test database's, and a
    digest of every migration and of the installed apps, so that a changed migration is never copied from
    an old one."""
    import hashlib

    from django.apps import apps
    from django.db import connection

    digest = hashlib.sha256()
    for app in apps.get_app_configs():
        digest.update(app.name.encode())
        for migration in sorted(Path(app.path).glob("migrations/*.py")):
            digest.update(migration.read_bytes())
    prefix = connection.settings_dict["TEST"]["NAME"].rpartition("_")[0] + "_migrated_"  # of test_portal_gw0
    return prefix + digest.hexdigest()[:12], prefix


def _copy_migrated_database(*, reuse: bool) -> None:
    """This process's test database, copied from the migrated one; that one is built first (migrated into
    this process's own, then copied), in place of any older one, unless it may be reused and exists."""
    from django.conf import settings
    from django.db import connection

    name, (migrated, prefix) = connection.settings_dict["TEST"]["NAME"], _migrated_name()
    with connection._nodb_cursor() as cursor:
        cursor.execute("SELECT datname FROM pg_database WHERE starts_with(datname, %s)", [prefix])
        found = {datname for (datname,) in cursor.fetchall()}
    if reuse and migrated in found:
        with connection._nodb_cursor() as cursor:
            _drop_database(cursor, name)
            cursor.execute(f'CREATE DATABASE "{name}" TEMPLATE "{migrated}"')
        # Where Django's own test set-up points the connection at the database it made.
        settings.DATABASES["default"]["NAME"] = connection.settings_dict["NAME"] = name
        connection.close()
        return
    connection.creation.create_test_db(verbosity=0, autoclobber=True, serialize=False)
    connection.close()
    with connection._nodb_cursor() as cursor:
        for old in found:
            _drop_database(cursor, old)
        cursor.execute(f'CREATE DATABASE "{migrated}" TEMPLATE "{name}"')


def _drop_copied_database() -> None:
    from django.db import connection

    connection.close()
    with connection._nodb_cursor() as cursor:
        _drop_database(cursor, connection.settings_dict["NAME"])


def _drop_database(cursor, name: str) -> None:
    cursor.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


# What the migrations wrote (the platform's groups and their permissions, the default alert rules),
# serialized once the test database is made, and whether a test that committed has emptied it since.
MIGRATED: dict = {"blocker": None, "emptied": False}


@pytest.hookimpl(wrapper=True)
def pytest_runtest_setup(item):
    """A test that does not commit starts from the database as the migrations left it. In one process
    every test that commits runs after all the others (pytest-django orders them so); in parallel any
    test may follow one, so what it emptied is put back first, as a `serialized_rollback` test does."""
    if MIGRATED["emptied"] and not commits(item):
        from django.db import connection

        with MIGRATED["blocker"].unblock():
            connection.creation.deserialize_db_from_string(connection._test_serialized_contents)
        MIGRATED["emptied"] = False
    return (yield)


@pytest.fixture
def celery_worker(_session_worker):
    """The session's worker, on the queue every task of the tests goes to. After the test it is left
    idle — its queue empty, no task running — so that the database is emptied under no transaction of
    a task the test set off (emptying it mid-task deadlocks, or the task writes into the next test)."""
    yield _session_worker
    wait_until_idle(_session_worker)


def wait_until_idle(worker: Worker, timeout: float = 60) -> None:
    """Until `worker` answers, twice in a row, that it runs and holds no task and its queue is empty. A
    worker of the solo pool answers only between tasks: no answer is a busy worker."""
    from portal.celery import app

    deadline = time.monotonic() + timeout
    quiet = 0
    with app.connection_for_read() as connection:
        redis = connection.default_channel.client
        while quiet < 2:  # twice in a row: a running task may queue another as it ends
            assert time.monotonic() < deadline, f"the worker is still busy:\n{worker.log.read_text()[-3000:]}"
            inspect = app.control.inspect(timeout=1, destination=[worker.node], limit=1)
            active, reserved = inspect.active(), inspect.reserved()
            answered = active is not None and reserved is not None
            busy = not answered or any(active.values()) or any(reserved.values())
            quiet = 0 if busy or redis.llen(worker.queue) else quiet + 1
            time.sleep(0.02)
