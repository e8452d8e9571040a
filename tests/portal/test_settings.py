"""Production settings: secure by default, and no silent default secret."""

import os
import secrets
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SECURITY_OVERRIDES = ("SECURE_", "SESSION_COOKIE_", "CSRF_COOKIE_")


def manage(*args, **env):
    base = {k: v for k, v in os.environ.items() if not k.startswith(SECURITY_OVERRIDES)}
    return subprocess.run(
        [sys.executable, "manage.py", *args],
        cwd=ROOT,
        env={**base, "DEBUG": "false", "ALLOWED_HOSTS": "portal.example.com", **env},
        capture_output=True,
        text=True,
    )


def test_production_without_secret_key_refuses_to_start():
    result = manage("check", SECRET_KEY="")
    assert result.returncode != 0
    assert "SECRET_KEY is not set" in result.stderr


def test_deploy_check_is_clean_in_production():
    result = manage("check", "--deploy", "--fail-level", "WARNING", SECRET_KEY=secrets.token_urlsafe(50))
    assert result.returncode == 0, result.stderr
    assert "no issues" in result.stdout


def test_deploy_check_catches_an_insecure_override():
    result = manage(
        "check",
        "--deploy",
        "--fail-level",
        "WARNING",
        SECRET_KEY=secrets.token_urlsafe(50),
        SESSION_COOKIE_SECURE="false",
    )
    assert result.returncode != 0
    assert "SESSION_COOKIE_SECURE" in result.stderr
