"""The portal refuses to start with a placeholder secret of the shipped examples, or behind a proxy without a
metrics token: the rules (portal/startup.py), then real processes (manage.py, Celery worker and beat,
gunicorn) that stop before serving anything, each naming the setting."""

import os
import secrets
import subprocess
import sys

import pytest
import yaml
from django.core.exceptions import ImproperlyConfigured

from portal import startup
from tests.conftest import ROOT
from tests.monitoring.dcgm_exporter import free_port

SECRET_FILE = ROOT / "deploy" / "kubernetes" / "secret.yaml"
REAL = {
    "SECRET_KEY": "9Xq-lJ1n5bS7c2K0xV0p4i0r8m6Gf3Ew1Yt2Zu5a9Hc",
    "CLUSTER_SECRETS_KEY": "b6Vd2N8aQ0sT4yR1wE7uI3oP5kL9jH2gF6dS0aZ8xC",
    "METRICS_TOKEN": "t0K3n-0f-pr0m3th3us",
    "DATABASE_URL": "postgres://portal:s3cret@db.example.com:5432/portal",
    "REDIS_URL": "redis://:s3cret@redis.example.com:6379/0",
    "CACHE_URL": "redis://redis.example.com:6379/1",
    "EMAIL_URL": "smtp+tls://portal%40example.com:s3cret@smtp.example.com:587",
}
PLACEHOLDERS = {
    "SECRET_KEY": "change-me-to-a-long-random-string",
    "CLUSTER_SECRETS_KEY": "change-me-to-another-long-random-string",
    "METRICS_TOKEN": "change-me",
    "DATABASE_URL": "postgres://portal:change-me@postgres.example.internal:5432/portal",
    "REDIS_URL": "redis://:change-me@redis.example.internal:6379/0",
    "CACHE_URL": "redis://:Change-Me-Too@redis.example.internal:6379/1",
    "EMAIL_URL": "smtp+tls://portal:change%2Dme@smtp.example.com:587",
}


# --- the rules -------------------------------------------------------------------------------------------


def test_real_values_pass():
    startup.refuse_placeholders(REAL)
    startup.refuse_placeholders({})  # nothing set: the demo's defaults
    startup.refuse_placeholders({**REAL, "DATABASE_URL": "postgres://postgres@127.0.0.1:5432/portal"})
    startup.refuse_placeholders({**REAL, "SECRET_KEY": "please-change-me-not"})  # a real value may say so


@pytest.mark.parametrize("name", sorted(PLACEHOLDERS))
def test_each_placeholder_is_refused_naming_its_setting(name):
    with pytest.raises(ImproperlyConfigured) as refused:
        startup.refuse_placeholders({**REAL, name: PLACEHOLDERS[name]})

    message = str(refused.value)
    assert name in message and "refuses to start" in message
    assert "s3cret" not in message  # no other secret repeated


def test_a_placeholder_user_in_an_address_is_refused_too():
    with pytest.raises(ImproperlyConfigured, match="REDIS_URL"):
        startup.refuse_placeholders({**REAL, "REDIS_URL": "redis://change-me@redis.example.com:6379/0"})


def test_every_placeholder_the_shipped_secret_holds_is_refused():
    shipped = yaml.safe_load(SECRET_FILE.read_text())["stringData"]

    assert shipped
    for name, value in shipped.items():
        with pytest.raises(ImproperlyConfigured, match=name):
            startup.refuse_placeholders({**REAL, name: value})


@pytest.mark.parametrize(
    ("token", "proxies", "refused"),
    [("", 1, True), ("  ", 2, True), ("t0K3n", 1, False), ("", 0, False)],
)
def test_behind_a_proxy_metrics_need_a_token(token, proxies, refused):
    if not refused:
        startup.refuse_open_metrics(token=token, trusted_proxies=proxies)
        return
    with pytest.raises(ImproperlyConfigured) as error:
        startup.refuse_open_metrics(token=token, trusted_proxies=proxies)
    assert "METRICS_TOKEN" in str(error.value) and "TRUSTED_PROXY_COUNT" in str(error.value)


# --- real processes --------------------------------------------------------------------------------------


def run(command: list[str], **env: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        command,
        cwd=ROOT,
        env={**os.environ, "DEBUG": "false", **env},
        capture_output=True,
        text=True,
        timeout=120,
    )


@pytest.mark.parametrize("name", sorted(PLACEHOLDERS))
def test_manage_py_refuses_each_placeholder(name):
    done = run([sys.executable, "manage.py", "check"], **{name: PLACEHOLDERS[name]})

    assert done.returncode != 0
    assert "ImproperlyConfigured" in done.stderr
    assert name in done.stderr.strip().splitlines()[-1]


def test_manage_py_refuses_a_proxy_without_a_metrics_token_and_starts_with_one():
    refused = run([sys.executable, "manage.py", "check"], TRUSTED_PROXY_COUNT="1", METRICS_TOKEN="")
    token = secrets.token_urlsafe(32)
    started = run([sys.executable, "manage.py", "check"], TRUSTED_PROXY_COUNT="1", METRICS_TOKEN=token)

    assert refused.returncode != 0
    assert "METRICS_TOKEN is empty while TRUSTED_PROXY_COUNT is 1" in refused.stderr
    assert started.returncode == 0, started.stderr


def test_a_celery_worker_refuses_to_start(tmp_path):
    done = run(
        [sys.executable, "-m", "celery", "-A", "portal", "worker", "--pool", "solo", "--queues",
         f"never-{secrets.token_hex(4)}", "--without-mingle", "--without-heartbeat"],
        METRICS_TOKEN="change-me",
    )  # fmt: skip

    assert done.returncode != 0
    assert "METRICS_TOKEN still holds the placeholder" in done.stderr
    assert "ready." not in done.stdout + done.stderr


def test_celery_beat_refuses_to_start(tmp_path):
    done = run(
        [sys.executable, "-m", "celery", "-A", "portal", "beat", f"--schedule={tmp_path / 'schedule'}",
         "--pidfile="],
        TRUSTED_PROXY_COUNT="1", METRICS_TOKEN="",
    )  # fmt: skip

    assert done.returncode != 0
    assert "METRICS_TOKEN is empty" in done.stderr
    assert not (tmp_path / "schedule").exists()


def test_gunicorn_refuses_to_start():
    port = free_port()
    done = run(
        [sys.executable, "-m", "gunicorn", "--config", "deploy/gunicorn.conf.py", "portal.wsgi"],
        PORT=str(port), WEB_CONCURRENCY="1", EMAIL_URL=PLACEHOLDERS["EMAIL_URL"],
    )  # fmt: skip

    assert done.returncode != 0
    assert "The user or password in EMAIL_URL is still the placeholder" in done.stderr
    assert "Worker failed to boot" in done.stderr
